"""CUDA tensors by IPC handle, without copies.

A tensor's memory is part of one CUDA allocation: with PyTorch's caching allocator, a segment
that holds many tensors' blocks. The daemon opens an allocation by its legacy IPC handle, which
always names the allocation's base, so a tensor is registered as (the handle of its allocation,
the allocation's extent) once, and each call names it by its offset from the base.

Registrations are cached per allocation, keyed by the driver's buffer id
(CU_POINTER_ATTRIBUTE_BUFFER_ID), which is unique for the life of the process: an allocation
freed and another made at the same address never share an id, so a cached registration can never
be used for memory it does not describe. When PyTorch frees an allocation (torch.cuda.empty_cache,
or the allocator's own release before an out-of-memory retry), its registration goes the next
time the client registers another allocation or reaches the daemon's region limit, and at
close(): each cached allocation's id is looked up again and the stale ones are unregistered.

The driver API (libcuda.so.1) is reached through ctypes, as the library is through ctypes: no
compiled code, and no dependence on which CUDA runtime PyTorch was built with.

Stream ordering (docs/python.md, "Stream ordering"). With a daemon of protocol 3, a request is
ordered on the caller's current stream without the CPU waiting: the client takes a slot of its
gate slab (GateSlab: one host region the daemon maps, registered with the driver by
cuMemHostRegister so that streams can reach it), queues cuStreamWriteValue32(ready word, value)
on the stream, sends the request with a gate naming both words, and queues
cuStreamWaitValue32(done word, value, GEQ) behind it; the daemon starts the request once the ready
word holds the value and stores the value into the done word when the request has finished. Work
queued on the stream before the call (the producer of the input) is done before the daemon reads,
and work queued after it (the consumer of the output) runs after the daemon wrote. Before
protocol 3, or with stream ordering turned off, the caller's current stream is synchronised before
the request is sent and the call waits for the completion.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import warnings
from ctypes import POINTER, byref, c_int, c_size_t, c_uint, c_uint32, c_uint64, c_void_p

from convd._errors import Error, PerformanceWarning
from convd._memory import create_region, free_region

_ATTR_BUFFER_ID = 7
_ATTR_DEVICE_ORDINAL = 9
_ATTR_IS_LEGACY_IPC_CAPABLE = 10
_ATTR_RANGE_START_ADDR = 11
_ATTR_RANGE_SIZE = 12
_ELIMIT = -14
_DEV_ATTR_MPS_ENABLED = 133  # CU_DEVICE_ATTRIBUTE_MPS_ENABLED
_HOSTREGISTER_PORTABLE = 1  # CU_MEMHOSTREGISTER_PORTABLE: pinned for every context
_HOSTREGISTER_DEVICEMAP = 2  # CU_MEMHOSTREGISTER_DEVICEMAP: mapped into the devices' space
_WRITE_VALUE_DEFAULT = 0  # CU_STREAM_WRITE_VALUE_DEFAULT: a fence orders the stream's writes first
_WAIT_VALUE_GEQ = 0  # CU_STREAM_WAIT_VALUE_GEQ: (int32_t)(*addr - value) >= 0
# cuStreamBatchMemOp's CUstreamBatchMemOpParams: a 48-byte union whose write and wait members are
# (operation u32, address u64 at 8, value at 16, flags u32 at 24, alias u64 at 32); as 64-bit
# words, one operation is 6 of them: operation, address, value, flags, alias, padding.
_MEMOP_WORDS = 6
_MEMOP_WAIT_VALUE_32 = 1  # CU_STREAM_MEM_OP_WAIT_VALUE_32
_MEMOP_WRITE_VALUE_32 = 2  # CU_STREAM_MEM_OP_WRITE_VALUE_32
_MASK32 = 0xFFFFFFFF
_CTX_SCHED_MASK = 7  # CU_CTX_SCHED_MASK: 0 is AUTO, spin below as many contexts as CPUs
_CTX_SCHED_BLOCKING_SYNC = 4  # CU_CTX_SCHED_BLOCKING_SYNC


_NOT_MPS = (
    "this process is not an MPS client (no NVIDIA MPS control daemon serves it), so the GPU "
    "switches between this process's CUDA context and the daemon's at every convolution: "
    "about 0.6 ms each on an H100 (docs/benchmarks.md, 'Whole models'). Run the daemon and "
    "this process under one MPS, as one user (docs/operations.md, 'Clients that use the GPU "
    "too')."
)


class _Driver:
    def __init__(self):
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise Error("EUNSUPPORTED", f"cannot load the CUDA driver (libcuda.so.1): {e}")
        self.lib = lib
        lib.cuPointerGetAttributes.argtypes = [c_uint, POINTER(c_int), POINTER(c_void_p), c_uint64]
        lib.cuPointerGetAttributes.restype = c_int
        lib.cuIpcGetMemHandle.argtypes = [c_void_p, c_uint64]
        lib.cuIpcGetMemHandle.restype = c_int
        lib.cuCtxGetCurrent.argtypes = [POINTER(c_void_p)]
        lib.cuCtxGetCurrent.restype = c_int
        lib.cuCtxGetDevice.argtypes = [POINTER(c_int)]
        lib.cuCtxGetDevice.restype = c_int
        lib.cuDevicePrimaryCtxRetain.argtypes = [POINTER(c_void_p), c_int]
        lib.cuDevicePrimaryCtxRetain.restype = c_int
        self.release = getattr(lib, "cuDevicePrimaryCtxRelease_v2", None) or getattr(
            lib, "cuDevicePrimaryCtxRelease"
        )
        self.release.argtypes = [c_int]
        self.push = getattr(lib, "cuCtxPushCurrent_v2", None) or lib.cuCtxPushCurrent
        self.push.argtypes = [c_void_p]
        self.push.restype = c_int
        self.pop = getattr(lib, "cuCtxPopCurrent_v2", None) or lib.cuCtxPopCurrent
        self.pop.argtypes = [POINTER(c_void_p)]
        self.pop.restype = c_int
        lib.cuGetErrorString.argtypes = [c_int, POINTER(ctypes.c_char_p)]
        lib.cuDeviceGet.argtypes = [POINTER(c_int), c_int]
        lib.cuDeviceGet.restype = c_int
        lib.cuDeviceGetAttribute.argtypes = [POINTER(c_int), c_int, c_int]
        lib.cuDeviceGetAttribute.restype = c_int
        # Stream ordering (GateSlab): optional, so that a driver without them still serves the
        # synchronous path. CUDA 12 and 13 export the current versions under their _v2 names.
        self.host_register = _sym(lib, "cuMemHostRegister_v2", "cuMemHostRegister")
        self.host_unregister = _sym(lib, "cuMemHostUnregister")
        self.host_dptr = _sym(lib, "cuMemHostGetDevicePointer_v2", "cuMemHostGetDevicePointer")
        self.write_value = _sym(lib, "cuStreamWriteValue32_v2", "cuStreamWriteValue32")
        # How the host waits for the GPU (block_waits): CUDA 12.1 and later.
        self.ctx_get_flags = _sym(lib, "cuCtxGetFlags")
        self.ctx_set_flags = _sym(lib, "cuCtxSetFlags")
        self.wait_value = _sym(lib, "cuStreamWaitValue32_v2", "cuStreamWaitValue32")
        # Both of a request's stream operations in one driver call (GateSlab.order): 1.8-2 us
        # against 4.2-4.8 for the two calls (H100, bench/gpu/NOTES.md round 27).
        self.batch_memop = _sym(lib, "cuStreamBatchMemOp_v2", "cuStreamBatchMemOp")
        # Per thread: the context query's out-parameter and a batch of two operations, reused
        # by every call (order() runs outside the client's lock).
        self.tls = threading.local()
        for fn, argtypes in (
            (self.host_register, [c_void_p, c_size_t, c_uint]),
            (self.host_unregister, [c_void_p]),
            (self.host_dptr, [POINTER(c_uint64), c_void_p, c_uint]),
            (self.write_value, [c_void_p, c_uint64, c_uint32, c_uint]),
            (self.wait_value, [c_void_p, c_uint64, c_uint32, c_uint]),
            (self.batch_memop, [c_void_p, c_uint, c_void_p, c_uint]),
            (self.ctx_get_flags, [POINTER(c_uint)]),
            (self.ctx_set_flags, [c_uint]),
        ):
            if fn is not None:
                fn.argtypes = argtypes
                fn.restype = c_int
        # The attribute query, built once: buffer id, device, IPC capability, start, size.
        self.bid = c_uint64()
        self.ordinal = c_int()
        self.ipc_ok = c_int()
        self.start = c_uint64()
        self.size = c_uint64()
        self.attrs = (c_int * 5)(
            _ATTR_BUFFER_ID,
            _ATTR_DEVICE_ORDINAL,
            _ATTR_IS_LEGACY_IPC_CAPABLE,
            _ATTR_RANGE_START_ADDR,
            _ATTR_RANGE_SIZE,
        )
        self.data = (c_void_p * 5)(
            *(
                ctypes.addressof(v)
                for v in (self.bid, self.ordinal, self.ipc_ok, self.start, self.size)
            )
        )

    def errstr(self, rc: int) -> str:
        s = ctypes.c_char_p()
        if self.lib.cuGetErrorString(rc, byref(s)) == 0 and s.value:
            return f"{s.value.decode()} (CUDA driver error {rc})"
        return f"CUDA driver error {rc}"

    def query(self, ptr: int):
        """(buffer id, device, legacy-IPC capable, base, size) of the allocation holding ptr."""
        rc = self.lib.cuPointerGetAttributes(5, self.attrs, self.data, ptr)
        if rc != 0:
            raise Error("EINVAL", f"the CUDA driver does not know pointer {ptr:#x}: {self.errstr(rc)}")
        return self.bid.value, self.ordinal.value, self.ipc_ok.value, self.start.value, self.size.value

    def mps_enabled(self, device: int):
        """Whether this process's contexts on the device are MPS clients; None when the driver
        cannot say (older than the attribute)."""
        dev, v = c_int(), c_int()
        if self.lib.cuDeviceGet(byref(dev), device) != 0:
            return None
        if self.lib.cuDeviceGetAttribute(byref(v), _DEV_ATTR_MPS_ENABLED, dev) != 0:
            return None
        return bool(v.value)

    def buffer_id(self, ptr: int):
        """The buffer id at ptr now, or None when nothing is allocated there."""
        one = (c_int * 1)(_ATTR_BUFFER_ID)
        v = c_uint64()
        data = (c_void_p * 1)(ctypes.addressof(v))
        if self.lib.cuPointerGetAttributes(1, one, data, ptr) != 0:
            return None
        return v.value or None

    def ipc_handle(self, base: int, device: int) -> bytes:
        """cuIpcGetMemHandle for the allocation at base, with the device's primary context
        current (a thread that never touched CUDA has none, and another may have another
        device's)."""
        cur = c_void_p()
        self.lib.cuCtxGetCurrent(byref(cur))
        cur_dev = c_int(-1)
        if cur.value:
            self.lib.cuCtxGetDevice(byref(cur_dev))
        pushed = False
        if not cur.value or cur_dev.value != device:
            ctx = c_void_p()
            rc = self.lib.cuDevicePrimaryCtxRetain(byref(ctx), device)
            if rc != 0:
                raise Error("EDEVICE", f"cannot retain device {device}'s context: {self.errstr(rc)}")
            self.push(ctx)
            pushed = True
        try:
            h = ctypes.create_string_buffer(64)
            rc = self.lib.cuIpcGetMemHandle(h, base)
            if rc != 0:
                raise Error(
                    "EUNSUPPORTED",
                    f"cannot export the CUDA allocation at {base:#x} by IPC handle: "
                    f"{self.errstr(rc)}",
                )
            return h.raw
        finally:
            if pushed:
                out = c_void_p()
                self.pop(byref(out))
                self.release(device)


    def primary_context(self, device: int) -> int:
        """Retains the device's primary context (the one PyTorch's runtime uses) and returns
        it; the caller releases it with self.release(device)."""
        ctx = c_void_p()
        rc = self.lib.cuDevicePrimaryCtxRetain(byref(ctx), device)
        if rc != 0:
            raise Error("EDEVICE", f"cannot retain device {device}'s context: {self.errstr(rc)}")
        return ctx.value

    def block_waits(self, device: int):
        """Makes the device's primary context (PyTorch's) block in the host's waits for the GPU
        (torch.cuda.synchronize() and the like) instead of spinning, unless the process chose
        how it waits: True when set here, False when the process had chosen (spin, yield or
        block), None when the driver cannot (no cuCtxSetFlags: CUDA before 12.1)."""
        if self.ctx_get_flags is None or self.ctx_set_flags is None:
            return None
        try:
            ctx = self.primary_context(device)
        except Error:
            return None  # a hint, not worth failing the convolution for
        try:
            try:
                pushed = self.enter(ctx)
            except Error:
                return None
            try:
                flags = c_uint()
                if self.ctx_get_flags(byref(flags)) != 0:
                    return None
                if flags.value & _CTX_SCHED_MASK != 0:
                    return False
                rc = self.ctx_set_flags((flags.value & ~_CTX_SCHED_MASK) | _CTX_SCHED_BLOCKING_SYNC)
                return True if rc == 0 else None
            finally:
                if pushed:
                    self.leave()
        finally:
            self.release(device)

    def enter(self, ctx: int) -> bool:
        """Makes ctx current on this thread unless it is; True when it was pushed (pop it with
        leave()). Stream 0 means the current context's default stream, and a thread that never
        touched CUDA has no context at all."""
        cur = self._thread().cur
        self.lib.cuCtxGetCurrent(byref(cur))
        if cur.value == ctx:
            return False
        rc = self.push(ctx)
        if rc != 0:
            raise Error("EDEVICE", f"cannot make a CUDA context current: {self.errstr(rc)}")
        return True

    def _thread(self):
        """This thread's reusable out-parameter and operation batch."""
        t = self.tls
        if not hasattr(t, "cur"):
            t.cur = c_void_p()
            t.ops = (c_uint64 * (2 * _MEMOP_WORDS))()
            t.ops[0] = _MEMOP_WRITE_VALUE_32
            t.ops[_MEMOP_WORDS] = _MEMOP_WAIT_VALUE_32  # flags 0 both: a fence; GEQ
        return t

    def write_and_wait(self, stream: int, ready: int, done: int, value: int) -> int:
        """Queues the write of value at ready and the wait for done >= value (cyclically) on
        the stream, in one cuStreamBatchMemOp; the driver's result."""
        ops = self._thread().ops
        ops[1] = ready
        ops[2] = value
        ops[_MEMOP_WORDS + 1] = done
        ops[_MEMOP_WORDS + 2] = value
        return self.batch_memop(stream, 2, ops, 0)

    def leave(self) -> None:
        out = c_void_p()
        self.pop(byref(out))

    def has_stream_ops(self) -> bool:
        return None not in (
            self.host_register,
            self.host_unregister,
            self.host_dptr,
            self.write_value,
            self.wait_value,
        )


def _sym(lib, *names):
    """The first of the names the library exports, or None."""
    for name in names:
        fn = getattr(lib, name, None)
        if fn is not None:
            return fn
    return None


_driver: _Driver | None = None


def driver() -> _Driver:
    global _driver
    if _driver is None:
        _driver = _Driver()
    return _driver


class Segment:
    """One registered allocation."""

    __slots__ = ("bid", "base", "size", "device", "region", "inflight", "used")

    def __init__(self, bid, base, size, device, region):
        self.bid = bid
        self.base = base
        self.size = size
        self.device = device
        self.region = region
        self.inflight = 0
        self.used = 0


def _outside_level() -> int:
    """warnings.warn's stacklevel for the first caller outside this package."""
    pkg = os.path.dirname(os.path.abspath(__file__))
    f, level = sys._getframe(1), 1
    while f is not None and os.path.abspath(f.f_code.co_filename).startswith(pkg + os.sep):
        f, level = f.f_back, level + 1
    return level


class CudaRegions:
    """The client's registrations of CUDA allocations. Used under the client's lock."""

    def __init__(self, client):
        self.client = client
        self.drv = driver()
        self.by_bid: dict[int, Segment] = {}
        self.clock = 0
        self.mps_checked: set[int] = set()
        # device -> Driver.block_waits' answer, for the devices whose tensors this client used
        self.waits_blocked: dict[int, bool | None] = {}

    def locate(self, ptr: int, nbytes: int) -> tuple[Segment, int]:
        """The registered allocation that holds [ptr, ptr + nbytes), registering it if needed,
        and the offset of ptr in it."""
        bid, dev, ipc_ok, base, size = self.drv.query(ptr)
        seg = self.by_bid.get(bid)
        if seg is None or seg.base != base or seg.size != size:
            if not ipc_ok:
                raise Error(
                    "EUNSUPPORTED",
                    "this CUDA tensor's memory cannot be shared by legacy IPC handle (PyTorch's "
                    "expandable_segments or cudaMallocAsync allocator, or memory not from "
                    "cudaMalloc): unset PYTORCH_CUDA_ALLOC_CONF's expandable_segments / "
                    "backend:cudaMallocAsync for the tensors given to convd",
                )
            seg = self._register(bid, dev, base, size)
            if dev not in self.mps_checked:
                self.mps_checked.add(dev)
                if self.drv.mps_enabled(dev) is False:
                    warnings.warn(_NOT_MPS, PerformanceWarning, stacklevel=_outside_level())
                if self.client._cuda_wait == "block":
                    self.waits_blocked[dev] = self.drv.block_waits(dev)
        if ptr + nbytes > seg.base + seg.size:
            raise Error(
                "EBOUNDS",
                f"{nbytes} bytes at {ptr:#x} run past the end of their CUDA allocation "
                f"({seg.base:#x}, {seg.size} bytes)",
            )
        self._use(seg)
        return seg, ptr - seg.base

    def kept(self, seg: Segment) -> bool:
        """Whether a registration held from an earlier locate() is still the one registered
        (eviction may have dropped it), marked used now if so."""
        if self.by_bid.get(seg.bid) is not seg:
            return False
        self._use(seg)
        return True

    def _use(self, seg: Segment) -> None:
        """Marks seg used now: _evict drops the least recently used first."""
        self.clock += 1
        seg.used = self.clock

    def _register(self, bid, dev, base, size) -> Segment:
        # A new allocation is when old ones may have been freed: drop registrations of those.
        self.drop_stale()
        handle = self.drv.ipc_handle(base, dev)
        lib = self.client._lib
        for attempt in range(2):
            r = c_void_p()
            rc = lib.convd_region_import_gpu(self.client._h, handle, 64, 0, size, byref(r))
            if rc == 0:
                seg = Segment(bid, base, size, dev, r.value)
                self.by_bid[bid] = seg
                return seg
            if rc != _ELIMIT or attempt == 1 or not self._evict():
                raise self.client._error(rc)
        raise AssertionError("unreachable")

    def _evict(self) -> bool:
        """Unregisters the least recently used half of the idle allocations; False if none."""
        idle = sorted((s for s in self.by_bid.values() if s.inflight == 0), key=lambda s: s.used)
        for s in idle[: max(1, len(idle) // 2)]:
            self._unregister(s)
        return bool(idle)

    def _unregister(self, s: Segment) -> None:
        self.by_bid.pop(s.bid, None)
        if self.client._h is not None:
            self.client._lib.convd_region_free(s.region)

    def drop_stale(self) -> None:
        """Unregisters allocations that have been freed since they were registered."""
        for s in list(self.by_bid.values()):
            if s.inflight == 0 and self.drv.buffer_id(s.base) != s.bid:
                self._unregister(s)

    def drop_all(self) -> None:
        for s in list(self.by_bid.values()):
            self._unregister(s)

    def __len__(self):
        return len(self.by_bid)


# Slots of a gate slab: one per stream-ordered request in flight, at most this many.
MAX_GATE_SLOTS = 1024


def _geq(a: int, b: int) -> bool:
    """(int32_t)(a - b) >= 0: the cyclic comparison of cuStreamWaitValue32's GEQ, and the
    daemon's."""
    return ((a - b) & _MASK32) < 0x80000000


class GateSlab:
    """The client's gate words, for stream-ordered requests: one host region (memfd, mapped by
    the daemon too), registered with the CUDA driver (cuMemHostRegister, PORTABLE | DEVICEMAP)
    once, at the first use on a device, so that streams of every context can write and wait on
    its words. Slot i is a ready word at 8*i and a done word at 8*i + 4; one more pair after the
    last slot, never named by a request, lets the first use on a device try the driver's stream
    memory operations on the caller's stream before any request depends on them.

    Values come from a counter of the client (wrapping: every comparison is cyclic). A slot goes
    back to the free list once its request's completion has been taken (the done word then holds
    the value: the daemon, or the library for a failure, stored it before the completion was
    handed out) and its ready word holds the value too: a request refused before its stream
    reached the ready write still has that write queued, and the word must not be written late,
    behind a newer request's value, when the slot serves another stream. take() sets both words
    below the new value from the host, so that a value left from long ago can never read as
    "already there".

    Used under the client's lock, except order() (the stream operations of one request)."""

    def __init__(self, client, slots: int):
        self.client = client
        self.drv = driver()
        if not self.drv.has_stream_ops():
            raise Error(
                "EUNSUPPORTED",
                "the CUDA driver has no stream memory operations (cuStreamWriteValue32_v2, "
                "cuStreamWaitValue32_v2) or host registration (cuMemHostRegister_v2, "
                "cuMemHostGetDevicePointer_v2), which stream ordering needs",
            )
        self.slots = slots
        size = ((slots + 1) * 8 + 4095) // 4096 * 4096
        self.region = create_region(client, size)
        self.handle = self.region.handle
        self.words = (c_uint32 * (size // 4)).from_address(self.region.addr)
        self.free = list(range(slots - 1, -1, -1))  # a stack: slot 0 first
        self.limbo: list[tuple[int, int]] = []  # (slot, value) done, ready write maybe queued
        self.value = 0
        self.ctx: dict[int, int] = {}  # device -> its primary context, retained
        self.dptr: dict[int, int] = {}  # device -> the region's address there
        self.registered = False
        self.host_registrations = 0  # cuMemHostRegister calls: one per slab
        self.batched = False  # order() queues both operations in one call (attach tried it)

    # ------------------------------------------------------------ devices

    def attach(self, device: int, stream: int) -> None:
        """First use on a device: registers the region with the driver (once per slab), takes
        its device address, and tries a write and a wait on the spare words on the caller's
        stream. Raises Error (EUNSUPPORTED when the driver refuses)."""
        drv = self.drv
        ctx = drv.primary_context(device)
        pushed = False
        registered_here = False
        try:
            pushed = drv.enter(ctx)
            if not self.registered:
                rc = drv.host_register(
                    self.region.addr,
                    self.region.size,
                    _HOSTREGISTER_PORTABLE | _HOSTREGISTER_DEVICEMAP,
                )
                if rc != 0:
                    raise Error(
                        "EUNSUPPORTED",
                        "cannot register the gate words with the CUDA driver "
                        f"(cuMemHostRegister): {drv.errstr(rc)}",
                    )
                self.registered = registered_here = True
                self.host_registrations += 1
            d = c_uint64()
            rc = drv.host_dptr(byref(d), self.region.addr, 0)
            if rc != 0:
                raise Error(
                    "EUNSUPPORTED",
                    f"cannot map the gate words into device {device} "
                    f"(cuMemHostGetDevicePointer): {drv.errstr(rc)}",
                )
            spare = d.value + 8 * self.slots  # both words stay 0: the write and wait are no-ops
            rc = drv.write_value(stream, spare, 0, _WRITE_VALUE_DEFAULT)
            if rc == 0:
                rc = drv.wait_value(stream, spare + 4, 0, _WAIT_VALUE_GEQ)
            if rc == 0 and drv.batch_memop is not None and not self.dptr:
                # The first device decides: a driver that refuses the batch keeps two calls.
                self.batched = drv.write_and_wait(stream, spare, spare + 4, 0) == 0
            if rc != 0:
                raise Error(
                    "EUNSUPPORTED",
                    f"the CUDA driver refuses stream memory operations on device {device}: "
                    f"{drv.errstr(rc)}",
                )
        except BaseException:
            if registered_here:
                drv.host_unregister(self.region.addr)
                self.registered = False
            if pushed:
                drv.leave()
            drv.release(device)
            raise
        if pushed:
            drv.leave()
        self.ctx[device] = ctx
        self.dptr[device] = d.value

    def order(self, device: int, stream: int, slot: int, value: int):
        """Queues on the stream the write of the slot's ready word and the wait for its done
        word. Returns None, or (what failed, the driver's sentence): "write" (nothing was
        queued) or "wait" (the write was)."""
        drv = self.drv
        addr = self.dptr[device] + 8 * slot
        pushed = drv.enter(self.ctx[device])
        try:
            if self.batched:
                # One call. A failure is taken as nothing queued: the caller then stores the ready
                # value from the host, which is harmless if the write was queued after all.
                rc = drv.write_and_wait(stream, addr, addr + 4, value)
                return None if rc == 0 else ("write", drv.errstr(rc))
            rc = drv.write_value(stream, addr, value, _WRITE_VALUE_DEFAULT)
            if rc != 0:
                return "write", drv.errstr(rc)
            rc = drv.wait_value(stream, addr + 4, value, _WAIT_VALUE_GEQ)
            if rc != 0:
                return "wait", drv.errstr(rc)
            return None
        finally:
            if pushed:
                drv.leave()

    # ------------------------------------------------------------ slots

    def take(self):
        """(slot, value) for a new request, or None when every slot is in use."""
        if not self.free and not self.sweep():
            return None
        s = self.free.pop()
        v = self.value = (self.value + 1) & _MASK32
        below = (v - 1) & _MASK32
        w = self.words
        w[2 * s] = below  # not ready
        w[2 * s + 1] = below  # not done; still >= every older value a stream may wait for
        return s, v

    def give(self, slot: int, value: int) -> None:
        """The request's completion was taken: the slot is free once its ready word was
        written."""
        if _geq(self.words[2 * slot], value):
            self.free.append(slot)
        else:
            self.limbo.append((slot, value))

    def unused(self, slot: int) -> None:
        """The request was not submitted, and nothing was queued on a stream for it."""
        self.free.append(slot)

    def sweep(self) -> bool:
        """Frees the slots whose queued ready writes have landed; True if any slot is free."""
        w = self.words
        waiting = []
        for s, v in self.limbo:
            if _geq(w[2 * s], v):
                self.free.append(s)
            else:
                waiting.append((s, v))
        self.limbo = waiting
        return bool(self.free)

    def release(self, slot: int, value: int) -> None:
        """Stores the value into the slot's done word from the host, for a request whose
        completion will not be taken (the client is closing): a stream waiting for it goes on."""
        self.words[2 * slot + 1] = value

    def close(self) -> None:
        """Waits for the devices that used the slab (no stream may still wait on its words),
        unregisters it from the driver and frees the region. Under the client's lock, with the
        connection still open; every done word a stream waits for must have been stored."""
        torch = sys.modules.get("torch")
        if torch is not None:
            for device in self.ctx:
                try:
                    torch.cuda.synchronize(device)
                except Exception:
                    pass
        drv = self.drv
        if self.registered and self.ctx:
            device, ctx = next(iter(self.ctx.items()))
            try:
                pushed = drv.enter(ctx)
                drv.host_unregister(self.region.addr)
                if pushed:
                    drv.leave()
            except Exception:
                pass
        self.registered = False
        for device in self.ctx:
            drv.release(device)
        self.ctx.clear()
        self.dptr.clear()
        free_region(self.client, self.region)
