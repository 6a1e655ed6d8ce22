"""The client: connect, conv2d / submit / conv2d_async, empty, status, metrics, close.

How a call travels (docs/python.md has the user's view):
- host tensors (numpy, torch on the CPU), nothing in a region: convd_conv() of the C library,
  which copies the tensors into a staging region it keeps and the output back out; one foreign
  call per convolution, so the package adds only its argument handling to the C client's cost.
- host tensors of which some lie in a region (Client.empty() arrays, weights held by
  convd.torch.Conv2d): those are named in place, the others copied into a staging slab, and the
  request submitted; the output is copied from the slab when it completes.
- CUDA tensors: named in place through their allocation's registration (_cuda.py). With a daemon
  of protocol 3 they are stream-ordered: the request carries a gate (two words of the client's
  GateSlab) that the caller's current stream writes after the work queued before the call and
  waits on before the work queued after it, and the call returns at once. Before protocol 3 (or
  with stream_ordered=False), the caller's current stream is synchronised first and the call
  waits for the completion.
- submit() is the same with the wait left to the returned Future.

Stream-ordered requests stay in flight after their call returns: their completions are taken at
later calls (without blocking), by synchronize(), by any wait, and by a thread of the client
that looks every few milliseconds while some are out. The last matters for failures: the
library stores a failed request's done word itself when it reads the completion in (or finds the
connection lost), which takes a call into the library, and a stream waiting on that word must not
depend on this process calling the client again. A failed completion of a conv2d() is an
asynchronous error, raised by the next call or synchronize().

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
import warnings
import weakref
from ctypes import byref, c_uint64, c_void_p

import numpy as np

from convd import _lib
from convd._args import NP_DTYPE, activation_spec, dtype_code, make_plan, np_code
from convd._errors import Error, PerformanceWarning, invalid
from convd._memory import Arena, EmptyRegions, Slabs, create_region, free_region, region_array

_ETIMEDOUT = -15
_ECLOSED = -20
_EAGAIN = -21
_ELIMIT = -14
_EUNSUPPORTED = -7
# A waiting Future holds the client's lock at most this long before letting other threads in.
_WAIT_SLICE_MS = 10
_MAX_PLANS = 1024
_args_checked = False
_lib_gates = False  # whether the library reads struct convd_gate (_check_args_struct)
# Stream ordering: how often the client's thread takes completions while stream-ordered requests
# are out, and how long close() waits for them before it releases their streams itself.
_WATCH_S = 0.005
_CLOSE_WAIT_S = 60.0
_OFF_WORDS = ("0", "false", "no", "off")

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
        "slot",
        "value",
        "report",
    )

    def __init__(self, client):
        self.client = client
        self.slot = None  # a gate slot: stream-ordered (value, report with it)
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
        stream_ordered: bool | None = None,
        cuda_wait: str | None = None,
    ):
        self._h = None
        self._closed = True
        if cuda_wait is None:
            cuda_wait = os.environ.get("CONVD_CUDA_WAIT") or "block"
        if cuda_wait not in ("block", "keep"):
            raise invalid(f"cuda_wait must be 'block' or 'keep', not {cuda_wait!r}")
        self._cuda_wait = cuda_wait
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
        self._gates = None  # GateSlab, made by the first stream-ordered request
        self._gated = 0  # stream-ordered requests in flight (in _pending, with a slot)
        self._async_error = None  # the first failure of a stream-ordered conv2d, not yet raised
        self._watch_event = None  # the thread taking completions while _gated (_watch_gates)
        self._watch_idle = False
        self._ordered = False
        self._ordered_auto = stream_ordered is None
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
            self._doorbells(False)
            self._check_args_struct()
            self._ordered = self._stream_ordering(stream_ordered)
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
        - the same with the gate's last byte set: a library that has struct convd_gate still
          refuses with CONVD_EINVAL; one from before gates, with CONVD_EUNSUPPORTED (a byte it
          does not know), and then stream ordering is not used (_lib_gates);
        - at 8 bytes more, with those bytes set, the request is refused as using a field the
          library does not know (CONVD_EUNSUPPORTED), so the library's struct is not longer
          than the mirror."""
        global _args_checked, _lib_gates
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
        # The gate, the mirror's last field: with its last byte set, a library that has it
        # reads it (and still refuses the priority, or the gate without a region: EINVAL); a
        # library from before gates refuses a byte it does not know (CONVD_EUNSUPPORTED), and
        # stream ordering is not used with it (its connections speak protocol 2 at most).
        a.gate.done_value = 1 << 24
        assert buf[_lib.GATE_LAST_BYTE] == b"\x01"
        rc = self._lib.convd_conv_submit(self._h, byref(a), self._idv_ref)
        msg = self._errstr()
        if rc not in (-1, _EUNSUPPORTED):
            raise _lib.LibraryError(
                f"{_lib.path()} does not read struct convd_conv_args' gate as this package "
                f"declares it: {msg!r}"
            )
        gates = not (rc == _EUNSUPPORTED and "byte" in msg)
        a.gate.done_value = 0
        a.priority = 0
        a.struct_size = size + 8
        ctypes.memset(ctypes.addressof(buf) + size, 1, 8)
        rc = self._lib.convd_conv_submit(self._h, byref(a), self._idv_ref)
        if rc != -7:
            raise _lib.LibraryError(
                f"{_lib.path()}'s struct convd_conv_args is longer than this package's "
                f"({size} bytes): {self._errstr()!r}"
            )
        _lib_gates = gates
        _args_checked = True

    def _stream_ordering(self, asked) -> bool:
        """Whether CUDA tensors take the stream-ordered path: asked (None: when the daemon
        speaks protocol 3 and $CONVD_STREAM_ORDERED is not 0), on a GPU daemon."""
        if asked is None:
            env = os.environ.get("CONVD_STREAM_ORDERED", "").strip().lower()
            if env in _OFF_WORDS:
                return False
        elif not asked:
            return False
        proto = self._info["protocol_version"]
        if proto < 3 or not _lib_gates:
            if asked:
                raise Error(
                    "EUNSUPPORTED",
                    f"stream_ordered=True needs a daemon and a libconvd-client of protocol 3 "
                    f"(gates); this connection speaks protocol {proto}"
                    + ("" if _lib_gates else f", and {_lib.path()} has no gates"),
                )
            return False
        # Only the GPU backend opens CUDA memory; the others refuse it on the synchronous path.
        return self._info["backend"] == "gpu"

    @property
    def stream_ordered(self) -> bool:
        """Whether convolutions of CUDA tensors are ordered on the caller's stream (returning at
        once) rather than synchronising it and waiting: a GPU daemon of protocol 3, unless
        turned off (connect(stream_ordered=False), $CONVD_STREAM_ORDERED=0) or found
        unavailable by the CUDA driver at the first call (with a PerformanceWarning)."""
        return self._ordered

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
        """Closes the connection. Stream-ordered requests are waited for first (their streams
        wait on them; for at most a minute, then their streams are let go), and the devices
        that used them are synchronised (torch.cuda.synchronize) before the gate words are
        unregistered; their errors are not raised. Other requests still in flight fail with
        CONVD_ECLOSED. Arrays from empty() stay valid: the connection (and their memory) is
        released when the last of them is gone. Calling close() again does nothing."""
        lock = getattr(self, "_lock", None)
        if lock is None or self._closed:
            return
        with lock:
            if self._closed:
                return
            self._closed = True
            if self._watch_event is not None:
                self._watch_event.set()  # the thread sees _closed and ends
            if self._gated:
                self._end_gated()
            err = Error("ECLOSED", "the client was closed with the request in flight")
            for req in list(self._pending.values()):
                self._settle(req, None, err)
            self._pending.clear()
            if self._gates is not None:
                gates, self._gates = self._gates, None
                gates.close()
            self._reap()
            self._slabs.drop_free()
            if self._arena is not None:
                self._arena.drop_all()
            if self._cuda is not None:
                self._cuda.drop_all()
            self._plans.clear()
            if len(self._empties) == 0:
                self._release_handle()

    def _end_gated(self) -> None:
        """close(): takes the completions of the stream-ordered requests in flight, for at
        most _CLOSE_WAIT_S, then stores the done words of those left from the host, so that no
        stream waits on memory about to be unregistered. Under the lock."""
        lib, h = self._lib, self._h
        deadline = time.monotonic() + _CLOSE_WAIT_S
        while self._gated and h is not None and time.monotonic() < deadline:
            rc = lib.convd_wait_any(h, 100, self._comp_ref)
            if rc == 0:
                self._dispatch(self._comp)
            elif rc != _ETIMEDOUT:
                self._trouble(rc)
                break
        if self._gates is not None:
            for req in self._pending.values():
                if req.slot is not None:
                    self._gates.release(req.slot, req.value)

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
        if self._async_error is not None:
            self._raise_async()
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
        if layout is None:
            nhwc = channels_last(x)
        else:
            nhwc = _layout_word(layout, False)
        plan = self._torch_plan_for(
            x, w, b, held, nhwc, stride, padding, dilation, groups, act, dtype, tf32
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

    def _torch_plan_for(
        self, x, w, b, held, nhwc, stride, padding, dilation, groups, act, dtype, tf32
    ):
        """The plan of a call with torch tensors (cached per signature). tf32 None follows
        PyTorch: torch.backends.cudnn.allow_tf32 for CUDA tensors, exact fp32 otherwise."""
        cuda = x.is_cuda
        if tf32 is None:  # what PyTorch would do with this tensor
            tf32 = cuda and bool(_torch().backends.cudnn.allow_tf32)
        tf32 = bool(tf32)
        if held:
            wkey = (w.shape, w.dtype, w.nhwc, b is not None)
        else:
            wkey = (w.shape, w.dtype, w.device, None if b is None else (b.shape, b.dtype, b.device))
        key = (
            "cuda" if cuda else "cpu", x.shape, x.dtype, wkey, nhwc, x.device if cuda else None,
            _hashable(stride), _hashable(padding), _hashable(dilation), groups, act, dtype, tf32,
        )
        return self._plan_for(
            key,
            lambda: self._torch_plan(
                x, w, b, held, nhwc, stride, padding, dilation, groups, act, dtype, tf32
            ),
        )

    def _layer_cuda(self, fast, x):
        """A patched layer's call on a CUDA input whose signature matched fast (a LayerFast
        of convd.torch): its plan and its weight's and bias's allocations kept from the call
        that made it, so that only the input and output are looked up. Stream-ordered only;
        None when the call must take the general path (stream ordering unavailable)."""
        if self._dead:
            self._reap_locked()
        if self._async_error is not None:
            self._raise_async()
        plan = fast.plan
        out = _torch().empty(
            plan.out_shape, dtype=x.dtype, device=x.device, memory_format=fast.fmt
        )
        got = self._gated_request(plan, x, fast.w, fast.b, out, out, 0, True)
        return None if got is _SYNC_PATH else got

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
        if self._ordered:
            got = self._gated_request(plan, x, w, b, out, ret, prio, wait)
            if got is not _SYNC_PATH:
                return got
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
            a.gate.region = None
            plan.where = None
            segs = []
            try:
                _locate_tensors(cr, plan, a, x, w, b, out, segs)
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

    def _gated_request(self, plan, x, w, b, out, ret, prio, wait):
        """A stream-ordered request (module docstring): a gate slot and value, the tensors
        located, the request submitted with the gate, then, outside the lock, the ready write
        and the done wait queued on the caller's current stream. Returns the output (wait) or a
        Future at once; _SYNC_PATH when stream ordering turned out to be unavailable here and
        was chosen automatically."""
        dev = x.device.index
        stream = _current_stream(dev)
        with self._lock:
            self._handle()
            if self._pending:
                self._poll_completions()
            if self._async_error is not None:
                self._raise_async()
            self._room()
            gates = self._gates
            if gates is None or dev not in gates.dptr:
                gates = self._gates_for(dev, stream)
                if gates is None:
                    return _SYNC_PATH
            got = gates.take()
            if got is None:
                got = self._gate_slot(gates)
            slot, value = got
            if self._cuda is None:
                from convd._cuda import CudaRegions

                self._cuda = CudaRegions(self)
            cr = self._cuda
            a = plan.conv_args()
            a.priority = prio
            plan.where = None
            segs = []
            try:
                _locate_tensors(cr, plan, a, x, w, b, out, segs)
                g = a.gate
                g.region = gates.handle
                g.ready_offset = 8 * slot
                g.done_offset = 8 * slot + 4
                g.ready_value = g.done_value = value
                req = self._submit(a)
            except BaseException:
                for s in segs:
                    s.inflight -= 1
                gates.unused(slot)
                raise
            req.segments = segs
            req.out = None
            req.out_ret = ret
            req.keep = (x, w, b, out)
            req.slot = slot
            req.value = value
            # A conv2d's failure is raised later (asynchronous errors); a Future holds its own.
            req.report = wait
            self._gated += 1
            if self._watch_idle or self._watch_event is None:
                self._wake_watch()
        # Outside the lock: a call that blocks (the stream's queue is full) must not keep the
        # client's thread from taking the completions whose done words the stream waits for.
        failed = gates.order(dev, stream, slot, value)
        if failed is not None:
            what, why = failed
            with self._lock:
                req.report = False  # this caller gets the error now
                if what == "write" and self._gates is gates:
                    # Nothing was queued: let the daemon start (it reads inputs nobody waits
                    # for, into an output nobody gets) rather than wait out its gate timeout,
                    # and the slot be freed (no write of this value is left to land).
                    gates.words[2 * slot] = value
            raise Error(
                "EDEVICE",
                f"cannot queue the stream-ordered convolution on the CUDA stream "
                f"(the driver refused the {what}: cuStreamBatchMemOp, or cuStreamWriteValue32/"
                f"cuStreamWaitValue32): {why}",
            )
        if not wait:
            return Future(req)
        return ret

    def _gates_for(self, dev: int, stream: int):
        """The gate slab, made and attached to the device on first use. Under the lock. When
        that fails, stream ordering chosen automatically is turned off for this client (with a
        PerformanceWarning, and None returned: the synchronous path serves the call); asked
        for explicitly, the error is raised."""
        from convd._cuda import MAX_GATE_SLOTS, GateSlab, _outside_level

        try:
            gates = self._gates
            if gates is None:
                slots = max(1, min(self._max_inflight, MAX_GATE_SLOTS))
                gates = self._gates = GateSlab(self, slots)
            gates.attach(dev, stream)
            return gates
        except Error as e:
            if not self._ordered_auto:
                raise
            self._ordered = False
            warnings.warn(
                f"convd: stream ordering is unavailable ({e.message}), so each convolution of "
                "CUDA tensors synchronises the caller's stream and waits for its result; "
                "connect(stream_ordered=False) or CONVD_STREAM_ORDERED=0 says so without this "
                "warning",
                PerformanceWarning,
                stacklevel=_outside_level(),
            )
            return None

    def _gate_slot(self, gates):
        """Waits for a gate slot: for completions while stream-ordered requests are out, else
        (every slot waits for a stream to write a ready word queued before) a little. Under the
        lock."""
        while True:
            got = gates.take()
            if got is not None:
                return got
            rc = self._wait_any_slice() if self._gated else _ETIMEDOUT
            if rc != 0:
                time.sleep(0.0005)
            self._after_wait()

    def _raise_async(self) -> None:
        """Raises (once) the recorded failure of an earlier stream-ordered conv2d."""
        with self._lock:
            err, self._async_error = self._async_error, None
        if err is not None:
            raise err

    def synchronize(self) -> None:
        """Waits until every stream-ordered request issued so far (conv2d() and submit() of
        CUDA tensors with stream ordering) has completed: the daemon has run it, or it failed.
        Then raises the first failure of a stream-ordered conv2d() not yet raised (a
        convd.Error with the request's own code), as CUDA reports asynchronous errors. It does
        not wait for the CUDA streams: torch.cuda.synchronize() does."""
        with self._lock:
            self._handle()
            if self._pending:
                self._poll_completions()
            out = [r for r in self._pending.values() if r.slot is not None]
        for r in out:
            if not r.done:
                self._wait_request(r, None)
        if self._async_error is not None:
            self._raise_async()

    def _poll_completions(self) -> None:
        """Takes the completions that have arrived, without blocking. Under the lock."""
        rc = self._lib.convd_client_process(self._h)
        self._drain_queued()
        if rc != 0:
            self._trouble(rc)

    def _wake_watch(self) -> None:
        """Starts the client's completion thread, or wakes it from its rest. Under the lock."""
        self._watch_idle = False
        if self._watch_event is None:
            self._watch_event = threading.Event()
            threading.Thread(
                target=_watch_gates,
                args=(weakref.ref(self), self._watch_event),
                name="convd-gates",
                daemon=True,
            ).start()
        else:
            self._watch_event.set()

    def _room(self) -> None:
        """Waits until fewer than max_inflight requests are out (what the library counts in
        flight, submitted and not yet taken, is what _pending holds). Under the lock, before a
        plan's args are filled: completions handed out here may run callbacks that call in."""
        waited = False
        while len(self._pending) >= self._max_inflight:
            waited = True
            self._wait_any_slice()
        if waited:
            self._after_wait()

    def _wait_any_slice(self) -> int:
        """Waits up to one slice for any completion and hands it out. Returns the library's
        code (0 or ETIMEDOUT; ECLOSED raises). Under the lock."""
        rc = self._lib.convd_wait_any(self._h, _WAIT_SLICE_MS, self._comp_ref)
        if rc == 0:
            self._dispatch(self._comp)
        elif rc != _ETIMEDOUT:
            self._trouble(rc)
            if rc == _ECLOSED:
                raise self._error(rc)
        return rc

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
        if req.slot is not None:
            self._gated -= 1
            if self._gates is not None:
                self._gates.give(req.slot, req.value)
            req.slot = None
            if error is not None and req.report and self._async_error is None and not self._closed:
                self._async_error = Error(
                    error.code,
                    "a stream-ordered convolution issued earlier on this client failed, and "
                    f"its output was not written: {error.message}",
                )
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
                self._poll_completions()
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

    def _doorbells(self, on: bool) -> None:
        """Whether completions ring the socket between the library's waits
        (convd_client_doorbells): only while an asyncio loop watches the descriptor. Otherwise
        the package takes completions itself, at its calls and every _WATCH_S while
        stream-ordered requests are out, and a doorbell per completion would cost the daemon a
        hand-off and a datagram that nobody waits for (a quarter of its loop under 16 patched
        models). A library without the function rings as before. Under the lock."""
        fn = getattr(self._lib, "convd_client_doorbells", None)
        if fn is not None and self._h is not None:
            fn(self._h, 1 if on else 0)

    def _watch(self, loop) -> None:
        n = self._watching.get(loop, 0)
        self._watching[loop] = n + 1
        if n == 0:
            if len(self._watching) == 1:  # the first loop to watch
                self._doorbells(True)
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
                if not self._watching:
                    self._doorbells(False)

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


def _watch_gates(ref, event) -> None:
    """The client's completion thread: while stream-ordered requests are out, takes their
    completions every _WATCH_S (without blocking, and not while another thread holds the
    client, which then takes them itself), so that a failure's done word is stored, slots and
    tensors are let go, and the errors recorded, even when the process only waits on its
    streams. Rests on the event while none are out; ends with the client. Holds the client
    only between two looks."""
    while True:
        c = ref()
        if c is None or c._closed:
            return
        if c._gated:
            c._progress()
            del c
            time.sleep(_WATCH_S)
            continue
        c._watch_idle = True
        if c._gated:  # issued since the look above: _wake_watch saw no rest to end
            c._watch_idle = False
            del c
            continue
        del c
        event.wait(1.0)
        event.clear()


_SYNC_PATH = object()  # _gated_request: serve this call synchronously


class Placed:
    """A CUDA tensor that stays where it is (a layer's weight or bias) with its allocation's
    registration kept: a call names it without asking the driver where it lives. The tensor is
    held, so its allocation cannot be freed while this exists; a registration evicted since
    (the daemon's region limit) is looked up again."""

    __slots__ = ("tensor", "ptr", "seg", "off")

    def __init__(self, tensor):
        self.tensor = tensor
        self.ptr = tensor.data_ptr()
        self.seg = None
        self.off = 0

    def where(self, cr, nbytes: int):
        seg = self.seg
        if seg is None or not cr.kept(seg):
            seg, self.off = cr.locate(self.ptr, nbytes)
            self.seg = seg
        return seg, self.off


def _locate_tensors(cr, plan, a, x, w, b, out, segs) -> None:
    """Names the CUDA tensors in the args by their allocations' regions (cr: CudaRegions),
    appending each allocation to segs as it is counted in flight: registering the next tensor's
    allocation may evict idle ones, and these must stay. The caller uncounts segs on failure."""
    for t, ref, nbytes in (
        (x, a.input, plan.x_bytes),
        (w, a.weight, plan.w_bytes),
        (b, a.bias, plan.b_bytes),
        (out, a.output, plan.o_bytes),
    ):
        if t is None:
            continue
        if type(t) is Placed:
            seg, off = t.where(cr, nbytes)
        else:
            seg, off = cr.locate(t.data_ptr(), nbytes)
        seg.inflight += 1
        segs.append(seg)
        ref.region, ref.offset, ref.bytes = seg.region, off, nbytes


def _current_stream(device: int) -> int:
    """The caller's current stream on the device, as the driver's CUstream handle."""
    torch = _torch()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(device)
    return torch.cuda.current_stream(device).cuda_stream


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
