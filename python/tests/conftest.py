"""Fixtures: a real convd daemon (CPU backend) on a temporary socket, clients of it, and the
numeric helpers the tests share.

The daemon binary is $CONVD_DAEMON (ctest sets it), else build/bin/convd of this checkout; the
library is $CONVD_CLIENT_LIB (ctest sets it), else the loader's. A GPU daemon for test_gpu.py is
started with --backend gpu when torch sees a GPU.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

import convd  # noqa: E402

# Relative L2 error allowed per dtype, as the C tests use (tests/support/testutil.h).
TOL = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 1e-2}


def _die_with_parent() -> None:
    """In the daemon's child before exec: SIGKILL when the test process dies, even by a
    timeout's SIGKILL (tests/integration/harness.c does the same)."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def daemon_path() -> str:
    p = os.environ.get("CONVD_DAEMON") or str(ROOT / "build" / "bin" / "convd")
    if not os.access(p, os.X_OK):
        raise RuntimeError(
            f"no convd binary at {p}: build the project (scripts/test.sh) or set CONVD_DAEMON"
        )
    return p


class Daemon:
    """A convd process on a private socket. stop() sends SIGTERM and checks it drains to 0."""

    def __init__(self, *args: str, backend: str = "cpu"):
        self.dir = tempfile.mkdtemp(prefix="convd-py-")
        self.socket = os.path.join(self.dir, "convd.sock")
        self.log_path = os.path.join(self.dir, "daemon.log")
        self.log = open(self.log_path, "w")
        cmd = [daemon_path(), "--socket", self.socket, "--backend", backend, "--log-level", "notice"]
        if backend == "cpu":
            cmd += ["--threads", os.environ.get("CONVD_IT_THREADS", "2")]
        cmd += list(args)
        self.proc = subprocess.Popen(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
        )
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"convd exited with {self.proc.returncode}:\n{self.read_log()}")
            try:
                convd.connect(self.socket).close()
                break
            except convd.Error as e:
                if e.code != "ECONNECT" or time.monotonic() > deadline:
                    self.kill()
                    raise
                time.sleep(0.02)

    def read_log(self) -> str:
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def connect(self, **kw) -> convd.Client:
        return convd.connect(self.socket, **kw)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="session")
def daemon():
    d = Daemon()
    yield d
    rc = d.stop()
    assert rc == 0, f"convd exited with {rc} after SIGTERM"


@pytest.fixture
def client(daemon):
    c = daemon.connect()
    yield c
    c.close()


@pytest.fixture
def rng():
    """Fresh random data each run; the seed is printed (shown with a failure) and
    $CONVD_TEST_SEED replays it."""
    seed = int(os.environ.get("CONVD_TEST_SEED", "0")) or int.from_bytes(os.urandom(4), "little")
    print(f"CONVD_TEST_SEED={seed}")
    return np.random.default_rng(seed)


def rel_l2(got, want) -> float:
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"shape {got.shape}, expected {want.shape}"
    assert np.all(np.isfinite(got)), "the output has NaN or infinite elements"
    den = np.linalg.norm(want)
    return float(np.linalg.norm(got - want) / (den if den > 0 else 1.0))


def served(client) -> int:
    return client.status()["requests_served"]
