"""The client API around the convolution: connecting, errors (and a client that stays usable
after each), the struct checks against the library, futures, threads, asyncio, empty(),
status, metrics and close."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import os
import pickle
import re
import threading
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import convd
from convd import _lib
from conftest import TOL, Daemon, rel_l2, served


def small(rng, n=1, c=8, h=6, w=6, k=8, r=3, s=3, groups=1, dtype=np.float32):
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    wt = rng.standard_normal((k, c // groups, r, s)).astype(dtype)
    return x, wt


def want_of(x, w, b=None, **kw):
    return F.conv2d(
        torch.from_numpy(x).double(),
        torch.from_numpy(w).double(),
        None if b is None else torch.from_numpy(b).double(),
        **kw,
    ).numpy()


# ---------------------------------------------------------------- connecting, the library


def test_connect_argument_environment_default(daemon, monkeypatch):
    with convd.connect(daemon.socket) as c:
        assert c.info["backend"] == "cpu"
        assert c.info["max_inflight"] > 0
    monkeypatch.setenv("CONVD_SOCKET", daemon.socket)
    with convd.connect() as c:
        assert c.ping() >= 0
    monkeypatch.setenv("CONVD_SOCKET", "/nonexistent/convd.sock")
    with pytest.raises(convd.Error) as e:
        convd.connect()
    assert e.value.code == "CONVD_ECONNECT"
    assert "/nonexistent/convd.sock" in e.value.message


def test_cuda_wait_option(daemon, monkeypatch):
    """cuda_wait is "block" or "keep", from the argument, else $CONVD_CUDA_WAIT, else block;
    anything else is refused before connecting, with the word named."""
    with convd.connect(daemon.socket) as c:
        assert c._cuda_wait == "block"
    with convd.connect(daemon.socket, cuda_wait="keep") as c:
        assert c._cuda_wait == "keep"
    monkeypatch.setenv("CONVD_CUDA_WAIT", "keep")
    with convd.connect(daemon.socket) as c:
        assert c._cuda_wait == "keep"
    for bad in ("spin", "", 1):
        with pytest.raises(convd.Error) as e:
            convd.connect(daemon.socket, cuda_wait=bad)
        assert e.value.code == "EINVAL" and "cuda_wait" in e.value.message


def test_connect_failure_names_the_socket(tmp_path):
    with pytest.raises(convd.Error) as e:
        convd.connect(str(tmp_path / "none.sock"))
    assert e.value.code == "ECONNECT" and e.value.status == -19
    assert str(tmp_path / "none.sock") in str(e.value)
    assert isinstance(e.value, RuntimeError)


def test_error_code_spellings():
    e = convd.Error("EBADSHAPE", "the weight is wrong")
    assert e.code == "CONVD_EBADSHAPE" and e.code == "EBADSHAPE" and e.code == -5
    assert e.code != "EGROUPS" and e.code != -6
    assert str(e) == "CONVD_EBADSHAPE: the weight is wrong"
    assert e.status == -5 and e.message == "the weight is wrong"
    e2 = pickle.loads(pickle.dumps(e))
    assert e2.code == "CONVD_EBADSHAPE" and e2.message == e.message
    assert convd.Error(-14).code == "CONVD_ELIMIT"
    with pytest.raises(ValueError):
        convd.Error("ENOSUCHTHING")


def test_struct_mirrors_match_the_library(client):
    lib = _lib.load()
    # The checks run at import; run them again, and check they catch a wrong layout.
    _lib.check_layouts(lib)

    class ShortProblem(ctypes.Structure):  # one int32 short of the real struct
        _fields_ = [f for f in _lib.Problem._fields_ if f[0] != "pad_right"]

    f = _lib.FillCheck(ShortProblem)
    lib.convd_problem_init(f.ptr, 1, 2, 3, 4, 5, 6, 7, 1)
    with pytest.raises(convd.LibraryError):
        f.check("convd_problem")
    # Status and server info are filled into sentinel-guarded buffers by the client.
    assert client.status()["backend"] == "cpu"


def test_library_refuses_wrong_struct_size(client):
    """struct_size is how the library knows the caller's struct: one too small to reach the
    tensors is refused, and so is a larger one whose unknown bytes are set."""
    lib = _lib.load()
    a = _lib.ConvArgs()
    idv = ctypes.c_uint64()
    a.struct_size = 8
    rc = lib.convd_conv_submit(client._h, ctypes.byref(a), ctypes.byref(idv))
    assert rc == -1 and "struct_size" in lib.convd_errstr(client._h).decode()
    size = ctypes.sizeof(_lib.ConvArgs)
    buf = (ctypes.c_char * (size + 16))()
    big = _lib.ConvArgs.from_buffer(buf)
    big.struct_size = size + 16
    buf[size + 5] = b"\x01"
    rc = lib.convd_conv_submit(client._h, ctypes.byref(big), ctypes.byref(idv))
    assert rc == -7, lib.convd_errstr(client._h)
    opts = _lib.ConnectOptions()
    opts.struct_size = 4
    h = ctypes.c_void_p()
    assert lib.convd_connect(ctypes.byref(opts), ctypes.byref(h)) == -1
    assert b"struct_size" in lib.convd_last_connect_error()
    # The client is unharmed.
    x, w = small(np.random.default_rng(1))
    assert rel_l2(client.conv2d(x, w), want_of(x, w)) <= TOL["fp32"]


def test_library_from_environment(monkeypatch, tmp_path):
    """CONVD_CLIENT_LIB names the library; a wrong one is a LibraryError saying so."""
    import subprocess
    import sys

    code = "import convd; convd.library_path()"
    env = dict(os.environ, CONVD_CLIENT_LIB=str(tmp_path / "libnothing.so"))
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(convd.__file__))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "CONVD_CLIENT_LIB" in r.stderr and "libnothing.so" in r.stderr
    env["CONVD_CLIENT_LIB"] = _lib.path()
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------- bad calls


def bad_calls(rng):
    x, w = small(rng, c=8, k=8)
    b = rng.standard_normal(8).astype(np.float32)
    return [
        ("EBADSHAPE", (x, w[:, :3]), {}),  # weight channels
        ("EGROUPS", (x, w[:, :3]), {"groups": 3}),  # 8 channels in 3 groups
        ("EBADSHAPE", (x, w), {"padding": -1}),
        ("EBADSHAPE", (x, rng.standard_normal((8, 8, 9, 9)).astype(np.float32)), {}),  # too big
        ("EBADSHAPE", (x[0, 0], w), {}),  # 2-D input
        ("EBADSHAPE", (x, w, b[:5]), {}),  # bias length
        ("EBADSHAPE", (x, w), {"stride": 0}),
        ("EINVAL", (x, w), {"padding": "full"}),
        ("EINVAL", (x, w), {"padding": "same", "stride": 2}),
        ("EINVAL", (x, w), {"stride": (1, 2, 3)}),
        ("EINVAL", (x, w), {"groups": 1.5}),
        ("EINVAL", (x, w.astype(np.float16)), {}),  # dtypes differ
        ("EINVAL", (x, w), {"dtype": "fp16"}),  # dtype= disagrees
        ("EINVAL", (x, w), {"layout": "nwhc"}),
        ("EINVAL", (x.tolist(), w), {}),  # not an array
        ("EINVAL", (x, torch.from_numpy(w)), {}),  # numpy and torch mixed
        ("EUNSUPPORTED", (x.astype(np.float64), w.astype(np.float64)), {}),
        ("EUNSUPPORTED", (x.astype(np.int32), w.astype(np.int32)), {}),
        ("EINVAL", (x, w), {"priority": 7}),
        ("EINVAL", (x, w), {"activation": "tanh"}),
        ("EINVAL", (x, w), {"activation": ("clamp", 1.0, 0.0)}),
        ("EINVAL", (x, w), {"activation": ("clamp", 0.0)}),
        ("EINVAL", (x, w), {"activation": "silu", "relu": True}),
    ]


def test_bad_calls_raise_and_the_client_goes_on(client, rng):
    x, w = small(rng)
    want = want_of(x, w, padding=1)
    for code, args, kw in bad_calls(rng):
        for call in (client.conv2d, client.submit):
            with pytest.raises(convd.Error) as e:
                r = call(*args, **kw)
                if isinstance(r, convd.Future):
                    r.result()
            assert e.value.code == code, (kw, e.value)
            assert e.value.message, kw
        # Every bad call leaves a working client.
        assert rel_l2(client.conv2d(x, w, padding=1), want) <= TOL["fp32"]
    xt = torch.from_numpy(x)
    with pytest.raises(convd.Error) as e:
        client.conv2d(xt, torch.from_numpy(w).double())
    assert e.value.code == "EINVAL"
    with pytest.raises(convd.Error) as e:
        client.conv2d(xt.double(), torch.from_numpy(w).double())
    assert e.value.code == "EUNSUPPORTED"
    with pytest.raises(convd.Error) as e:
        client.conv2d(xt, torch.from_numpy(w).to("meta"))
    assert e.value.code == "EINVAL"
    assert rel_l2(client.conv2d(xt, torch.from_numpy(w), padding=1).numpy(), want) <= TOL["fp32"]


def test_daemon_refusal_carries_its_sentence(rng):
    """A limit only the daemon knows (requests in flight per user, over all connections):
    the completion's code and the daemon's sentence reach the caller as convd.Error."""
    d = Daemon("--max-inflight-per-user", "2")
    try:
        c = d.connect()
        # About 0.1 s of CPU each: the first runs, the second waits, the rest are refused. A
        # first round makes the staging slabs, so that the second submits without a round trip.
        x, w = small(rng, n=8, c=64, h=48, w=48, k=64)
        for f in [c.submit(x, w, padding=1) for _ in range(6)]:
            f.exception()
        futs = [c.submit(x, w, padding=1) for _ in range(6)]
        errors = [f.exception() for f in futs]
        refused = [e for e in errors if e is not None]
        assert refused, "no request was refused"
        for e in refused:
            assert e.code == "CONVD_ELIMIT"
            assert "2" in e.message and "user" in e.message, e.message
        want = want_of(x, w, padding=1)
        for f, e in zip(futs, errors):
            if e is None:
                assert rel_l2(f.result(), want) <= TOL["fp32"]
        assert rel_l2(c.conv2d(x, w, padding=1), want) <= TOL["fp32"]
        c.close()
    finally:
        assert d.stop() == 0


def test_daemon_gone(rng):
    d = Daemon()
    try:
        daemon_gone(d, rng)
    finally:
        d.kill()
        d.stop()


def daemon_gone(d, rng):
    c = d.connect()
    x, w = small(rng, n=8, c=64, h=64, w=64, k=64)
    f = c.submit(x, w, padding=1)
    d.kill()
    with pytest.raises(convd.Error) as e:
        f.result(timeout=60)
    assert e.value.code in ("CONVD_ECLOSED",)
    with pytest.raises(convd.Error) as e:
        c.conv2d(x[:, :, :8, :8], w)
    assert e.value.code == "CONVD_ECLOSED"
    c.close()


# ---------------------------------------------------------------- futures, threads, asyncio


def test_futures_complete_out_of_order(client, rng):
    big_x, big_w = small(rng, n=2, c=32, h=40, w=40, k=32)
    x, w = small(rng)
    fb = client.submit(big_x, big_w, padding=1)
    fs = [client.submit(x * (i + 1), w) for i in range(20)]
    for i, f in enumerate(reversed(fs)):
        k = len(fs) - i
        assert rel_l2(f.result(), want_of(x * k, w)) <= TOL["fp32"]
        assert f.done()
        assert set(f.info) == {"queue_us", "exec_us", "batch_size"}
    assert rel_l2(fb.result(), want_of(big_x, big_w, padding=1)) <= TOL["fp32"]


def test_future_timeout_and_done(client, rng):
    x, w = small(rng, n=8, c=64, h=64, w=64, k=64)
    f = client.submit(x, w, padding=1)
    with pytest.raises(TimeoutError):
        f.result(timeout=0)
    deadline = time.monotonic() + 120
    while not f.done():
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert rel_l2(f.result(timeout=0), want_of(x, w, padding=1)) <= TOL["fp32"]


def doorbells(client) -> float:
    m = re.search(r"^convd_doorbells_total (\S+)$", client.metrics(), re.M)
    assert m, "the daemon exports no convd_doorbells_total"
    return float(m.group(1))


def test_polled_completions_ring_no_doorbell(client, rng):
    # The package takes completions itself (here through done()), so it turns the library's
    # doorbells off: the daemon must not send one per completion. The first round makes the
    # staging regions, whose replies the library waits for (and a wait asks for doorbells).
    x, w = small(rng)

    def round_of(n):
        fs = [client.submit(x * (i + 1), w) for i in range(n)]
        deadline = time.monotonic() + 60
        while not all(f.done() for f in fs):
            assert time.monotonic() < deadline
            time.sleep(0.001)
        for i, f in enumerate(fs):
            assert rel_l2(f.result(), want_of(x * (i + 1), w)) <= TOL["fp32"]

    round_of(8)
    before = doorbells(client)
    for _ in range(3):
        round_of(8)
    assert doorbells(client) == before


def test_done_callback(client, rng):
    x, w = small(rng)
    seen = []
    f = client.submit(x, w)
    f.add_done_callback(lambda fut: seen.append(fut.result().shape))
    f.result()
    f.add_done_callback(lambda fut: seen.append("late"))
    assert seen == [(1, 8, 4, 4), "late"]


def test_more_requests_than_the_daemon_allows_in_flight(rng):
    d = Daemon("--max-inflight", "3")
    try:
        c = d.connect()
        x, w = small(rng)
        fs = [c.submit(x + i, w) for i in range(40)]
        for i, f in enumerate(fs):
            assert rel_l2(f.result(), want_of(x + i, w)) <= TOL["fp32"]
        c.close()
    finally:
        assert d.stop() == 0


def test_threads_share_a_client(client, rng):
    x, w = small(rng)
    errors = []

    def work(seed):
        r = np.random.default_rng(seed)
        try:
            for _ in range(30):
                xx = r.standard_normal(x.shape).astype(np.float32)
                if r.integers(0, 2):
                    y = client.conv2d(xx, w, padding=1)
                else:
                    y = client.submit(xx, w, padding=1).result()
                assert rel_l2(y, want_of(xx, w, padding=1)) <= TOL["fp32"]
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_asyncio(client, rng):
    x, w = small(rng, c=16, k=16, groups=4)
    b = rng.standard_normal(16).astype(np.float32)

    async def main():
        ys = await asyncio.gather(
            *[client.conv2d_async(x * i, w, b, padding="same", groups=4) for i in range(16)]
        )
        # A future from submit() is awaitable too, and the loop runs while it waits.
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        t = asyncio.ensure_future(ticker())
        y = await client.submit(x, w, b, padding="same", groups=4)
        t.cancel()
        return ys, y, ticks

    ys, y, ticks = asyncio.run(main())
    for i, yi in enumerate(ys):
        assert rel_l2(yi, want_of(x * i, w, b, padding="same", groups=4)) <= TOL["fp32"] or i == 0
    assert rel_l2(y, want_of(x, w, b, padding="same", groups=4)) <= TOL["fp32"]

    async def bad():
        await client.conv2d_async(x, w, groups=3)

    with pytest.raises(convd.Error):
        asyncio.run(bad())


def test_asyncio_mixed_with_blocking_calls(client, rng):
    """A thread's blocking calls may take completions the event loop waits for: they are
    handed over, so no await hangs."""
    x, w = small(rng)
    stop = threading.Event()

    def blocking():
        while not stop.is_set():
            client.conv2d(x, w)

    t = threading.Thread(target=blocking)
    t.start()
    try:

        async def main():
            for i in range(50):
                y = await asyncio.wait_for(client.conv2d_async(x + i, w), 30)
                assert rel_l2(y, want_of(x + i, w)) <= TOL["fp32"]

        asyncio.run(main())
    finally:
        stop.set()
        t.join()


# ---------------------------------------------------------------- empty()


def region_maps():
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if "memfd:convd-region" in line)


def test_empty_arrays(client, rng):
    for dtype, npdt in (("fp32", np.float32), ("fp16", np.float16), ("bf16", np.uint16)):
        a = client.empty((2, 3, 4), dtype)
        assert a.dtype == npdt and a.shape == (2, 3, 4) and not a.any()
    assert client.empty(5, np.float32).shape == (5,)
    assert client.empty((2, 2), torch.bfloat16).dtype == np.uint16
    with pytest.raises(convd.Error):
        client.empty((2, 2), "int8")
    with pytest.raises(convd.Error):
        client.empty((2, -1))


def test_empty_is_used_in_place_and_released(client, rng, monkeypatch):
    gc.collect()
    client.conv2d(*small(rng))  # reaps what earlier tests left
    client.submit(*small(rng)).result()  # the staging slab a region-backed call uses
    before = region_maps()
    x = client.empty((1, 8, 6, 6))
    x[...] = rng.standard_normal(x.shape)
    w = client.empty((8, 8, 3, 3))
    w[...] = rng.standard_normal(w.shape)
    assert region_maps() == before + 2
    y = client.conv2d(x, w, padding=1)
    assert rel_l2(y, want_of(np.array(x), np.array(w), padding=1)) <= TOL["fp32"]
    # In place: the request names the region; the only copy is the output's, out of staging.
    copies = []
    memmove = ctypes.memmove

    def counting(dst, src, n):
        copies.append(n)
        return memmove(dst, src, n)

    monkeypatch.setattr(ctypes, "memmove", counting)
    x[0, 0] = 0
    assert rel_l2(client.conv2d(x, w, padding=1), want_of(np.array(x), np.array(w), padding=1)) <= TOL["fp32"]
    assert copies == [y.nbytes]
    client.conv2d(np.array(x), w, padding=1)
    assert copies == [y.nbytes, x.nbytes, y.nbytes]
    monkeypatch.undo()
    # Views of the array are in the region too; torch tensors sharing it as well.
    y2 = client.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1)
    assert rel_l2(y2.numpy(), y * 0 + client.conv2d(x, w, padding=1)) <= TOL["fp32"]
    del x, w, y2
    gc.collect()
    client.conv2d(*small(rng))  # the next call unregisters them
    assert region_maps() == before


def test_empty_outlives_close(rng):
    daemon = Daemon()  # its own, so that the count of clients is this test's alone
    try:
        empty_outlives_close(daemon, rng)
    finally:
        daemon.kill()
        daemon.stop()


def empty_outlives_close(daemon, rng):
    with daemon.connect() as watcher:
        c = daemon.connect()
        a = c.empty((4, 4))
        a[...] = 3.0
        n = watcher.status()["clients"]
        c.close()
        # The connection stays until the array goes: its memory is the region's.
        assert float(a.sum()) == 48.0
        assert watcher.status()["clients"] == n
        with pytest.raises(convd.Error) as e:
            c.conv2d(*small(rng))
        assert e.value.code == "ECLOSED"
        del a
        gc.collect()
        deadline = time.monotonic() + 10
        while watcher.status()["clients"] != n - 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)


# ---------------------------------------------------------------- queries, close


def test_status_metrics_ping(client, rng):
    s0 = served(client)
    client.conv2d(*small(rng))
    s = client.status()
    assert s["requests_served"] == s0 + 1
    assert s["backend"] == "cpu" and s["clients"] >= 1 and s["uptime_ms"] > 0
    text = client.metrics()
    assert "convd_clients" in text and "convd_requests" in text
    assert 0 <= client.ping() < 5


def test_close(daemon, rng):
    c = daemon.connect()
    x, w = small(rng, n=8, c=64, h=64, w=64, k=64)
    f = c.submit(x, w, padding=1)
    c.close()
    c.close()
    with pytest.raises(convd.Error) as e:
        f.result()
    assert e.value.code == "ECLOSED"
    with pytest.raises(convd.Error) as e:
        c.status()
    assert e.value.code == "ECLOSED"
    with daemon.connect() as c2:
        assert rel_l2(c2.conv2d(x[:1, :, :8, :8], w), want_of(x[:1, :, :8, :8], w)) <= TOL["fp32"]
    assert "closed" in repr(c2)
