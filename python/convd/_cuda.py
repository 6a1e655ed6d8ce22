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

Stream ordering (docs/python.md, "GPU tensors"): before a request is sent, the caller's current
stream is synchronised, so the daemon reads the input only after the work queued on it has
finished; the output is complete when the call returns (or the future resolves), so work queued
on that stream afterwards sees it.
"""

from __future__ import annotations

import ctypes
import os
import sys
import warnings
from ctypes import POINTER, byref, c_int, c_uint, c_uint64, c_void_p

from convd._errors import Error, PerformanceWarning

_ATTR_BUFFER_ID = 7
_ATTR_DEVICE_ORDINAL = 9
_ATTR_IS_LEGACY_IPC_CAPABLE = 10
_ATTR_RANGE_START_ADDR = 11
_ATTR_RANGE_SIZE = 12
_ELIMIT = -14
_DEV_ATTR_MPS_ENABLED = 133  # CU_DEVICE_ATTRIBUTE_MPS_ENABLED


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
        self.pop = getattr(lib, "cuCtxPopCurrent_v2", None) or lib.cuCtxPopCurrent
        self.pop.argtypes = [POINTER(c_void_p)]
        lib.cuGetErrorString.argtypes = [c_int, POINTER(ctypes.c_char_p)]
        lib.cuDeviceGet.argtypes = [POINTER(c_int), c_int]
        lib.cuDeviceGet.restype = c_int
        lib.cuDeviceGetAttribute.argtypes = [POINTER(c_int), c_int, c_int]
        lib.cuDeviceGetAttribute.restype = c_int
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
        if ptr + nbytes > seg.base + seg.size:
            raise Error(
                "EBOUNDS",
                f"{nbytes} bytes at {ptr:#x} run past the end of their CUDA allocation "
                f"({seg.base:#x}, {seg.size} bytes)",
            )
        self.clock += 1
        seg.used = self.clock
        return seg, ptr - seg.base

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
