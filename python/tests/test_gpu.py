"""CUDA tensors through a GPU daemon: skipped unless torch sees a CUDA device and $CONVD_DAEMON
is a GPU build (scripts/gpu-check.sh runs them on the GPU machine).

- random problems in every dtype and layout against F.conv2d in float64, outputs poisoned;
- the registration of an allocation is made once and reused (no round trip per call), and let go
  when PyTorch frees the allocation;
- the stream rule: a producer kernel queued right before the call (behind a long sleep on the
  stream) is waited for, on the default and on a side stream, for conv2d and submit, stream-ordered
  and synchronous; a consumer queued right after the call sees the output;
- stream ordering (protocol 3): a conv -> relu -> conv chain and 64 convolutions issued without
  synchronising, returning before the stream has run; the gate slab registered once per client;
  the synchronous path with stream_ordered=False and CONVD_STREAM_ORDERED=0; a request the daemon
  refuses after it was sent (max_inflight_per_user) or fails waiting for its stream
  (gate_timeout_ms) lets the stream go on, with nobody calling the client, and its error is
  raised by a later call or synchronize(); close() waits for the requests its streams wait on;
- a process that is not an MPS client is told so once per client, with what to change;
- the four torchvision models patched against unpatched on the GPU, fp32 (TF32 off on both
  sides) within 1e-4, and fp16 and bf16 no further from the fp32 output than PyTorch's own
  half-precision run is (twice its error, plus 1e-3).
"""

from __future__ import annotations

import copy
import re
import time

import numpy as np
import pytest
import torch
import torchvision

import convd
import convd.torch
from conftest import TOL, Daemon, rel_l2, served
from test_conv import call_args, make_data, random_problem, reference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")

DT = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@pytest.fixture(scope="module")
def gpu_daemon():
    try:
        d = Daemon(backend="gpu")
    except RuntimeError as e:
        if "without GPU support" in str(e):
            pytest.skip("$CONVD_DAEMON was built without the GPU backend")
        raise
    yield d
    assert d.stop() == 0


@pytest.fixture
def gclient(gpu_daemon):
    c = gpu_daemon.connect()
    yield c
    c.close()


@pytest.fixture(autouse=True)
def exact_fp32():
    """PyTorch's fp32 references without TF32."""
    saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.fixture
def poisoned(monkeypatch):
    torch_empty = torch.empty

    def empty(*a, **kw):
        out = torch_empty(*a, **kw)
        if out.is_floating_point():
            out.fill_(float("nan"))
        return out

    monkeypatch.setattr(torch, "empty", empty)


def metric(client, name) -> float:
    m = re.search(rf"^{name} (\S+)$", client.metrics(), re.M)
    assert m, f"no metric {name}"
    return float(m.group(1))


_CYCLES_PER_S = []


def sleep_cycles(seconds: float) -> int:
    """torch.cuda._sleep's argument that keeps a stream busy about this long (measured once)."""
    if not _CYCLES_PER_S:
        n = int(5e7)
        torch.cuda._sleep(n)  # warm-up: the kernel's first launch loads it
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(n)
        end.record()
        end.synchronize()
        _CYCLES_PER_S.append(n / (start.elapsed_time(end) / 1e3))
    return int(_CYCLES_PER_S[0] * seconds)


def unstick(client) -> None:
    """After a failed check: stores the newest value into every done word of the client's gate
    slab, so that no stream waits on one any more and the tests after this one can run."""
    g = client._gates
    for i in range(g.slots):
        g.words[2 * i + 1] = g.value


def drained(stream, timeout: float) -> bool:
    """Whether the stream runs dry within the timeout, polled without calling any client (a
    blocking synchronize would hang the test if a done word were never written)."""
    deadline = time.monotonic() + timeout
    while not stream.query():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_cuda_random_problems(gclient, rng, dtype, channels_last, poisoned):
    dev = torch.device("cuda", torch.cuda.current_device())
    for _ in range(16):
        p = random_problem(rng)
        x, w, b = make_data(rng, p, dtype)
        want = reference(p, x, w, b)
        x, w = x.to(dev), w.to(dev)
        b = b.to(dev) if b is not None else None
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
        if p["unbatched"]:
            x, want = x[0], want[0]
        kw = call_args(p)
        y = gclient.conv2d(x, w, b, **kw)
        assert y.device == dev and y.dtype == DT[dtype]
        if channels_last and not p["unbatched"] and y.shape[1] > 1 and y.shape[2] * y.shape[3] > 1:
            assert y.is_contiguous(memory_format=torch.channels_last)
        err = rel_l2(y.double().cpu().numpy(), want.numpy())
        assert err <= TOL[dtype], f"{p} {dtype} channels_last={channels_last}: {err:.3g}"
        f = gclient.submit(x, w, b, **kw)
        assert rel_l2(f.result().double().cpu().numpy(), want.numpy()) <= TOL[dtype]


@pytest.mark.parametrize("channels_last", [False, True])
def test_tf32_follows_torch(gclient, channels_last, poisoned):
    """fp32 CUDA tensors take TF32 exactly when torch.backends.cudnn.allow_tf32 says (or
    allow_tf32= overrides it): dense 3x3 with 64 outputs is routed to the TF32 tiles, whose
    result meets a TF32 tolerance and misses exact fp32's; without the flag, fp32's tolerance."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 64, 20, 18, generator=g, dtype=torch.float64)
    w = torch.randn(64, 64, 3, 3, generator=g, dtype=torch.float64)
    want = torch.nn.functional.conv2d(x, w, padding=1).numpy()
    xd, wd = x.float().cuda(), w.float().cuda()
    if channels_last:
        xd = xd.to(memory_format=torch.channels_last)
    torch.backends.cudnn.allow_tf32 = True
    tf32 = rel_l2(gclient.conv2d(xd, wd, padding=1).double().cpu().numpy(), want)
    assert 2e-5 < tf32 <= 3e-3, f"with allow_tf32: {tf32:.3g}"
    exact = rel_l2(gclient.conv2d(xd, wd, padding=1, allow_tf32=False).double().cpu().numpy(), want)
    assert exact <= TOL["fp32"], f"allow_tf32=False: {exact:.3g}"
    torch.backends.cudnn.allow_tf32 = False
    exact = rel_l2(gclient.conv2d(xd, wd, padding=1).double().cpu().numpy(), want)
    assert exact <= TOL["fp32"], f"cudnn.allow_tf32 False: {exact:.3g}"
    forced = rel_l2(gclient.conv2d(xd, wd, padding=1, allow_tf32=True).double().cpu().numpy(), want)
    assert 2e-5 < forced <= 3e-3, f"allow_tf32=True: {forced:.3g}"


def test_host_tensors_on_a_gpu_daemon(gclient, rng):
    x = rng.standard_normal((2, 16, 12, 12)).astype(np.float32)
    w = rng.standard_normal((32, 4, 3, 3)).astype(np.float32)
    want = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), padding=1, groups=4)
    assert rel_l2(gclient.conv2d(x, w, padding=1, groups=4), want.numpy()) <= TOL["fp32"]


def test_cuda_tensor_on_a_cpu_daemon(client):
    x = torch.randn(1, 4, 8, 8, device="cuda")
    w = torch.randn(4, 4, 3, 3, device="cuda")
    with pytest.raises(convd.Error) as e:
        client.conv2d(x, w)
    assert e.value.code == "EUNSUPPORTED"
    assert client.conv2d(x.cpu(), w.cpu()).shape == (1, 4, 6, 6)


def test_registration_is_per_allocation_and_reused(gclient):
    dev = torch.device("cuda")
    w = torch.randn(64, 8, 3, 3, device=dev)
    # Stream-ordered requests hold their tensors until their completions are taken: a few
    # rounds first, so that the allocator's segments for the tensors in flight exist.
    for _ in range(10):
        gclient.conv2d(torch.randn(1, 64, 28, 28, device=dev), w, padding=1, groups=8)
    gclient.synchronize()
    registered = metric(gclient, "convd_regions_registered_total")
    segments = len(gclient._cuda)
    for _ in range(50):
        x = torch.randn(1, 64, 28, 28, device=dev)  # new tensors, the allocator's same segments
        y = gclient.conv2d(x, w, padding=1, groups=8)
        gclient.synchronize()  # no more tensors in flight than in the rounds above
        del x, y
    assert metric(gclient, "convd_regions_registered_total") == registered
    assert len(gclient._cuda) == segments


def test_a_process_outside_mps_is_told_once(gpu_daemon):
    """The first CUDA tensor a client registers checks whether this process is an MPS client;
    when it is not, one PerformanceWarning says what that costs and what to change."""
    import warnings

    from convd._cuda import driver

    dev = torch.device("cuda")
    mps = driver().mps_enabled(torch.cuda.current_device())
    c = gpu_daemon.connect()
    try:
        w = torch.randn(16, 4, 3, 3, device=dev)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            c.conv2d(torch.randn(1, 16, 8, 8, device=dev), w, groups=4)
            # 64 MiB: a new allocation to register, on the same device: no second warning.
            c.conv2d(torch.randn(1, 16, 1024, 1024, device=dev), w, groups=4)
        ours = [x for x in caught if issubclass(x.category, convd.PerformanceWarning)]
        if mps is False:
            assert len(ours) == 1, [str(x.message) for x in caught]
            assert "not an MPS client" in str(ours[0].message)
            assert ours[0].filename == __file__  # pointed at the caller, not the package
        else:
            assert ours == [], "an MPS client (or a driver that cannot say) was warned"
    finally:
        c.close()


CUDA_WAIT_CHILD = r"""
import ctypes, sys
import torch, convd
want, chosen = sys.argv[2], int(sys.argv[3])
cu = ctypes.CDLL("libcuda.so.1")
if chosen:
    assert cu.cuInit(0) == 0
    assert cu.cuDevicePrimaryCtxSetFlags_v2(0, chosen) == 0
dev = torch.device("cuda", 0)
torch.cuda.set_device(dev)
c = convd.connect(sys.argv[1], cuda_wait=want)
y = c.conv2d(torch.randn(1, 16, 8, 8, device=dev), torch.randn(16, 4, 3, 3, device=dev), groups=4)
torch.cuda.synchronize()
flags = ctypes.c_uint()
assert cu.cuCtxGetFlags(ctypes.byref(flags)) == 0
print(flags.value & 7, c._cuda.waits_blocked.get(0))
c.close()
"""


@pytest.mark.parametrize(
    "want,chosen,flags",
    [("block", 0, 4), ("keep", 0, 0), ("block", 1, 1), ("block", 2, 2)],
    ids=["auto-blocks", "keep", "spin-chosen", "yield-chosen"],
)
def test_cuda_wait(gpu_daemon, want, chosen, flags):
    """A process whose context waits as CUDA chooses (spinning, with fewer contexts than CPUs)
    blocks after its first convolution of CUDA tensors, unless it said cuda_wait="keep" or chose
    a scheduling mode itself; run in a fresh process, whose context starts as it says."""
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-c", CUDA_WAIT_CHILD, gpu_daemon.socket, want, str(chosen)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    got, said = r.stdout.split()
    assert int(got) == flags
    assert said == {"keep": "None", "block": "True" if chosen == 0 else "False"}[want]


def test_freed_allocation_is_unregistered(gclient):
    dev = torch.device("cuda")
    w = torch.randn(16, 16, 1, 1, device=dev)
    base = metric(gclient, "convd_regions")
    for _ in range(5):
        # 64 MiB: an allocation (segment) of its own, freed by empty_cache().
        x = torch.randn(1, 16, 1024, 1024, device=dev)
        gclient.conv2d(x, w)
        del x
        gclient.synchronize()  # a stream-ordered request holds x until its completion is taken
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    gclient.conv2d(torch.randn(1, 16, 8, 8, device=dev), w)
    # The freed allocations' registrations went when the next one was made: a bounded number
    # of regions remain (w's, the small input's and output's), not one per big tensor.
    assert metric(gclient, "convd_regions") - base <= 4
    assert len(gclient._cuda) <= 4


@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("side_stream", [False, True])
@pytest.mark.parametrize("use_future", [False, True])
def test_stream_order_producer_and_consumer(gpu_daemon, side_stream, use_future, ordered):
    with gpu_daemon.connect(stream_ordered=ordered) as gclient:
        assert gclient.stream_ordered == ordered
        producer_and_consumer(gclient, side_stream, use_future)
        gclient.synchronize()


def producer_and_consumer(gclient, side_stream, use_future):
    dev = torch.device("cuda")
    src = torch.randn(4, 32, 56, 56, device=dev)
    w = torch.randn(32, 4, 3, 3, device=dev)
    want = torch.nn.functional.conv2d(src.double(), w.double(), padding=1, groups=8)
    stream = torch.cuda.Stream() if side_stream else torch.cuda.current_stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        x = torch.full_like(src, float("nan"))
        # The producer: queued behind ~0.2 s of spinning, so it has not run when the call is made.
        torch.cuda._sleep(int(2e8))
        x.copy_(src)
        if use_future:
            y = gclient.submit(x, w, padding=1, groups=8).result()
        else:
            y = gclient.conv2d(x, w, padding=1, groups=8)
        # The consumer: queued right after the call, on the same stream.
        z = y * 2
    stream.synchronize()
    assert rel_l2(y.double().cpu().numpy(), want.cpu().numpy()) <= TOL["fp32"]
    assert rel_l2(z.double().cpu().numpy(), 2 * want.cpu().numpy()) <= TOL["fp32"]


# ---------------------------------------------------------------- stream ordering (protocol 3)


def test_stream_ordered_chain(gclient, poisoned):
    """conv -> relu -> conv on a side stream with no synchronisation between: both calls return
    before the stream has even run the input's producer (queued behind a sleep), and the
    result matches PyTorch's chain."""
    assert gclient.info["protocol_version"] >= 3 and gclient.stream_ordered
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(11)
    src = torch.randn(2, 32, 40, 40, generator=g, dtype=torch.float64)
    w1 = torch.randn(64, 4, 3, 3, generator=g, dtype=torch.float64)
    b1 = torch.randn(64, generator=g, dtype=torch.float64)
    w2 = torch.randn(48, 64, 1, 1, generator=g, dtype=torch.float64)
    h_ref = torch.relu(torch.nn.functional.conv2d(src.float().double(), w1.float().double(),
                                                  b1.float().double(), padding=1, groups=8))
    want = torch.nn.functional.conv2d(h_ref, w2.float().double())
    xd, w1d, b1d, w2d = (t.float().to(dev) for t in (src, w1, b1, w2))
    gclient.conv2d(xd, w1d, b1d, padding=1, groups=8)  # registrations and the gate slab first
    gclient.synchronize()
    # The chain's own kernels once, before the sleep: under CUDA's lazy loading (the default)
    # the first launch of a kernel loads its module, which waited for the queued sleep (the
    # first relu took 0.50 s behind it on the H100, later ones 0.1 ms).
    torch.relu(torch.full_like(xd, float("nan")).copy_(xd))
    torch.cuda.synchronize()
    spin = sleep_cycles(0.5)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        x = torch.full_like(xd, float("nan"))
        torch.cuda._sleep(spin)
        x.copy_(xd)  # the producer, behind the sleep
        t0 = time.perf_counter()
        h = torch.relu(gclient.conv2d(x, w1d, b1d, padding=1, groups=8))
        y = gclient.conv2d(h, w2d)
        issued = time.perf_counter() - t0
        busy = not stream.query()
    assert busy, "the stream had run dry when the calls returned: they waited for it"
    assert issued < 0.25, f"issuing took {issued:.3f} s behind a 0.5 s sleep: the calls waited"
    stream.synchronize()
    err = rel_l2(y.double().cpu().numpy(), want.numpy())
    assert err <= TOL["fp32"], f"{err:.3g}"
    gclient.synchronize()  # nothing failed


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_patched_layer_fast_path(gclient, monkeypatch, poisoned, dtype):
    """A patched layer's second call with the same signature skips the general path (its plan
    and its weight's and bias's allocations kept), and still computes on its parameters as they
    are: after an in-place change, and, through the general path again, after the weight is
    replaced, for another input shape and for NCHW input. Every input made by a kernel right
    before the call, every output against F.conv2d."""
    dev, dt = torch.device("cuda"), DT[dtype]
    layer = convd.torch.patch(torch.nn.Conv2d(32, 64, 3, padding=1, groups=8), gclient)
    layer = layer.to(device=dev, dtype=dt, memory_format=torch.channels_last)
    g = torch.Generator(device=dev).manual_seed(5)

    def check(shape=(2, 32, 20, 20), cl=True):
        x = torch.randn(shape, generator=g, device=dev, dtype=torch.float32).to(dt)
        if cl:
            x = x.contiguous(memory_format=torch.channels_last)
        y = layer(x)
        with torch.no_grad():  # the reference, not the layer, is off the autograd graph
            want = torch.nn.functional.conv2d(
                x.double(), layer.weight.double(), layer.bias.double(), padding=1, groups=8
            )
        assert y.is_contiguous(memory_format=torch.channels_last) == cl
        err = rel_l2(y.double().cpu().numpy(), want.cpu().numpy())
        assert err <= TOL[dtype], f"{err:.3g}"

    general = gclient._call

    def not_general(*a, **kw):
        raise AssertionError("the general path served a call the fast path should have")

    check()
    assert layer._convd_fast is not None
    monkeypatch.setattr(gclient, "_call", not_general)
    check()
    check()
    with torch.no_grad():
        layer.weight.mul_(-2)  # in place: same storage, new values
        layer.bias.add_(1)
    check()
    monkeypatch.setattr(gclient, "_call", general)
    w = layer.weight.detach().clone(memory_format=torch.channels_last)
    layer.weight = torch.nn.Parameter(w * 0.5)  # another tensor: the general path again
    check()
    check((1, 32, 9, 13))  # another shape
    check(cl=False)  # NCHW input, channels_last weight: the general path copies the weight
    assert layer._convd_fast is None
    layer.weight = torch.nn.Parameter(layer.weight.detach().contiguous())
    check(cl=False)
    assert layer._convd_fast is not None and layer._convd_fast.fmt == torch.contiguous_format
    monkeypatch.setattr(gclient, "_call", not_general)
    check(cl=False)
    gclient.synchronize()


def test_stream_ordered_many_then_one_synchronize(gpu_daemon, gclient, poisoned):
    """64 convolutions, each of an input made by a kernel right before it, issued back to back
    without synchronising, then one torch.cuda.synchronize(): every output is right. The gate
    slab is registered with the driver once per client, whatever the streams."""
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(12)
    src = torch.randn(1, 64, 28, 28, generator=g, dtype=torch.float64)
    w = torch.randn(64, 8, 3, 3, generator=g, dtype=torch.float64)
    want = torch.nn.functional.conv2d(src.float().double(), w.float().double(), padding=1,
                                      groups=8)
    sd, wd = src.float().to(dev), w.float().to(dev)
    gclient.conv2d(sd, wd, padding=1, groups=8)
    gclient.synchronize()
    gates = gclient._gates
    assert gates is not None and gates.host_registrations == 1
    side = torch.cuda.Stream()
    outs = []
    torch.cuda._sleep(sleep_cycles(0.2))
    side.wait_stream(torch.cuda.current_stream())
    for i in range(64):
        with torch.cuda.stream(side if i % 2 else torch.cuda.current_stream()):
            x = sd * (i + 1)  # the producer, right before the call
            outs.append(gclient.conv2d(x, wd, padding=1, groups=8))
    torch.cuda.synchronize()
    for i, y in enumerate(outs):
        err = rel_l2(y.double().cpu().numpy(), (i + 1) * want.numpy())
        assert err <= TOL["fp32"], f"call {i}: {err:.3g}"
    gclient.synchronize()
    assert gclient._gates is gates and gates.host_registrations == 1
    assert len(gates.free) + len(gates.limbo) == gates.slots  # every slot came back
    # Another client has a slab of its own, registered once too.
    with gpu_daemon.connect() as other:
        other.conv2d(sd, wd, padding=1, groups=8)
        other.synchronize()
        assert other._gates is not gates and other._gates.host_registrations == 1


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_synchronous_path_when_turned_off(gpu_daemon, monkeypatch, how):
    """stream_ordered=False (or $CONVD_STREAM_ORDERED=0): the caller's stream is synchronised
    and the call waits, as before protocol 3; no gate slab is made."""
    if how == "environment":
        monkeypatch.setenv("CONVD_STREAM_ORDERED", "0")
        c = gpu_daemon.connect()
    else:
        c = gpu_daemon.connect(stream_ordered=False)
    try:
        assert not c.stream_ordered
        dev = torch.device("cuda")
        src = torch.randn(2, 16, 20, 20, device=dev)
        w = torch.randn(16, 4, 3, 3, device=dev)
        want = torch.nn.functional.conv2d(src.double(), w.double(), padding=1, groups=4)
        c.conv2d(src, w, padding=1, groups=4)
        torch.cuda.synchronize()
        spin = sleep_cycles(0.3)
        x = torch.full_like(src, float("nan"))
        torch.cuda._sleep(spin)
        x.copy_(src)
        y = c.conv2d(x, w, padding=1, groups=4)
        assert torch.cuda.current_stream().query(), "the call returned before its stream ran"
        assert rel_l2(y.double().cpu().numpy(), want.cpu().numpy()) <= TOL["fp32"]
        assert c._gates is None
        producer_and_consumer(c, True, False)
    finally:
        c.close()


@pytest.mark.parametrize(
    "option, code, calls",
    [
        (("--max-inflight-per-user", "2"), "ELIMIT", 8),
        (("--gate-timeout-ms", "100"), "ETIMEDOUT", 3),
    ],
    ids=["refused", "gate-timeout"],
)
def test_failure_releases_the_stream(option, code, calls, poisoned):
    """Requests that fail after they were sent, while their stream is blocked: refused by the
    daemon (the user's in-flight share is 2, and two already wait for the stream) or timed out
    waiting for their ready words (the stream sleeps ten times gate_timeout_ms). The stream
    still runs dry (the daemon writes the done words, for a refusal after it read the gate as
    for a timeout; the client's own thread takes the completions, since nobody calls it),
    and the error comes back as convd.Error with its code, from a later call or
    synchronize(). The client works on."""
    try:
        d = Daemon(*option, backend="gpu")
    except RuntimeError as e:
        if "without GPU support" in str(e):
            pytest.skip("$CONVD_DAEMON was built without the GPU backend")
        raise
    try:
        c = d.connect()
        assert c.stream_ordered
        dev = torch.device("cuda")
        src = torch.randn(1, 16, 24, 24, device=dev)
        w = torch.randn(16, 16, 3, 3, device=dev)
        want = torch.nn.functional.conv2d(src.double(), w.double(), padding=1).cpu().numpy()
        c.conv2d(src, w, padding=1)
        c.synchronize()
        torch.cuda.synchronize()
        stream = torch.cuda.current_stream()
        torch.cuda._sleep(sleep_cycles(1.0))
        errors = []
        for _ in range(calls):
            try:
                c.conv2d(src, w, padding=1)
            except convd.Error as e:  # an earlier call's failure, raised by this one
                errors.append(e)
        if not drained(stream, 30):
            unstick(c)
            pytest.fail("the stream still waited after 30 s: a done word was never written")
        try:
            c.synchronize()
        except convd.Error as e:
            errors.append(e)
        assert errors, "no failure was reported"
        for e in errors:
            assert e.code == code, str(e)
        c.synchronize()  # each failure is raised once
        y = c.conv2d(src, w, padding=1)
        assert rel_l2(y.double().cpu().numpy(), want) <= TOL["fp32"]
        c.close()
    finally:
        assert d.stop() == 0


def test_close_waits_for_stream_ordered_requests(gpu_daemon):
    """close() with stream-ordered requests whose stream has not yet reached them: it takes
    their completions (the stream goes on meanwhile), synchronises the device and unregisters
    the gate words; the outputs are complete."""
    c = gpu_daemon.connect()
    dev = torch.device("cuda")
    src = torch.randn(1, 16, 24, 24, device=dev)
    w = torch.randn(16, 16, 3, 3, device=dev)
    want = torch.nn.functional.conv2d(src.double(), w.double(), padding=1).cpu().numpy()
    c.conv2d(src, w, padding=1)
    c.synchronize()
    torch.cuda._sleep(sleep_cycles(0.3))
    outs = [c.conv2d(src, w, padding=1) for _ in range(4)]
    assert c._gated > 0
    c.close()
    assert c._gated == 0
    torch.cuda.synchronize()
    for y in outs:
        assert rel_l2(y.double().cpu().numpy(), want) <= TOL["fp32"]


@pytest.mark.parametrize("name", ["resnext50_32x4d", "regnet_y_400mf", "mobilenet_v3_small", "convnext_tiny"])
def test_models_on_the_gpu(gclient, name, poisoned):
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval().to(dev)
    n_convs = sum(type(m) is torch.nn.Conv2d for m in model.modules())
    patched = convd.torch.patch(copy.deepcopy(model), gclient)
    x32 = torch.randn(1, 3, 224, 224, device=dev)
    with torch.no_grad():
        ref32 = model(x32).double()
        for channels_last in (False, True):
            x = x32.to(memory_format=torch.channels_last) if channels_last else x32
            before = served(gclient)
            got = patched(x)
            gclient.synchronize()  # stream-ordered: the forward returns before the daemon is done
            assert served(gclient) - before == n_convs
            err = rel_l2(got.double().cpu().numpy(), ref32.cpu().numpy())
            assert err <= 1e-4, f"{name} fp32 channels_last={channels_last}: {err:.3g}"
        for dtype in ("fp16", "bf16"):
            m16 = copy.deepcopy(model).to(DT[dtype])
            p16 = convd.torch.patch(copy.deepcopy(m16), gclient)
            for channels_last in (False, True):
                x = x32.to(DT[dtype])
                if channels_last:
                    x = x.to(memory_format=torch.channels_last)
                torch_err = rel_l2(m16(x).double().cpu().numpy(), ref32.cpu().numpy())
                ours = rel_l2(p16(x).double().cpu().numpy(), ref32.cpu().numpy())
                assert ours <= 2 * torch_err + 1e-3, (
                    f"{name} {dtype} channels_last={channels_last}: convd {ours:.3g}, "
                    f"PyTorch {torch_err:.3g}"
                )
