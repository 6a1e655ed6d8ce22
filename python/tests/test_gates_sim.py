"""The stream-ordered path of the package (docs/python.md, "Stream ordering") on a machine
without a GPU: a real CPU daemon of this build, with the CUDA driver replaced by simulated
streams, so that the client's gate code (Client._cuda_request, _gated_request, GateSlab,
synchronize(), close() and the convd-gates thread) runs wherever the Python suite runs, not
only in test_gpu.py on a GPU machine.

- A simulated stream is a thread running what is queued on it in order: the ready writes and
  done waits the client queues through the fake driver (cuStreamWriteValue32 /
  cuStreamWaitValue32 on the host words of the gate slab, whose device address is their host
  address), and the producers, consumers, holds and sleeps a test queues.
- The "CUDA tensors" are numpy arrays in a host region of the client, which the daemon reads and
  writes in place; they start as NaN, and results are compared with F.conv2d in float64 as the
  consumers queued on the stream saw them.
- A test holds its stream behind an event while it issues, so that "the call returned before the
  stream ran" is checked without timing: right after the calls the stream is still busy and the
  outputs are still NaN. Waits here are bounded (HANG_S, and WATCHDOG_S for a whole test) only
  so that a bug fails instead of hanging.

Covered: a conv -> relu -> conv chain, 64 calls and one synchronize(), a future, close() with
requests pending, a driver refusing the ready write or the done wait, the gate counter wrapping,
requests the daemon refuses (max_inflight_per_user) or times out (gate_timeout_ms) with their
error raised once by synchronize(), by the next call or by their future, a daemon killed with
requests pending, and fewer gate slots (max_inflight 3) than calls.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import signal
import threading
import time
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import convd
from convd import _client, _cuda
from convd._args import activation_spec
from convd._memory import create_region
from conftest import TOL, Daemon, rel_l2

HANG_S = 20.0  # hang guard for every wait below; nothing here comes near it when it works
WATCHDOG_S = 60  # hang guard for a whole test, and again for its teardown (watchdog)
_MASK32 = 0xFFFFFFFF


def _geq(a: int, b: int) -> bool:
    """CU_STREAM_WAIT_VALUE_GEQ: (int32_t)(a - b) >= 0."""
    return ((a - b) & _MASK32) < 0x80000000


def _word(addr: int) -> ctypes.c_uint32:
    return ctypes.c_uint32.from_address(addr)


class SimStream:
    """A CUDA stream: a thread running its operations in order, each once the one before it has
    finished. ("write", addr, value) and ("wait", addr, value) are the driver's stream memory
    operations on 32-bit host words; ("hold", event) blocks until the event is set; ("sleep",
    seconds); ("fn", callable) is a kernel. stop() drops what is left (a test that failed)."""

    def __init__(self, handle: int):
        self.handle = handle
        self.ops: collections.deque = collections.deque()  # the running one stays first
        self.cv = threading.Condition()
        self.stopped = False
        self.error: BaseException | None = None
        self.thread = threading.Thread(
            target=self._run, name=f"sim-stream-{handle:#x}", daemon=True
        )
        self.thread.start()

    def put(self, *op) -> None:
        with self.cv:
            assert not self.stopped
            self.ops.append(op)
            self.cv.notify_all()

    def busy(self) -> bool:
        with self.cv:
            return bool(self.ops)

    def drained(self, timeout: float = HANG_S) -> bool:
        """Whether everything queued has run within the timeout. Raises what a queued
        function raised."""
        with self.cv:
            done = self.cv.wait_for(lambda: not self.ops or self.stopped, timeout)
            done = done and not self.ops
        if self.error is not None:
            raise AssertionError(f"an operation of the simulated stream failed: {self.error!r}")
        return done

    def waits_met(self) -> bool:
        """Whether every wait still queued would pass now (its word already holds its value)."""
        with self.cv:
            waits = [(op[1], op[2]) for op in self.ops if op[0] == "wait"]
        return all(_geq(_word(a).value, v) for a, v in waits)

    def stop(self) -> None:
        with self.cv:
            self.stopped = True
            self.cv.notify_all()
        self.thread.join(5)

    def _run(self) -> None:
        while True:
            with self.cv:
                self.cv.wait_for(lambda: self.ops or self.stopped)
                if self.stopped:
                    return
                op = self.ops[0]
            try:
                self._do(op)
            except BaseException as e:  # noqa: BLE001 - reported by drained()
                if self.error is None:
                    self.error = e
            with self.cv:
                if self.stopped:
                    return
                self.ops.popleft()
                self.cv.notify_all()

    def _do(self, op) -> None:
        kind = op[0]
        if kind == "write":
            _word(op[1]).value = op[2]
        elif kind == "wait":
            w = _word(op[1])
            while not _geq(w.value, op[2]) and not self.stopped:
                time.sleep(0.0002)
        elif kind == "hold":
            while not op[1].wait(0.05) and not self.stopped:
                pass
        elif kind == "sleep":
            time.sleep(op[1])
        elif kind == "fn":
            op[1]()
        else:
            raise AssertionError(f"unknown stream operation {kind!r}")


class FakeDriver:
    """What GateSlab asks of _cuda._Driver, over simulated streams: host registration (recorded),
    device pointers (the host address), and the two stream memory operations (queued on the
    stream named by the handle), one at a time or both in one batch (batch_memop: None makes the
    slab use two calls). `fail` makes the driver refuse the "write", the "wait" or the "batch"
    (a refused batch queues nothing)."""

    def __init__(self, sim: Sim):
        self.sim = sim
        self.registered: dict[int, int] = {}  # address -> size
        self.registrations = 0
        self.retained = 0  # primary contexts retained and not yet released
        self.queued = 0  # stream operations queued
        self.fail: str | None = None
        self.unregistered_busy = False  # host_unregister while a stream still had work
        self.batch_memop = True  # cuStreamBatchMemOp is there (GateSlab tries it at attach)
        self.batches = 0  # write_and_wait calls that queued their two operations

    def has_stream_ops(self) -> bool:
        return True

    def primary_context(self, device: int) -> int:
        assert device == 0
        self.retained += 1
        return 0xC0DE

    def release(self, device: int) -> None:
        self.retained -= 1

    def enter(self, ctx: int) -> bool:
        assert ctx == 0xC0DE
        return False

    def leave(self) -> None:
        raise AssertionError("leave() without a context pushed")

    def errstr(self, rc: int) -> str:
        return f"simulated CUDA driver error {rc}"

    def host_register(self, addr: int, size: int, flags: int) -> int:
        assert flags == 3, "PORTABLE | DEVICEMAP"
        assert addr % 4096 == 0 and size % 4096 == 0 and addr not in self.registered
        self.registered[addr] = size
        self.registrations += 1
        return 0

    def host_unregister(self, addr: int) -> int:
        if any(s.busy() for s in self.sim.streams.values()):
            self.unregistered_busy = True
        del self.registered[addr]
        return 0

    def host_dptr(self, p, addr: int, flags: int) -> int:
        if addr not in self.registered:
            return 1  # CUDA_ERROR_INVALID_VALUE: not registered
        p._obj.value = addr
        return 0

    def _inside(self, addr: int) -> bool:
        return any(a <= addr and addr + 4 <= a + n for a, n in self.registered.items())

    def write_value(self, stream: int, addr: int, value: int, flags: int) -> int:
        if self.fail == "write":
            return 700
        assert flags == 0 and self._inside(addr)
        self.sim.streams[stream].put("write", addr, value)
        self.queued += 1
        return 0

    def wait_value(self, stream: int, addr: int, value: int, flags: int) -> int:
        if self.fail == "wait":
            return 701
        assert flags == 0 and self._inside(addr)
        self.sim.streams[stream].put("wait", addr, value)
        self.queued += 1
        return 0

    def write_and_wait(self, stream: int, ready: int, done: int, value: int) -> int:
        assert self.batch_memop is not None, "a batch on a driver without cuStreamBatchMemOp"
        if self.fail is not None:
            return 702
        assert self._inside(ready) and self._inside(done)
        self.sim.streams[stream].put("write", ready, value)
        self.sim.streams[stream].put("wait", done, value)
        self.queued += 2
        self.batches += 1
        return 0


class _Segment:
    __slots__ = ("region", "inflight", "bid")


class Mem:
    """A client's "CUDA allocation", in place of _cuda.CudaRegions: one host region the client
    made (the daemon maps it), from which arrays are carved, poisoned with NaN. The region goes
    with the connection: no array of it may be touched after close()."""

    def __init__(self, client, size: int = 16 << 20):
        with client._lock:
            self.region = create_region(client, size)
        self.seg = _Segment()
        self.seg.region = self.region.handle
        self.seg.inflight = 0
        self.seg.bid = 1
        self.by_bid = {1: self.seg}  # what kept() checks a registration against
        self.lookups = 0  # locate() calls: the driver queries of CudaRegions
        self.buf = (ctypes.c_char * size).from_address(self.region.addr)
        self.used = 0

    def array(self, shape) -> np.ndarray:
        n = int(np.prod(shape))
        off = (self.used + 255) // 256 * 256
        assert off + 4 * n <= self.region.size
        self.used = off + 4 * n
        a = np.frombuffer(self.buf, np.float32, n, off).reshape(shape)
        a[...] = np.nan
        return a

    def random(self, rng, shape) -> np.ndarray:
        a = self.array(shape)
        a[...] = rng.standard_normal(shape)
        return a

    # What _gated_request asks of CudaRegions.
    def locate(self, ptr: int, nbytes: int):
        self.lookups += 1
        off = ptr - self.region.addr
        assert 0 <= off and off + nbytes <= self.region.size
        return self.seg, off

    def kept(self, seg) -> bool:
        return self.by_bid.get(seg.bid) is seg

    def drop_all(self) -> None:
        pass

    def __len__(self) -> int:
        return 1


class FakeTensor:
    """What the stream-ordered path reads of a CUDA tensor: its device and data_ptr()."""

    device = types.SimpleNamespace(type="cuda", index=0)

    def __init__(self, a: np.ndarray):
        self.a = a

    def data_ptr(self) -> int:
        return self.a.ctypes.data


class Sim:
    """The fixture's state: the fake driver and streams (patched in for one test), and the
    clients and daemons a test makes, closed and stopped after it."""

    def __init__(self, monkeypatch):
        self.streams: dict[int, SimStream] = {}
        self.drv = FakeDriver(self)
        self.current = 0
        self.clients: list = []
        self.daemons: list = []
        self.killed: list = []
        self.device_synchronized = threading.Event()  # torch.cuda.synchronize() was called
        monkeypatch.setattr(_cuda, "_driver", self.drv)
        monkeypatch.setattr(_client, "_current_stream", lambda device: self.current)
        # GateSlab.close() synchronises the devices that used the slab before unregistering it.
        monkeypatch.setattr(torch.cuda, "synchronize", self.synchronize)

    def stream(self) -> SimStream:
        """A new stream, made the current one."""
        s = SimStream(0x5000 + len(self.streams))
        self.streams[s.handle] = s
        self.current = s.handle
        return s

    def synchronize(self, device=None) -> None:
        self.device_synchronized.set()
        for s in self.streams.values():
            s.drained()

    def daemon(self, *args) -> Daemon:
        d = Daemon(*args)
        self.daemons.append(d)
        return d

    def kill(self, d: Daemon) -> None:
        self.killed.append(d)
        d.kill()

    def connect(self, daemon):
        """A client whose CUDA calls take the stream-ordered path, as with a GPU daemon of
        protocol 3, and its memory."""
        c = daemon.connect()
        self.clients.append(c)
        assert c.info["protocol_version"] >= 3, "the daemon does not speak gates"
        assert _client._lib_gates, "the library has no gates"
        c._ordered = True
        c._ordered_auto = False  # a driver failure raises rather than taking the other path
        mem = Mem(c)
        c._cuda = mem
        return c, mem

    def teardown(self) -> None:
        # A test that failed may leave a stream held or waiting: stop every stream first (it
        # must not touch the gate words once they are freed), then let the daemon start what
        # is still waiting for a ready word, so that close() need not wait out its timeout.
        for s in self.streams.values():
            s.stop()
        try:
            for c in self.clients:
                if not c._closed:
                    with c._lock:
                        g = c._gates
                        for req in list(c._pending.values()):
                            if g is not None and req.slot is not None:
                                g.words[2 * req.slot] = req.value
                    c.close()
        finally:
            bad = []
            for d in self.daemons:
                rc = d.stop()
                if d not in self.killed and rc != 0:
                    bad.append(rc)
        assert not bad, f"convd exited with {bad} after SIGTERM"
        assert self.drv.retained == 0, "a primary context was retained and never released"


@pytest.fixture
def watchdog():
    """Fails a test still running after WATCHDOG_S, and then its teardown: the client's own
    waits are not bounded, so a call that waits for a stream held behind it (or for a slot that
    never comes back) would otherwise hang the run. SIGALRM interrupts the main thread's sleeps
    and waits; the client's waits into the library last 10 ms at most."""

    def expired(signum, frame):
        pytest.fail(f"still running after {WATCHDOG_S} s: a wait that should have ended did not")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, WATCHDOG_S)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture
def sim(monkeypatch, watchdog):
    s = Sim(monkeypatch)
    yield s
    signal.setitimer(signal.ITIMER_REAL, WATCHDOG_S)  # the teardown's own
    s.teardown()


# ---------------------------------------------------------------- helpers


def issue(c, mem, x, w, b=None, *, wait=True, stride=1, padding=0, groups=1):
    """A convolution of arrays of mem, as conv2d() (wait) or submit() of CUDA tensors issues it
    through Client._cuda_request: returns its output array (written in stream order), and with
    wait=False its Future too."""
    act = activation_spec(False, None)
    plan = c._numpy_plan(x, w, b, stride, padding, 1, groups, act, None, None, False)
    out = mem.array(plan.out_shape)
    t = FakeTensor
    got = c._cuda_request(plan, t(x), t(w), None if b is None else t(b), t(out), out, 0, wait)
    if wait:
        assert got is out
        return out
    assert isinstance(got, convd.Future)
    return out, got


def produce(s: SimStream, x: np.ndarray, src: np.ndarray) -> None:
    """A producer kernel: writes src into x in stream order."""
    s.put("fn", functools.partial(np.copyto, x, src))


def consume(s: SimStream, y: np.ndarray, seen: list) -> None:
    """A consumer kernel: copies y in stream order, as the work queued after the call sees it."""
    s.put("fn", lambda: seen.append(y.copy()))


def hold(s: SimStream) -> threading.Event:
    ev = threading.Event()
    s.put("hold", ev)
    return ev


def reference(x, w, b=None, **kw) -> np.ndarray:
    t = torch.from_numpy
    return F.conv2d(
        t(np.array(x, np.float64)),
        t(np.array(w, np.float64)),
        None if b is None else t(np.array(b, np.float64)),
        **kw,
    ).numpy()


def wait_until(cond, timeout: float = HANG_S) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


def assert_all_back(c, mem) -> None:
    """Nothing left in flight: every gate slot free (its queued ready write landed), the
    tensors let go. After the stream has drained and synchronize()."""
    with c._lock:
        g = c._gates
        assert c._gated == 0 and not c._pending
        g.sweep()
        assert not g.limbo, f"slots whose ready write never landed: {g.limbo}"
        assert sorted(g.free) == list(range(g.slots))
    assert mem.seg.inflight == 0


def check_first_call(c, mem, s, rng):
    """A first call (the gate slab made and attached) run to the end: (x, w, want)."""
    x = mem.random(rng, (1, 8, 10, 10))
    w = mem.random(rng, (8, 8, 3, 3))
    want = reference(x, w, padding=1)
    seen = []
    consume(s, issue(c, mem, x, w, padding=1), seen)
    assert s.drained(), "the stream still waits for the first call"
    c.synchronize()
    assert len(seen) == 1 and rel_l2(seen[0], want) <= TOL["fp32"]
    return x, w, want


# ---------------------------------------------------------------- the ordered path


def test_chain_in_stream_order(sim, daemon, rng):
    """conv (with bias, grouped) -> relu -> conv, with the input's producer, the relu and the
    consumer queued on the stream as kernels, behind a hold: the calls return before the stream
    has run anything, and the consumer sees the chain's result."""
    c, mem = sim.connect(daemon)
    s = sim.stream()
    x = mem.array((2, 16, 12, 12))
    w1 = mem.random(rng, (16, 4, 3, 3))
    b1 = mem.random(rng, (16,))
    w2 = mem.random(rng, (24, 16, 1, 1))
    src = rng.standard_normal(x.shape).astype(np.float32)
    ev = hold(s)
    produce(s, x, src)
    h = issue(c, mem, x, w1, b1, padding=1, groups=4)
    s.put("fn", functools.partial(np.maximum, h, 0, out=h))
    y = issue(c, mem, h, w2)
    seen = []
    consume(s, y, seen)
    # Returned with nothing run: the slab made and attached on the way (its spare write and
    # wait queued behind the hold too).
    assert s.busy() and np.isnan(x).all() and np.isnan(h).all() and np.isnan(y).all()
    assert c._gated == 2
    assert sim.drv.registrations == 1 and c._gates.host_registrations == 1
    # Each call's write and wait went in one batch (the attach's try is the third).
    assert c._gates.batched and sim.drv.batches == 3
    ev.set()
    assert s.drained(), "the stream still waits: a done word was never written"
    c.synchronize()
    want = reference(
        np.maximum(reference(src, w1, b1, padding=1, groups=4), 0), w2
    )
    assert len(seen) == 1 and rel_l2(seen[0], want) <= TOL["fp32"]
    assert_all_back(c, mem)
    c.close()
    assert not sim.drv.registered and not sim.drv.unregistered_busy


def test_placed_weights_are_not_looked_up_again(sim, daemon, rng):
    """A weight and bias named by Placed (a patched layer's kept registrations) are looked up
    once: later calls name them from what was kept, and compute the same. A registration that
    went meanwhile (evicted) is looked up again."""
    c, mem = sim.connect(daemon)
    s = sim.stream()
    w = mem.random(rng, (16, 4, 3, 3))
    b = mem.random(rng, (16,))
    src = rng.standard_normal((2, 16, 12, 12)).astype(np.float32)
    want = reference(src, w, b, padding=1, groups=4)
    t = FakeTensor
    pw, pb = _client.Placed(t(w)), _client.Placed(t(b))
    act = activation_spec(False, None)

    def call():
        x = mem.array(src.shape)
        produce(s, x, src)
        plan = c._numpy_plan(x, w, b, 1, 1, 1, 4, act, None, None, False)
        out = mem.array(plan.out_shape)
        assert c._cuda_request(plan, t(x), pw, pb, t(out), out, 0, True) is out
        seen = []
        consume(s, out, seen)
        assert s.drained()
        c.synchronize()
        assert len(seen) == 1 and rel_l2(seen[0], want) <= TOL["fp32"]

    call()
    assert c._cuda is not None
    first = mem.lookups
    for _ in range(3):
        call()
    assert mem.lookups - first == 3 * 2, "only the input and output are looked up again"
    mem.by_bid.clear()  # the registration went: the kept one must not be used
    call()
    assert mem.lookups - first == 4 * 2 + 2
    assert_all_back(c, mem)
    c.close()


def test_many_calls_then_one_synchronize(sim, daemon, rng):
    """64 calls issued behind a hold, each with its own producer and consumer, then one
    synchronize(): every consumer saw its own right output; one host registration."""
    c, mem = sim.connect(daemon)
    s = sim.stream()
    n = 64
    assert c.info["max_inflight"] >= n, "this test issues all its calls without waiting"
    w = mem.random(rng, (8, 8, 3, 3))
    ev = hold(s)
    outs, srcs, seen = [], [], []
    for _ in range(n):
        x = mem.array((1, 8, 10, 10))
        src = rng.standard_normal(x.shape).astype(np.float32)
        produce(s, x, src)
        y = issue(c, mem, x, w, padding=1)
        consume(s, y, seen)
        outs.append(y)
        srcs.append(src)
    assert s.busy() and c._gated == n
    assert all(np.isnan(y).all() for y in outs)
    ev.set()
    c.synchronize()
    assert s.drained(), "the stream still waits: a done word was never written"
    assert len(seen) == n
    for got, src in zip(seen, srcs):
        assert rel_l2(got, reference(src, w, padding=1)) <= TOL["fp32"]
    assert sim.drv.registrations == 1 and c._gates.host_registrations == 1
    assert_all_back(c, mem)
    c.close()
    assert not sim.drv.registered


def test_future(sim, daemon, rng):
    """submit(): the future is not done while the stream holds the request back; result()
    returns the output, complete for the CPU, and the consumer sees it too."""
    c, mem = sim.connect(daemon)
    s = sim.stream()
    x = mem.array((1, 8, 10, 10))
    w = mem.random(rng, (8, 8, 3, 3))
    src = rng.standard_normal(x.shape).astype(np.float32)
    ev = hold(s)
    produce(s, x, src)
    y, f = issue(c, mem, x, w, padding=1, wait=False)
    seen = []
    consume(s, y, seen)
    assert s.busy() and np.isnan(y).all()
    assert not f.done()
    ev.set()
    assert f.result(timeout=HANG_S) is y
    want = reference(src, w, padding=1)
    assert rel_l2(y, want) <= TOL["fp32"]
    assert set(f.info) == {"queue_us", "exec_us", "batch_size"}
    assert s.drained()
    assert len(seen) == 1 and rel_l2(seen[0], want) <= TOL["fp32"]
    assert_all_back(c, mem)
    c.close()


def test_close_with_requests_pending(sim, daemon, rng):
    """close() while the stream has not reached the requests yet: it takes their completions
    as the stream goes on, synchronises the device (here: the simulated streams) and only then
    unregisters the gate words; the consumer saw every output complete."""
    c, mem = sim.connect(daemon)
    s = sim.stream()
    x = mem.array((1, 8, 10, 10))
    w = mem.random(rng, (8, 8, 3, 3))
    src = rng.standard_normal(x.shape).astype(np.float32)
    want = reference(src, w, padding=1)  # before close(): mem goes with the connection
    ev = hold(s)
    produce(s, x, src)
    outs = [issue(c, mem, x, w, padding=1) for _ in range(5)]
    seen = []
    s.put("fn", lambda: seen.extend(y.copy() for y in outs))
    # Work queued after the requests that lasts until someone waits for the device: close()
    # must, before it unregisters the gate words the stream may still be using.
    s.put("hold", sim.device_synchronized)
    assert s.busy() and c._gated == 5
    # The stream is let go only once close() has started, with all five still pending.
    end_gated = c._end_gated
    at_close = []

    def releasing_end_gated():
        at_close.append((c._gated, s.busy()))
        ev.set()
        end_gated()

    c._end_gated = releasing_end_gated
    c.close()
    assert at_close == [(5, True)]
    assert c._gated == 0
    assert not s.busy(), "close() returned before the stream had drained"
    assert not sim.drv.registered, "the gate slab is still registered with the driver"
    assert not sim.drv.unregistered_busy, "the gate words were unregistered while in use"
    assert sim.drv.retained == 0
    assert len(seen) == 5
    for got in seen:
        assert rel_l2(got, want) <= TOL["fp32"]


@pytest.mark.parametrize("what", ["write", "wait", "batch"])
def test_driver_refuses_the_stream_operation(sim, daemon, rng, what):
    """The driver refuses the ready write (nothing queued), the done wait (the write queued) or,
    where the slab queues both in one cuStreamBatchMemOp, the batch (nothing queued, reported as
    the write): the call raises EDEVICE at once, while the stream is held; the error is not
    raised again, no slot is lost, and the next call works. A refused write stores the ready
    word from the host, so its slot is back even before the stream moves."""
    if what != "batch":
        sim.drv.batch_memop = None  # the two calls, one of which fails
    c, mem = sim.connect(daemon)
    s = sim.stream()
    x, w, want = check_first_call(c, mem, s, rng)
    assert c._gates.batched == (what == "batch")
    ev = hold(s)
    before = sim.drv.queued
    sim.drv.fail = what
    try:
        with pytest.raises(convd.Error) as e:
            issue(c, mem, x, w, padding=1)
    finally:
        sim.drv.fail = None
    named = "write" if what == "batch" else what
    assert e.value.code == "EDEVICE" and named in e.value.message, str(e.value)
    assert sim.drv.queued == before + (1 if what == "wait" else 0)
    g = c._gates
    if named == "write":
        c.synchronize()
        assert s.busy()
        assert sorted(g.free) == list(range(g.slots)) and not g.limbo
    ev.set()
    assert s.drained()
    c.synchronize()  # the failure was the call's own
    assert_all_back(c, mem)
    seen = []
    consume(s, issue(c, mem, x, w, padding=1), seen)
    assert s.drained()
    c.synchronize()
    assert len(seen) == 1 and rel_l2(seen[0], want) <= TOL["fp32"]
    c.close()


def test_gate_values_wrap(sim, daemon, rng):
    """The client's 32-bit gate counter wraps from 0xFFFFFFFF to 0 in the middle of 40 calls:
    the daemon waits for each ready word and the stream for each done word all the same (the
    comparisons are cyclic, and each slot's words are set below its new value first)."""
    c, mem = sim.connect(daemon)
    s = sim.stream()
    _, w, _ = check_first_call(c, mem, s, rng)
    start = 0xFFFFFFFF - 16
    with c._lock:
        c._gates.value = start
    ev = hold(s)
    outs, srcs, seen = [], [], []
    for _ in range(40):
        x = mem.array((1, 8, 10, 10))
        src = rng.standard_normal(x.shape).astype(np.float32)
        produce(s, x, src)
        y = issue(c, mem, x, w, padding=1)
        consume(s, y, seen)
        outs.append(y)
        srcs.append(src)
    assert s.busy() and all(np.isnan(y).all() for y in outs)
    ev.set()
    assert s.drained()
    c.synchronize()
    assert c._gates.value == (start + 40) & _MASK32 and c._gates.value < 40  # it wrapped
    assert len(seen) == 40
    for got, src in zip(seen, srcs):
        assert rel_l2(got, reference(src, w, padding=1)) <= TOL["fp32"]
    assert_all_back(c, mem)
    c.close()


def test_fewer_slots_than_calls(sim, rng):
    """A daemon allowing 3 requests in flight: the slab has 3 slots, and 40 calls (each with
    its producer and consumer) wait for slots as the stream frees them, all right."""
    d = sim.daemon("--max-inflight", "3")
    c, mem = sim.connect(d)
    assert c.info["max_inflight"] == 3
    s = sim.stream()
    w = mem.random(rng, (8, 8, 3, 3))
    s.put("sleep", 0.05)  # the stream starts behind the calls, which then wait for it
    srcs, seen = [], []
    for _ in range(40):
        x = mem.array((1, 8, 10, 10))
        src = rng.standard_normal(x.shape).astype(np.float32)
        produce(s, x, src)
        consume(s, issue(c, mem, x, w, padding=1), seen)
        srcs.append(src)
        assert c._gated <= 3
    assert c._gates.slots == 3
    assert s.drained()
    c.synchronize()
    assert len(seen) == 40
    for got, src in zip(seen, srcs):
        assert rel_l2(got, reference(src, w, padding=1)) <= TOL["fp32"]
    assert_all_back(c, mem)
    c.close()


# ---------------------------------------------------------------- failures after sending


@pytest.mark.parametrize("raised_by", ["synchronize", "next call", "future"])
@pytest.mark.parametrize(
    "option, code",
    [(("--max-inflight-per-user", "2"), "ELIMIT"), (("--gate-timeout-ms", "500"), "ETIMEDOUT")],
    ids=["refused", "gate-timeout"],
)
def test_failure_after_sending_releases_the_stream(sim, rng, option, code, raised_by):
    """Three calls behind a hold. Refused: the user's share is 2, so the first two wait for the
    stream and the third is refused. Gate timeout: the daemon gives up on all three while the
    stream is held (their slots then wait for their ready writes before serving again). Either
    way the daemon stores the failed requests' done words, the stream drains with nobody
    calling the client (the client's own thread takes the completions), the failed outputs are
    not written, and the failure comes back as convd.Error with its code once: from
    synchronize() or the next call (which then does nothing else) for conv2d(), from its own
    future only for submit(). The client works on."""
    d = sim.daemon(*option)
    c, mem = sim.connect(d)
    s = sim.stream()
    x, w, want = check_first_call(c, mem, s, rng)
    ev = hold(s)
    outs, futs, seen = [], [], []
    for _ in range(3):
        if raised_by == "future":
            y, f = issue(c, mem, x, w, padding=1, wait=False)
            futs.append(f)
        else:
            y = issue(c, mem, x, w, padding=1)
        consume(s, y, seen)
        outs.append(y)
    assert s.busy() and all(np.isnan(y).all() for y in outs)
    ok = 2 if code == "ELIMIT" else 0
    if code == "ETIMEDOUT":
        assert wait_until(s.waits_met), "the daemon did not store the done words"
        # Their completions taken by the client's thread, their slots must not serve again
        # before the ready writes still queued behind the hold have landed.
        assert wait_until(lambda: c._gated == 0)
        with c._lock:
            assert len(c._gates.limbo) == 3 and len(c._gates.free) == c._gates.slots - 3
    ev.set()
    assert s.drained(), "the stream still waits: a done word was never written"
    assert len(seen) == 3
    for i, got in enumerate(seen):
        if i < ok:
            assert rel_l2(got, want) <= TOL["fp32"]
        else:
            assert np.isnan(got).all(), "a failed request's output was written"
    queued = sim.drv.queued
    if raised_by == "future":
        for i, f in enumerate(futs):
            err = f.exception(timeout=HANG_S)
            if i < ok:
                assert err is None
            else:
                assert isinstance(err, convd.Error) and err.code == code, repr(err)
        c.synchronize()  # a future's failure is its own
    else:
        if raised_by == "next call":
            # The stream drained on the done words, which the daemon stores just before it posts
            # the completions: let those arrive, so that what the next call does is all it does.
            assert wait_until(lambda: c._gated == 0), "the completions never came"
        with pytest.raises(convd.Error) as e:
            if raised_by == "synchronize":
                c.synchronize()
            else:
                issue(c, mem, x, w, padding=1)
        assert e.value.code == code, str(e.value)
        assert "issued earlier" in e.value.message
        assert sim.drv.queued == queued and c._gated == 0  # the raising call did nothing else
        c.synchronize()  # raised once
    seen = []
    consume(s, issue(c, mem, x, w, padding=1), seen)
    assert s.drained()
    c.synchronize()
    assert len(seen) == 1 and rel_l2(seen[0], want) <= TOL["fp32"]
    assert_all_back(c, mem)
    c.close()


def test_daemon_killed_releases_the_stream(sim, rng):
    """The daemon dies with four requests waiting for the held stream: the library stores their
    done words once the client's own thread finds the connection gone, so the stream drains
    with nobody calling the client; nothing was written; synchronize() raises ECLOSED, as does
    the next call, which queues nothing; close() still unregisters the gate words."""
    d = sim.daemon()
    c, mem = sim.connect(d)
    s = sim.stream()
    x, w, _ = check_first_call(c, mem, s, rng)
    ev = hold(s)
    seen = []
    for _ in range(4):
        consume(s, issue(c, mem, x, w, padding=1), seen)
    assert c._gated == 4
    sim.kill(d)
    ev.set()
    assert s.drained(), "the stream still waits: a done word was never written"
    assert len(seen) == 4 and all(np.isnan(got).all() for got in seen)
    with pytest.raises(convd.Error) as e:
        c.synchronize()
    assert e.value.code == "ECLOSED", str(e.value)
    queued = sim.drv.queued
    with pytest.raises(convd.Error) as e:
        issue(c, mem, x, w, padding=1)
    assert e.value.code == "ECLOSED", str(e.value)
    assert sim.drv.queued == queued
    c.close()
    assert not sim.drv.registered and not sim.drv.unregistered_busy
