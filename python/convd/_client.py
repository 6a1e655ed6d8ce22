"""The client: connect, conv2d / submit / conv2d_async, empty, status, metrics, close.

How a call travels (docs/python.md has the user's view):
- host tensors (numpy, torch on the CPU), nothing in a region: convd_conv() of the C library,
  which copies the tensors into a staging region it keeps and the output back out; one foreign
  call per convolution, so the package adds only its argument handling to the C client's cost.
- host tensors of which some lie in a region (Client.empty() arrays, weights held by
  convd.torch.Conv2d): those are named in place, the others copied into a staging slab, and the
  request submitted; the output is copied from the slab when it completes.
- CUDA tensors: named in place through their allocation's registration (_cuda.py), after the
  caller's current stream is synchronised.
- submit() is the same with the wait left to the returned Future.

A Client may be shared by threads: every call into the library holds the client's lock, and a
waiting Future gives the lock up every few milliseconds. Completions are taken from the library
by whichever thread waits, and handed to the request they answer.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
import threading
import time
import weakref
from ctypes import byref, c_uint64, c_void_p

import numpy as np

from convd import _lib
from convd._args import NP_DTYPE, activation_spec, dtype_code, make_plan, np_code
from convd._errors import Error, invalid
from convd._memory import Arena, EmptyRegions, Slabs, create_region, free_region, region_array

_ETIMEDOUT = -15
_ECLOSED = -20
_EAGAIN = -21
_ELIMIT = -14
# A waiting Future holds the client's lock at most this long before letting other threads in.
_WAIT_SLICE_MS = 10
_MAX_PLANS = 1024
_args_checked = False

_NHWC_WORDS = {"nhwc": True, "channels_last": True, "nchw": False, "contiguous": False}


def _torch():
    return sys.modules.get("torch")


def _is_tensor(x) -> bool:
    t = sys.modules.get("torch")
    return t is not None and isinstance(x, t.Tensor)


class Held:
    """A weight (and its bias) copied once into the client's arena, in the layout and dtype the
    calls use, for convd.torch.Conv2d on the CPU. shape is (K, C/G, R, S)."""

    __slots__ = ("block", "shape", "dtype", "nhwc", "w_bytes", "b_off", "b_bytes", "client")

    def release(self):
        c = self.client
        if c is not None and self.block is not None:
            c._arena_free(self.block)
        self.block = None


class _Request:
    __slots__ = (
        "client",
        "id",
        "done",
        "result",
        "error",
        "event",
        "out",
        "out_ret",
        "slab",
        "o_off",
        "o_bytes",
        "keep",
        "segments",
        "waiters",
        "callbacks",
        "info",
    )

    def __init__(self, client):
        self.client = client
        self.done = False
        self.result = None
        self.error = None
        self.event = None
        self.slab = None
        self.keep = None
        self.segments = None
        self.waiters = None
        self.callbacks = None
        self.info = None


class Future:
    """The pending result of Client.submit(). result(timeout=None) waits for it (raising
    convd.Error when the request failed, TimeoutError when the timeout passes first); done()
    says whether it has completed, without blocking; ``await future`` waits in asyncio. The
    completion's timings (queue_us, exec_us, batch_size) are in ``info`` once done."""

    __slots__ = ("_req",)

    def __init__(self, req: _Request):
        self._req = req

    def done(self) -> bool:
        r = self._req
        if not r.done:
            r.client._progress()
        return r.done

    def result(self, timeout: float | None = None):
        r = self._req
        if not r.done:
            r.client._wait_request(r, timeout)
        if r.error is not None:
            raise r.error
        return r.result

    def exception(self, timeout: float | None = None):
        r = self._req
        if not r.done:
            r.client._wait_request(r, timeout)
        return r.error

    def add_done_callback(self, fn) -> None:
        """Calls fn(future) once the request completes (at once if it has), on the thread that
        takes the completion."""
        r = self._req
        c = r.client
        with c._lock:
            if not r.done:
                if r.callbacks is None:
                    r.callbacks = []
                r.callbacks.append((fn, self))
                return
        fn(self)

    @property
    def info(self):
        return self._req.info

    def __await__(self):
        return self._req.client._await_request(self._req).__await__()


class Client:
    """A connection to the convd daemon. See convd.connect()."""

    def __init__(
        self,
        socket: str | os.PathLike | None = None,
        *,
        timeout_ms: int = 0,
        client_name: str | None = None,
        use_rings: int = -1,
        spin_us: int = -1,
    ):
        self._h = None
        self._closed = True
        lib = _lib.load()
        self._lib = lib
        opts = _lib.ConnectOptions()
        opts.struct_size = ctypes.sizeof(opts)
        path = os.fspath(socket) if socket is not None else None
        opts.socket_path = path.encode() if path is not None else None
        name = client_name if client_name is not None else _default_name()
        opts.client_name = name.encode()
        opts.timeout_ms = int(timeout_ms)
        opts.use_rings = int(use_rings)
        opts.spin_us = int(spin_us)
        opts.device = -1
        h = c_void_p()
        rc = lib.convd_connect(byref(opts), byref(h))
        if rc != 0:
            raise Error(rc, lib.convd_last_connect_error().decode(errors="replace"))
        self._h = h.value
        self._closed = False
        self._lock = threading.RLock()
        self._plans: dict = {}
        self._pending: dict[int, _Request] = {}
        self._slabs = Slabs(self)
        self._arena = None
        self._empties = EmptyRegions()
        self._dead: list = []  # regions of empty() arrays that died, freed at the next call
        self._cuda = None
        self._watching: dict = {}  # asyncio loop -> number of requests it awaits
        self._comp = _lib.Completion()
        self._comp_ref = byref(self._comp)
        self._idv = c_uint64()
        self._idv_ref = byref(self._idv)
        try:
            f = _lib.FillCheck(_lib.ServerInfo)
            lib.convd_server_info(self._h, f.ptr)
            info = f.check("convd_server_info")
            self._info = {
                "protocol_version": info.protocol_version,
                "server_version": info.server_version.decode(errors="replace"),
                "backend": info.backend.decode(errors="replace"),
                "device": info.device.decode(errors="replace"),
                "max_inflight": info.max_inflight,
                "max_regions": info.max_regions,
                "max_mapped_bytes": info.max_mapped_bytes,
                "max_batch": info.max_batch,
            }
            if self._info["backend"] not in ("cpu", "gpu", "null"):
                raise _lib.LibraryError(
                    f"struct convd_server_info read back a backend of {info.backend!r}: the "
                    "package and the library disagree on its layout"
                )
            self._max_inflight = info.max_inflight or (1 << 30)
            self._check_args_struct()
        except BaseException:
            lib.convd_close(self._h)
            self._h = None
            self._closed = True
            raise

    # ------------------------------------------------------------------ basics

    def _check_args_struct(self) -> None:
        """Checks struct convd_conv_args against the library, once per process, without a round
        trip (both probes fail in the library before anything is sent):
        - at this package's struct_size, a priority of 99 is refused for its priority, so the
          library reads priority where the mirror puts it;
        - at 8 bytes more, with those bytes set, the request is refused as using a field the
          library does not know (CONVD_EUNSUPPORTED), so the library's struct is not longer
          than the mirror."""
        global _args_checked
        if _args_checked:
            return
        size = ctypes.sizeof(_lib.ConvArgs)
        buf = (ctypes.c_char * (size + 8))()
        a = _lib.ConvArgs.from_buffer(buf)
        a.struct_size = size
        a.priority = 99
        rc = self._lib.convd_conv_submit(self._h, byref(a), self._idv_ref)
        msg = self._errstr()
        if rc != -1 or "priority" not in msg:
            raise _lib.LibraryError(
                f"{_lib.path()} does not read struct convd_conv_args as this package declares "
                f"it ({size} bytes): {msg!r}"
            )
        a.priority = 0
        a.struct_size = size + 8
        ctypes.memset(ctypes.addressof(buf) + size, 1, 8)
        rc = self._lib.convd_conv_submit(self._h, byref(a), self._idv_ref)
        if rc != -7:
            raise _lib.LibraryError(
                f"{_lib.path()}'s struct convd_conv_args is longer than this package's "
                f"({size} bytes): {self._errstr()!r}"
            )
        _args_checked = True

    def _errstr(self) -> str:
        s = self._lib.convd_errstr(self._h)
        return s.decode(errors="replace") if s else ""

    def _error(self, rc: int) -> Error:
        return Error(rc, self._errstr())

    def _handle(self):
        h = self._h
        if h is None or self._closed:
            raise Error("ECLOSED", "the client is closed")
        return h

    @property
    def info(self) -> dict:
        """What the daemon announced when the client connected: server_version, backend ("cpu"
        or "gpu"), device, protocol_version and this client's limits (max_inflight,
        max_regions, max_mapped_bytes, max_batch)."""
        return dict(self._info)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        state = "closed" if self._closed else f"{self._info['backend']} {self._info['device']}"
        return f"<convd.Client {state}>"

    def close(self) -> None:
        """Closes the connection. Requests still in flight fail with CONVD_ECLOSED. Arrays from
        empty() stay valid: the connection (and their memory) is released when the last of them
        is gone. Calling close() again does nothing."""
        lock = getattr(self, "_lock", None)
        if lock is None or self._closed:
            return
        with lock:
            if self._closed:
                return
            self._closed = True
            err = Error("ECLOSED", "the client was closed with the request in flight")
            for req in list(self._pending.values()):
                self._settle(req, None, err)
            self._pending.clear()
            self._reap()
            self._slabs.drop_free()
            if self._arena is not None:
                self._arena.drop_all()
            if self._cuda is not None:
                self._cuda.drop_all()
            self._plans.clear()
            if len(self._empties) == 0:
                self._release_handle()

    def _release_handle(self) -> None:
        if self._h is not None:
            self._lib.convd_close(self._h)
            self._h = None

    # ------------------------------------------------------------------ queries

    def ping(self) -> float:
        """A round trip to the daemon; returns the seconds it took."""
        with self._lock:
            h = self._handle()
            ns = c_uint64()
            rc = self._lib.convd_ping(h, byref(ns))
            if rc != 0:
                raise self._error(rc)
            return ns.value / 1e9

    def status(self) -> dict:
        """The daemon's status: server_version, backend, device, protocol_version, clients,
        queue_depth, inflight, requests_served, requests_failed, batches, uptime_ms."""
        with self._lock:
            h = self._handle()
            f = _lib.FillCheck(_lib.Status)
            rc = self._lib.convd_status_get(h, f.ptr)
            if rc != 0:
                raise self._error(rc)
            s = f.check("convd_status")
        out = {}
        for name, _ in _lib.Status._fields_:
            v = getattr(s, name)
            out[name] = v.decode(errors="replace") if isinstance(v, bytes) else v
        return out

    def metrics(self) -> str:
        """The daemon's metrics in Prometheus text format."""
        with self._lock:
            h = self._handle()
            p = c_void_p()
            rc = self._lib.convd_metrics_get(h, byref(p))
            if rc != 0:
                raise self._error(rc)
            try:
                return ctypes.string_at(p.value).decode(errors="replace")
            finally:
                _lib.libc().free(p.value)

    # ------------------------------------------------------------------ regions

    def empty(self, shape, dtype="fp32") -> np.ndarray:
        """A new numpy array (zeroed) whose memory is a sealed shared region the daemon has
        mapped: tensors in it are passed to the daemon in place, without a copy. dtype is
        'fp32', 'fp16' or 'bf16' (held as uint16 bit patterns), or a numpy or torch dtype. The
        region is released when the array (and every view of it) is gone."""
        code = dtype_code(dtype)
        npdt = NP_DTYPE[code]
        if isinstance(shape, (int, np.integer)):
            shape = (int(shape),)
        try:
            shape = tuple(int(d) for d in shape)
        except TypeError:
            raise invalid(f"shape must be an int or a sequence of ints, not {shape!r}") from None
        if any(d < 0 for d in shape):
            raise invalid(f"shape {shape} has a negative dimension")
        count = 1
        for d in shape:
            count *= d
        nbytes = count * npdt.itemsize
        with self._lock:
            self._handle()
            self._reap()
            region = create_region(self, max(nbytes, 1))
            self._empties.add(region)
        buf = region_array(region)
        arr = np.frombuffer(buf, dtype=npdt, count=count).reshape(shape)
        weakref.finalize(buf, self._empty_died, region)
        return arr

    def _empty_died(self, region) -> None:
        # Any thread, any time: only note it; the next call (or close) unregisters it.
        self._dead.append(region)
        if self._closed:
            with self._lock:
                self._reap()

    def _reap(self) -> None:
        """Unregisters the regions of empty() arrays that died. Under the lock."""
        while self._dead:
            region = self._dead.pop()
            self._empties.remove(region)
            free_region(self, region)
        if self._closed and len(self._empties) == 0:
            self._release_handle()

    def _arena_block(self, size):
        with self._lock:
            self._handle()
            if self._arena is None:
                self._arena = Arena(self)
            return self._arena.alloc(size)

    def _hold(self, w, b, nhwc: bool, held: Held | None = None) -> Held:
        """Copies a torch weight (and bias) into the arena in the layout the calls use, reusing
        held's block when it is large enough. For convd.torch.Conv2d on the CPU."""
        torch = _torch()
        code = dtype_code(w.dtype)
        fmt = torch.channels_last if nhwc else torch.contiguous_format
        wc = w.detach().contiguous(memory_format=fmt)
        esz = wc.element_size()
        w_bytes = wc.numel() * esz
        b_off = (w_bytes + 255) // 256 * 256
        bc = None
        if b is not None:
            if b.dtype != w.dtype:
                raise invalid(f"the weight is {w.dtype} but the bias is {b.dtype}")
            bc = b.detach().contiguous()
        total = b_off + (bc.numel() * esz if bc is not None else 0)
        if held is None:
            held = Held()
            held.block = None
            held.client = self
        if held.block is not None and held.block.size < total:
            held.release()
        if held.block is None:
            held.block = self._arena_block(total)
        ctypes.memmove(held.block.addr, wc.data_ptr(), w_bytes)
        if bc is not None:
            ctypes.memmove(held.block.addr + b_off, bc.data_ptr(), bc.numel() * esz)
        held.shape = tuple(w.shape)
        held.dtype = code
        held.nhwc = nhwc
        held.w_bytes = w_bytes
        held.b_off = b_off
        held.b_bytes = bc.numel() * esz if bc is not None else 0
        return held

    def _arena_free(self, block) -> None:
        with self._lock:
            if self._arena is not None and not self._closed:
                self._arena.free(block)

    # ------------------------------------------------------------------ the calls

    def conv2d(
        self,
        input,
        weight,
        bias=None,
        stride=1,
        padding=0,
        dilation=1,
        groups=1,
        relu=False,
        *,
        activation=None,
        dtype=None,
        layout=None,
        priority=0,
        allow_tf32=None,
    ):
        """A convolution with torch.nn.functional.conv2d's semantics, optionally followed by
        an activation: ``activation`` is one of 'relu', 'relu6', 'silu' (or 'swish'),
        'hardswish', 'gelu', 'gelu_tanh' (GELU(approximate='tanh')) or ('clamp', lo, hi);
        ``relu=True`` is activation='relu'. Returns the output as the input came: numpy in,
        numpy out; torch in, torch out on the input's device (channels_last when the input is).
        ``allow_tf32`` lets fp32 multiply in TF32 on the GPU; None follows PyTorch:
        torch.backends.cudnn.allow_tf32 for CUDA tensors, exact fp32 for CPU tensors and numpy.
        See convd.connect()."""
        return self._call(
            input, weight, bias, stride, padding, dilation, groups,
            activation_spec(relu, activation), dtype, layout, priority, True, allow_tf32,
        )

    def submit(
        self,
        input,
        weight,
        bias=None,
        stride=1,
        padding=0,
        dilation=1,
        groups=1,
        relu=False,
        *,
        activation=None,
        dtype=None,
        layout=None,
        priority=0,
        allow_tf32=None,
    ) -> Future:
        """conv2d() without waiting: returns a Future. The tensors must not change until it is
        done."""
        return self._call(
            input, weight, bias, stride, padding, dilation, groups,
            activation_spec(relu, activation), dtype, layout, priority, False, allow_tf32,
        )

    async def conv2d_async(self, *args, **kwargs):
        """conv2d() for asyncio: ``y = await client.conv2d_async(x, w, ...)``. The event loop
        goes on while the daemon computes."""
        return await self.submit(*args, **kwargs)

    def _reap_locked(self) -> None:
        with self._lock:
            self._reap()

    def _call(
        self, x, w, b, stride, padding, dilation, groups, act, dtype, layout, prio, wait, tf32=None
    ):
        if self._dead:
            self._reap_locked()
        if type(x) is np.ndarray or (isinstance(x, np.ndarray) and not _is_tensor(x)):
            return self._call_numpy(
                x, w, b, stride, padding, dilation, groups, act, dtype, layout, prio, wait, tf32
            )
        if _is_tensor(x):
            return self._call_torch(
                x, w, b, stride, padding, dilation, groups, act, dtype, layout, prio, wait, tf32
            )
        raise invalid(
            f"the input must be a numpy array or a torch tensor, not {type(x).__name__}"
        )

    def _plan_for(self, key, build):
        try:
            plan = self._plans.get(key)
        except TypeError:  # an argument that cannot be hashed (a numpy array as padding, say)
            key = plan = None
        if plan is None:
            plan = build()
            if key is not None:
                if len(self._plans) >= _MAX_PLANS:
                    self._plans.clear()
                self._plans[key] = plan
        return plan

    # numpy ----------------------------------------------------------------

    def _call_numpy(
        self, x, w, b, stride, padding, dilation, groups, act, dtype, layout, prio, wait, tf32=None
    ):
        tf32 = bool(tf32)  # None: exact, as numpy computes
        if type(w) is not np.ndarray:
            if not isinstance(w, np.ndarray):
                raise invalid(
                    f"the input is a numpy array, so the weight must be one too, not "
                    f"{type(w).__name__}"
                )
        if b is not None and not isinstance(b, np.ndarray):
            raise invalid(
                f"the input is a numpy array, so the bias must be one too, not {type(b).__name__}"
            )
        key = (
            "np", x.shape, x.dtype, w.shape, w.dtype,
            None if b is None else (b.shape, b.dtype),
            _hashable(stride), _hashable(padding), _hashable(dilation), groups, act, dtype, layout,
            tf32,
        )
        plan = self._plan_for(
            key,
            lambda: self._numpy_plan(
                x, w, b, stride, padding, dilation, groups, act, dtype, layout, tf32
            ),
        )
        if not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)
        if not w.flags.c_contiguous:
            w = np.ascontiguousarray(w)
        if b is not None and not b.flags.c_contiguous:
            b = np.ascontiguousarray(b)
        out = np.empty(plan.out_shape, NP_DTYPE[plan.dtype])
        xa = _addr(x)
        wa = _addr(w)
        ba = _addr(b) if b is not None else None
        oa = _addr(out)
        ret = out[0] if plan.squeeze else out
        if wait and prio == 0 and not self._empties.starts:
            self._conv_blocking(plan, xa, wa, ba, oa)
            return ret
        return self._host_request(plan, xa, wa, ba, None, oa, ret, (x, w, b, out), prio, wait)

    def _numpy_plan(self, x, w, b, stride, padding, dilation, groups, act, dtype, layout, tf32):
        explicit = dtype_code(dtype) if dtype is not None else None
        code = np_code(x.dtype, explicit)
        if w.dtype != x.dtype:
            raise invalid(f"the input is {x.dtype} but the weight is {w.dtype}; they must match")
        if b is not None and b.dtype != x.dtype:
            raise invalid(f"the input is {x.dtype} but the bias is {b.dtype}; they must match")
        nhwc = _layout_word(layout, False)
        squeeze = x.ndim == 3
        xs = ((1,) + x.shape) if squeeze else x.shape
        _check_dims(len(xs), w.ndim, None if b is None else b.ndim)
        ws = w.shape
        if nhwc:
            xs = (xs[0], xs[3], xs[1], xs[2])
            ws = (ws[0], ws[3], ws[1], ws[2])
        return make_plan(
            self._lib,
            dtype=code,
            layout=_lib.LAYOUT_NHWC if nhwc else _lib.LAYOUT_NCHW,
            xshape=xs,
            wshape=ws,
            bshape=None if b is None else b.shape,
            stride=stride,
            padding=padding,
            dilation=dilation,
            groups=groups,
            act=act,
            allow_tf32=tf32,
            out_nhwc_order=nhwc,
            squeeze=squeeze,
        )

    # torch ----------------------------------------------------------------

    def _call_torch(
        self, x, w, b, stride, padding, dilation, groups, act, dtype, layout, prio, wait, tf32=None
    ):
        torch = _torch()
        held = isinstance(w, Held)
        if not held and not isinstance(w, torch.Tensor):
            raise invalid(
                f"the input is a torch tensor, so the weight must be one too, not "
                f"{type(w).__name__}"
            )
        if b is not None and not held and not isinstance(b, torch.Tensor):
            raise invalid(
                f"the input is a torch tensor, so the bias must be one too, not {type(b).__name__}"
            )
        cuda = x.is_cuda
        if tf32 is None:  # what PyTorch would do with this tensor
            tf32 = cuda and bool(torch.backends.cudnn.allow_tf32)
        tf32 = bool(tf32)
        if layout is None:
            nhwc = channels_last(x)
        else:
            nhwc = _layout_word(layout, False)
        if held:
            wkey = (w.shape, w.dtype, w.nhwc, b is not None)
        else:
            wkey = (w.shape, w.dtype, w.device, None if b is None else (b.shape, b.dtype, b.device))
        key = (
            "cuda" if cuda else "cpu", x.shape, x.dtype, wkey, nhwc, x.device if cuda else None,
            _hashable(stride), _hashable(padding), _hashable(dilation), groups, act, dtype, tf32,
        )
        plan = self._plan_for(
            key,
            lambda: self._torch_plan(
                x, w, b, held, nhwc, stride, padding, dilation, groups, act, dtype, tf32
            ),
        )
        squeeze = plan.squeeze
        if squeeze:
            x = x.unsqueeze(0)
        fmt = torch.channels_last if nhwc else torch.contiguous_format
        if not x.is_contiguous(memory_format=fmt):
            x = x.contiguous(memory_format=fmt)
        if not held:
            if not w.is_contiguous(memory_format=fmt):
                w = w.contiguous(memory_format=fmt)
            if b is not None and not b.is_contiguous():
                b = b.contiguous()
        out = torch.empty(plan.out_shape, dtype=x.dtype, device=x.device, memory_format=fmt)
        ret = out[0] if squeeze else out
        if cuda:
            return self._cuda_request(plan, x, w, b, out, ret, prio, wait)
        xa = x.data_ptr()
        oa = out.data_ptr()
        if held:
            return self._host_request(plan, xa, None, None, w, oa, ret, (x, out), prio, wait)
        wa = w.data_ptr()
        ba = b.data_ptr() if b is not None else None
        if wait and prio == 0 and not self._empties.starts:
            self._conv_blocking(plan, xa, wa, ba, oa)
            return ret
        return self._host_request(plan, xa, wa, ba, None, oa, ret, (x, w, b, out), prio, wait)

    def _torch_plan(
        self, x, w, b, held, nhwc, stride, padding, dilation, groups, act, dtype, tf32
    ):
        code = dtype_code(x.dtype)
        if dtype is not None and dtype_code(dtype) != code:
            raise invalid(f"dtype={dtype!r} was asked for, but the input is {x.dtype}")
        if held:
            if w.dtype != code or w.nhwc != nhwc:
                raise invalid("the held weight's dtype or layout differs from the input's")
            ws = w.shape
            bshape = (ws[0],) if b is not None else None
        else:
            if w.dtype != x.dtype:
                raise invalid(f"the input is {x.dtype} but the weight is {w.dtype}; they must match")
            if b is not None and b.dtype != x.dtype:
                raise invalid(f"the input is {x.dtype} but the bias is {b.dtype}; they must match")
            if w.device != x.device or (b is not None and b.device != x.device):
                raise invalid(
                    f"the input is on {x.device} but the weight or bias is on "
                    f"{w.device if w.device != x.device else b.device}; they must be on one device"
                )
            if x.device.type not in ("cpu", "cuda"):
                raise Error("EUNSUPPORTED", f"tensors on {x.device} are not supported")
            _check_dims(x.dim() + (1 if x.dim() == 3 else 0), w.dim(), None if b is None else b.dim())
            ws = tuple(w.shape)
            bshape = None if b is None else tuple(b.shape)
        squeeze = x.dim() == 3
        xs = ((1,) + tuple(x.shape)) if squeeze else tuple(x.shape)
        if len(xs) != 4:
            _check_dims(len(xs), 4, None)
        return make_plan(
            self._lib,
            dtype=code,
            layout=_lib.LAYOUT_NHWC if nhwc else _lib.LAYOUT_NCHW,
            xshape=xs,
            wshape=ws,
            bshape=bshape,
            stride=stride,
            padding=padding,
            dilation=dilation,
            groups=groups,
            act=act,
            allow_tf32=tf32,
            out_nhwc_order=False,
            squeeze=squeeze,
        )

    # execution ------------------------------------------------------------

    def _conv_blocking(self, plan, xa, wa, ba, oa) -> None:
        """convd_conv(): the C library stages, runs and copies back."""
        with self._lock:
            h = self._handle()
            rc = self._lib.convd_conv(h, plan.problem, xa, wa, ba, oa)
            if rc != 0:
                err = self._error(rc)
                self._after_wait()
                raise err
            self._after_wait()

    def _host_request(self, plan, xa, wa, ba, held, oa, ret, keep, prio, wait):
        """Submits a request on host memory: tensors in a region are named in place, the rest
        copied into a slab, the output taken into the slab and copied out on completion."""
        memmove = ctypes.memmove
        with self._lock:
            self._handle()
            self._room()
            slab = self._slabs.take(plan.total)
            try:
                sh, sa = slab.handle, slab.addr
                find = self._empties.find if self._empties.starts else None
                loc = find(xa, plan.x_bytes) if find else None
                if loc is None:
                    memmove(sa, xa, plan.x_bytes)
                    loc = (sh, 0)
                if held is not None:
                    blk = held.block
                    if blk is None:
                        raise invalid("the held weight was released")
                    wloc = (blk.region, blk.offset)
                    bloc = (blk.region, blk.offset + held.b_off)
                    keep = keep + (held,)
                else:
                    wloc = find(wa, plan.w_bytes) if find else None
                    if wloc is None:
                        memmove(sa + plan.w_off, wa, plan.w_bytes)
                        wloc = (sh, plan.w_off)
                    bloc = None
                    if plan.has_bias:
                        bloc = find(ba, plan.b_bytes) if find else None
                        if bloc is None:
                            memmove(sa + plan.b_off, ba, plan.b_bytes)
                            bloc = (sh, plan.b_off)
                a = plan.conv_args()
                # Setting ctypes fields costs; a plan's calls mostly name the same places.
                where = (loc, wloc, bloc, sh, prio)
                if where != plan.where:
                    _set(a.input, loc, plan.x_bytes)
                    _set(a.weight, wloc, plan.w_bytes)
                    if plan.has_bias:
                        _set(a.bias, bloc, plan.b_bytes)
                    _set(a.output, (sh, plan.o_off), plan.o_bytes)
                    a.priority = prio
                    plan.where = where
                if wait:
                    return self._run_own(plan, a, slab, oa, ret, keep)
                req = self._submit(a)
            except _Handed as e:
                plan.where = None
                raise e.error from None
            except BaseException:
                plan.where = None
                self._slabs.give(slab)
                raise
            req.slab = slab
            req.o_off = plan.o_off
            req.o_bytes = plan.o_bytes
            req.out = oa
            req.out_ret = ret
            req.keep = keep
        return Future(req)

    def _run_own(self, plan, a, slab, oa, ret, keep):
        """A blocking host request, without a request object unless the wait fails (then the
        request stays in flight, and owns the slab until its completion comes). Under the lock;
        the caller gives the slab back if this raises before submitting."""
        lib, h, comp, ref = self._lib, self._h, self._comp, self._comp_ref
        rc = lib.convd_conv_submit(h, byref(a), self._idv_ref)
        if rc != 0:
            raise self._error(rc)
        rid = self._idv.value
        while True:
            rc = lib.convd_wait(h, rid, -1, ref)
            if rc != _ETIMEDOUT:
                break
        if rc == 0:
            status = comp.status
            if status == 0:
                ctypes.memmove(oa, slab.addr + plan.o_off, plan.o_bytes)
            else:
                err = Error(status, comp.error.decode(errors="replace"))
            self._slabs.give(slab)
            self._after_wait()
            if status != 0:
                raise err
            return ret
        err = self._error(rc)
        req = _Request(self)
        req.id = rid
        req.slab, req.o_off, req.o_bytes = slab, plan.o_off, plan.o_bytes
        req.out, req.out_ret, req.keep = oa, ret, keep
        self._pending[rid] = req
        self._trouble(rc)
        raise _Handed(err)

    def _cuda_request(self, plan, x, w, b, out, ret, prio, wait):
        torch = _torch()
        # The stream rule: the daemon reads the tensors only after the work queued on the
        # caller's current stream (which produced them, and last used the output's memory) is
        # done.
        torch.cuda.current_stream(x.device).synchronize()
        with self._lock:
            self._handle()
            self._room()
            if self._cuda is None:
                from convd._cuda import CudaRegions

                self._cuda = CudaRegions(self)
            cr = self._cuda
            a = plan.conv_args()
            a.priority = prio
            plan.where = None
            segs = []
            try:
                for t, ref, nbytes in (
                    (x, a.input, plan.x_bytes),
                    (w, a.weight, plan.w_bytes),
                    (b, a.bias, plan.b_bytes),
                    (out, a.output, plan.o_bytes),
                ):
                    if t is None:
                        continue
                    seg, off = cr.locate(t.data_ptr(), nbytes)
                    # Counted at once: registering the next tensor's allocation may evict idle
                    # ones, and this one must stay.
                    seg.inflight += 1
                    segs.append(seg)
                    ref.region, ref.offset, ref.bytes = seg.region, off, nbytes
                req = self._submit(a)
            except BaseException:
                for s in segs:
                    s.inflight -= 1
                raise
            req.segments = segs
            req.out = None
            req.out_ret = ret
            req.keep = (x, w, b, out)
            if wait:
                self._wait_own(req)
        if not wait:
            return Future(req)
        if req.error is not None:
            raise req.error
        return req.result

    def _room(self) -> None:
        """Waits until fewer than max_inflight requests are out (what the library counts in
        flight, submitted and not yet taken, is what _pending holds). Under the lock, before a
        plan's args are filled: completions handed out here may run callbacks that call in."""
        lib, h = self._lib, self._h
        waited = False
        while len(self._pending) >= self._max_inflight:
            waited = True
            rc = lib.convd_wait_any(h, _WAIT_SLICE_MS, self._comp_ref)
            if rc == 0:
                self._dispatch(self._comp)
            elif rc != _ETIMEDOUT:
                self._trouble(rc)
                if rc == _ECLOSED:
                    raise self._error(rc)
        if waited:
            self._after_wait()

    def _submit(self, a) -> _Request:
        """convd_conv_submit of filled args. Under the lock, after _room()."""
        rc = self._lib.convd_conv_submit(self._h, byref(a), self._idv_ref)
        if rc != 0:
            raise self._error(rc)
        req = _Request(self)
        req.id = self._idv.value
        self._pending[req.id] = req
        return req

    # completions ----------------------------------------------------------

    def _settle(self, req, result, error) -> None:
        """Completes a request: result or error, slab back, segments released, waiters woken.
        Under the lock."""
        if req.done:
            return
        req.result = result
        req.error = error
        req.done = True
        if req.slab is not None:
            self._slabs.give(req.slab)
            req.slab = None
        if req.segments is not None:
            for s in req.segments:
                s.inflight -= 1
            req.segments = None
        req.keep = None
        if req.event is not None:
            req.event.set()
        if req.waiters:
            for loop, fut in req.waiters:
                loop.call_soon_threadsafe(_wake, fut)
                self._unwatch(loop)
            req.waiters = None
        if req.callbacks:
            for fn, f in req.callbacks:
                try:
                    fn(f)
                except Exception:
                    pass
            req.callbacks = None

    def _finish(self, req, comp) -> None:
        self._pending.pop(req.id, None)
        req.info = {
            "queue_us": comp.queue_us,
            "exec_us": comp.exec_us,
            "batch_size": comp.batch_size,
        }
        if comp.status != 0:
            self._settle(req, None, Error(comp.status, comp.error.decode(errors="replace")))
            return
        if req.out is not None:
            ctypes.memmove(req.out, req.slab.addr + req.o_off, req.o_bytes)
        self._settle(req, req.out_ret, None)

    def _dispatch(self, comp) -> None:
        req = self._pending.get(comp.id)
        if req is not None:
            self._finish(req, comp)

    def _after_wait(self) -> None:
        """After a wait of this thread: hands out the completions the library queued for other
        requests. With an event loop watching the socket, the rings are read too: a completion
        the daemon posted while this thread's wait was spinning (the library clears the ring's
        WAITING flag then) came without a doorbell, and none will come for it. Under the lock."""
        if self._watching and self._h is not None:
            rc = self._lib.convd_client_process(self._h)
            if rc != 0:
                self._trouble(rc)
        if self._pending:
            self._drain_queued()

    def _drain_queued(self) -> None:
        """Hands every completion the library has queued to its request. Under the lock."""
        lib, h, comp, ref = self._lib, self._h, self._comp, self._comp_ref
        while lib.convd_poll(h, ref) == 0:
            self._dispatch(comp)

    def _trouble(self, rc: int) -> None:
        """A wait failed for a reason other than a timeout: CONVD_ECLOSED fails every request
        in flight; protocol trouble (reported once by the library) leaves them in flight."""
        if rc == _ECLOSED:
            err = self._error(rc)
            for req in list(self._pending.values()):
                self._pending.pop(req.id, None)
                self._settle(req, None, err)

    def _wait_own(self, req) -> None:
        """Waits for a request submitted by this thread, holding the lock throughout (the sync
        calls: nobody else can take the completion meanwhile, except _drain_queued)."""
        lib, h, comp, ref = self._lib, self._h, self._comp, self._comp_ref
        while not req.done:
            rc = lib.convd_wait(h, req.id, -1, ref)
            if rc == 0:
                self._finish(req, comp)
            else:
                err = self._error(rc)
                self._trouble(rc)
                if not req.done:
                    if rc == _ETIMEDOUT:
                        continue
                    # The request stays in flight; its completion will settle it (and give its
                    # slab back); the caller gets the failure now.
                    raise err
        self._after_wait()

    def _wait_request(self, req, timeout) -> None:
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        lock = self._lock
        while not req.done:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("the convd request did not complete in time")
            else:
                left = None
            if not lock.acquire(timeout=0.002 if left is None else min(left, 0.002)):
                if req.event is None:
                    req.event = threading.Event()
                req.event.wait(0.002)
                continue
            try:
                if req.done:
                    break
                if self._h is None:
                    raise Error("ECLOSED", "the client is closed")
                ms = _WAIT_SLICE_MS if left is None else max(0, min(_WAIT_SLICE_MS, int(left * 1000)))
                rc = self._lib.convd_wait(self._h, req.id, ms, self._comp_ref)
                if rc == 0:
                    self._finish(req, self._comp)
                elif rc == -22 and req.done:  # ENOTFOUND: someone else took it
                    pass
                elif rc != _ETIMEDOUT:
                    self._trouble(rc)
                self._after_wait()
            finally:
                lock.release()

    def _progress(self) -> None:
        """Takes whatever completions have arrived, without blocking."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            if self._h is not None and not self._closed:
                rc = self._lib.convd_client_process(self._h)
                self._drain_queued()
                if rc != 0:
                    self._trouble(rc)
        finally:
            self._lock.release()

    # asyncio --------------------------------------------------------------

    async def _await_request(self, req):
        if not req.done:
            loop = asyncio.get_running_loop()
            fut = loop.create_future()
            with self._lock:
                if not req.done:
                    if req.waiters is None:
                        req.waiters = []
                    req.waiters.append((loop, fut))
                    self._watch(loop)
                else:
                    fut.set_result(None)
            await fut
        if req.error is not None:
            raise req.error
        return req.result

    def _watch(self, loop) -> None:
        n = self._watching.get(loop, 0)
        self._watching[loop] = n + 1
        if n == 0:
            loop.add_reader(self._lib.convd_client_fd(self._h), self._on_readable, loop)
        # Completions may already wait in the library or the ring, with no doorbell to come.
        loop.call_soon(self._on_readable, loop)

    def _unwatch(self, loop) -> None:
        n = self._watching.get(loop, 0) - 1
        if n > 0:
            self._watching[loop] = n
            return
        self._watching.pop(loop, None)
        fd = self._lib.convd_client_fd(self._h) if self._h is not None else -1
        if fd >= 0:
            loop.call_soon_threadsafe(self._drop_reader, loop, fd)

    def _drop_reader(self, loop, fd) -> None:
        # On the loop's thread, later than _unwatch: a request awaited since then keeps it.
        with self._lock:
            if loop not in self._watching:
                _remove_reader(loop, fd)

    def _on_readable(self, loop) -> None:
        if loop not in self._watching:
            return
        if not self._lock.acquire(blocking=False):
            # Another thread is waiting on the client: it hands completions out when it is
            # done; look again shortly in case it took none of ours.
            loop.call_later(0.0005, self._on_readable, loop)
            return
        try:
            if self._h is not None:
                rc = self._lib.convd_client_process(self._h)
                self._drain_queued()
                if rc != 0:
                    self._trouble(rc)
        finally:
            self._lock.release()


def channels_last(x) -> bool:
    """Whether a torch tensor is laid out channels_last (and so runs NHWC). A tensor that is
    both contiguous and channels_last-contiguous (one channel, or a 1x1 image) counts as
    channels_last when its strides are the ones torch gives channels_last tensors."""
    torch = _torch()
    if x.dim() != 4 or not x.is_contiguous(memory_format=torch.channels_last):
        return False
    if not x.is_contiguous():
        return True
    st = x.stride()
    return st[1] == 1 and st[3] == x.shape[1]


class _Handed(Exception):
    """_run_own's failure after the slab went to a request left in flight."""

    def __init__(self, error):
        super().__init__(str(error))
        self.error = error


def _wake(fut) -> None:
    if not fut.done():
        fut.set_result(None)


def _remove_reader(loop, fd) -> None:
    try:
        loop.remove_reader(fd)
    except Exception:
        pass


def _layout_word(layout, default: bool) -> bool:
    if layout is None:
        return default
    v = _NHWC_WORDS.get(str(layout).lower()) if isinstance(layout, str) else None
    if v is None:
        raise invalid(f"layout {layout!r} is not 'nchw' or 'nhwc'")
    return v


def _check_dims(xdim, wdim, bdim) -> None:
    if xdim != 4:
        raise Error(
            "EBADSHAPE",
            f"the input has {xdim} dimensions; conv2d takes (N, C, H, W) or unbatched (C, H, W)",
        )
    if wdim != 4:
        raise Error("EBADSHAPE", f"the weight has {wdim} dimensions; conv2d takes 4")
    if bdim is not None and bdim != 1:
        raise Error("EBADSHAPE", f"the bias has {bdim} dimensions; it must have 1")


def _set(t, loc, nbytes) -> None:
    t.region, t.offset = loc
    t.bytes = nbytes


def _hashable(v):
    """stride, padding or dilation as part of a plan's key: lists as tuples."""
    return tuple(v) if type(v) is list else v


_from_buffer = ctypes.c_char.from_buffer
_addressof = ctypes.addressof


def _addr(a: np.ndarray) -> int:
    """The address of a C-contiguous array's data; from_buffer is four times faster than
    a.ctypes.data, but refuses read-only arrays."""
    try:
        return _addressof(_from_buffer(a))
    except (TypeError, ValueError):
        return a.ctypes.data


def _default_name() -> str:
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else "python"
    return f"python:{os.path.basename(argv0)}"[:64]
