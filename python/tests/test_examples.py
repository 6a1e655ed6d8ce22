"""The examples and README.md's Python snippet run as written, against the test daemon, so that
they stay true."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT


def run(args, daemon, **kw):
    env = dict(os.environ, CONVD_SOCKET=daemon.socket, PYTHONPATH=str(ROOT / "python"))
    r = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{args}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def test_conv2d_example(daemon):
    out = run([str(ROOT / "python/examples/conv2d.py")], daemon)
    assert "empty(): True" in out and "CONVD_EGROUPS" in out


@pytest.mark.parametrize("model", ["mobilenet_v3_small", "resnext50_32x4d"])
def test_patch_model_example(daemon, model):
    out = run([str(ROOT / "python/examples/patch_model.py"), model], daemon)
    served = int(re.search(r"\((\d+) convolutions served\)", out).group(1))
    assert served > 0, out


def test_readme_snippet(daemon):
    text = (ROOT / "README.md").read_text()
    section = text.split("## Python and PyTorch", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    out = run(["-c", code], daemon)
    assert re.match(r"torch\.Size\(\[1, 1000\]\) \d+ convolutions served", out), out
