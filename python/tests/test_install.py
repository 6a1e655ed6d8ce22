"""The package installed the two ways README.md gives, each used from outside the source tree
against the test daemon: `pip install ./python` (offline: --no-index, into a virtual
environment that sees Debian's numpy) and `cmake --install BUILD --component python` (with the
library component beside it, found without CONVD_CLIENT_LIB)."""

from __future__ import annotations

import os
import subprocess
import sys
import pytest

from conftest import ROOT

PROBE = """
import sys, numpy as np, convd
assert convd.__file__.startswith(sys.argv[1]), convd.__file__
with convd.connect(sys.argv[2]) as c:
    x = np.ones((1, 2, 4, 4), np.float32)
    w = np.ones((3, 2, 3, 3), np.float32)
    y = c.conv2d(x, w, padding=1)
    assert y.shape == (1, 3, 4, 4) and y[0, 0, 1, 1] == 18 and y[0, 2, 0, 0] == 8, y
print(convd.library_path())
"""


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{cmd}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CONVD_CLIENT_LIB")}
    env.update(extra)
    return env


def test_pip_install_offline(tmp_path, daemon):
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)])
    py = str(venv / "bin" / "python")
    run([py, "-m", "pip", "install", "--no-index", "--no-cache-dir", str(ROOT / "python")],
        env=clean_env())
    site = run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).strip()
    out = run(
        [py, "-c", PROBE, site, daemon.socket],
        cwd="/",
        env=clean_env(CONVD_CLIENT_LIB=os.environ.get("CONVD_CLIENT_LIB", "")),
    )
    assert "libconvd-client" in out


def test_cmake_install(tmp_path, daemon):
    build = os.environ.get("CONVD_BUILD_DIR")
    if not build:
        pytest.fail("CONVD_BUILD_DIR is not set (ctest sets it to the build folder)")
    prefix = tmp_path / "prefix"
    for component in ("python", "lib"):
        run(["cmake", "--install", build, "--component", component, "--prefix", str(prefix)])
    inits = list(prefix.glob("lib/python3*/*-packages/convd/__init__.py"))
    assert len(inits) == 1, inits
    pkgdir = inits[0].parent.parent
    out = run(
        [sys.executable, "-c", PROBE, str(pkgdir), daemon.socket],
        cwd="/",
        env=clean_env(PYTHONPATH=str(pkgdir)),
    )
    # Found beside the package, unless the loader knows one of its own (an installed convd).
    own = subprocess.run(
        [sys.executable, "-c", "import ctypes; ctypes.CDLL('libconvd-client.so.0')"],
        env=clean_env(),
        capture_output=True,
    )
    if own.returncode != 0:
        assert out.strip() == str(prefix / "lib" / "libconvd-client.so.0")
