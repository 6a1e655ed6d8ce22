"""libconvd-client through ctypes: the library, its structs, its prototypes, and the checks that
the structs here have the layout the loaded library uses.

The structs mirror include/convd/conv.h and include/convd/convd.h field for field. Structs the
caller fills start with struct_size; the library refuses one that is too small. Structs the
library fills have no size field, so they are checked by letting the library write into a buffer
longer than the mirror and verifying that nothing past the mirror's end changed and that the
fields read back what was asked for (``check_layouts`` at load, ``check_filled`` per client).
"""

from __future__ import annotations

import ctypes
import os
import threading
from ctypes import (
    POINTER,
    Structure,
    c_bool,
    c_char,
    c_char_p,
    c_float,
    c_int,
    c_int32,
    c_int64,
    c_size_t,
    c_uint,
    c_uint32,
    c_uint64,
    c_void_p,
)

# enum convd_activation (conv.h)
ACT_NONE = 0
ACT_RELU = 1
ACT_CLAMP = 2
ACT_SILU = 3
ACT_HARDSWISH = 4
ACT_GELU = 5
ACT_GELU_TANH = 6

# enum convd_dtype / convd_layout (conv.h)
DTYPE_FP32 = 1
DTYPE_FP16 = 2
DTYPE_BF16 = 3
LAYOUT_NCHW = 1
LAYOUT_NHWC = 2

# CONVD_IPC_HANDLE_BYTES: convd_region_import_gpu() takes exactly this many handle bytes.
IPC_HANDLE_BYTES = 64

# status.h, CONVD_STATUS_MAP: name -> value. Kept here so that codes can be named without the
# library; check_layouts() verifies every entry against convd_status_name().
STATUS = {
    "OK": 0,
    "EINVAL": -1,
    "EPROTO": -2,
    "EVERSION": -3,
    "ENOMEM": -4,
    "EBADSHAPE": -5,
    "EGROUPS": -6,
    "EUNSUPPORTED": -7,
    "ENOREGION": -8,
    "EBOUNDS": -9,
    "ESIZE": -10,
    "ESEAL": -11,
    "ETOOBIG": -12,
    "EQUEUEFULL": -13,
    "ELIMIT": -14,
    "ETIMEDOUT": -15,
    "ECANCELED": -16,
    "EDEVICE": -17,
    "EIO": -18,
    "ECONNECT": -19,
    "ECLOSED": -20,
    "EAGAIN": -21,
    "ENOTFOUND": -22,
    "EPERM": -23,
    "ESHUTDOWN": -24,
    "EEXIST": -25,
    "EBUSY": -26,
    "EINTERNAL": -27,
}
STATUS_NAME = {v: k for k, v in STATUS.items()}


class Problem(Structure):
    """struct convd_problem"""

    _fields_ = [
        ("n", c_int32),
        ("h", c_int32),
        ("w", c_int32),
        ("c", c_int32),
        ("k", c_int32),
        ("r", c_int32),
        ("s", c_int32),
        ("groups", c_int32),
        ("stride_h", c_int32),
        ("stride_w", c_int32),
        ("pad_top", c_int32),
        ("pad_bottom", c_int32),
        ("pad_left", c_int32),
        ("pad_right", c_int32),
        ("dil_h", c_int32),
        ("dil_w", c_int32),
        ("dtype", c_int),  # enum convd_dtype
        ("layout", c_int),  # enum convd_layout
        ("has_bias", c_bool),
        ("allow_tf32", c_bool),
        ("activation", c_int),  # enum convd_activation
        ("act_min", c_float),
        ("act_max", c_float),
    ]


class ProblemSizes(Structure):
    """struct convd_problem_sizes"""

    _fields_ = [
        ("out_h", c_int32),
        ("out_w", c_int32),
        ("input_elems", c_uint64),
        ("weight_elems", c_uint64),
        ("bias_elems", c_uint64),
        ("output_elems", c_uint64),
        ("input_bytes", c_uint64),
        ("weight_bytes", c_uint64),
        ("bias_bytes", c_uint64),
        ("output_bytes", c_uint64),
        ("flops", c_uint64),
    ]


class ConnectOptions(Structure):
    """struct convd_connect_options"""

    _fields_ = [
        ("struct_size", c_size_t),
        ("socket_path", c_char_p),
        ("client_name", c_char_p),
        ("timeout_ms", c_int),
        ("use_rings", c_int),
        ("spin_us", c_int),
        ("device", c_int),
    ]


class ServerInfo(Structure):
    """struct convd_server_info"""

    _fields_ = [
        ("protocol_version", c_uint32),
        ("server_version", c_char * 32),
        ("backend", c_char * 16),
        ("device", c_char * 128),
        ("max_inflight", c_uint32),
        ("max_regions", c_uint32),
        ("max_mapped_bytes", c_uint64),
        ("max_batch", c_uint32),
    ]


class Tensor(Structure):
    """struct convd_tensor"""

    _fields_ = [("region", c_void_p), ("offset", c_uint64), ("bytes", c_uint64)]


class Gate(Structure):
    """struct convd_gate (protocol 3): two 32-bit words of a host region through which a GPU
    stream orders a request; region NULL means no gate."""

    _fields_ = [
        ("region", c_void_p),
        ("ready_offset", c_uint64),
        ("done_offset", c_uint64),
        ("ready_value", c_uint32),
        ("done_value", c_uint32),
    ]


class ConvArgs(Structure):
    """struct convd_conv_args"""

    _fields_ = [
        ("struct_size", c_size_t),
        ("problem", Problem),
        ("input", Tensor),
        ("weight", Tensor),
        ("bias", Tensor),
        ("output", Tensor),
        ("priority", c_uint),
        ("timeout_us", c_uint64),
        ("gate", Gate),
    ]


# The gate is the struct's last field, and ends it (no tail padding): the checks of
# Client._check_args_struct set its last byte to learn whether the library reads it.
assert ctypes.sizeof(Gate) == 32 and ConvArgs.gate.offset + 32 == ctypes.sizeof(ConvArgs)
GATE_LAST_BYTE = ctypes.sizeof(ConvArgs) - 1


class Completion(Structure):
    """struct convd_completion"""

    _fields_ = [
        ("id", c_uint64),
        ("status", c_int),
        ("error", c_char * 256),
        ("queue_us", c_uint64),
        ("exec_us", c_uint64),
        ("batch_size", c_uint32),
    ]


class Status(Structure):
    """struct convd_status"""

    _fields_ = [
        ("server_version", c_char * 32),
        ("backend", c_char * 16),
        ("device", c_char * 128),
        ("protocol_version", c_uint32),
        ("clients", c_uint32),
        ("queue_depth", c_uint32),
        ("inflight", c_uint32),
        ("requests_served", c_uint64),
        ("requests_failed", c_uint64),
        ("batches", c_uint64),
        ("uptime_ms", c_uint64),
    ]


# (name, restype, argtypes). Pointers to the opaque client and regions travel as c_void_p.
_PROTOTYPES = [
    ("convd_connect", c_int, [POINTER(ConnectOptions), POINTER(c_void_p)]),
    ("convd_last_connect_error", c_char_p, []),
    ("convd_close", None, [c_void_p]),
    ("convd_errstr", c_char_p, [c_void_p]),
    ("convd_server_info", None, [c_void_p, c_void_p]),
    ("convd_region_create", c_int, [c_void_p, c_size_t, POINTER(c_void_p)]),
    (
        "convd_region_import_gpu",
        c_int,
        [c_void_p, c_char_p, c_size_t, c_uint64, c_uint64, POINTER(c_void_p)],
    ),
    ("convd_region_data", c_void_p, [c_void_p]),
    ("convd_region_size", c_size_t, [c_void_p]),
    ("convd_region_free", c_int, [c_void_p]),
    ("convd_conv_submit", c_int, [c_void_p, POINTER(ConvArgs), POINTER(c_uint64)]),
    ("convd_wait", c_int, [c_void_p, c_uint64, c_int, c_void_p]),
    ("convd_wait_any", c_int, [c_void_p, c_int, c_void_p]),
    ("convd_inflight", c_size_t, [c_void_p]),
    ("convd_client_fd", c_int, [c_void_p]),
    ("convd_client_process", c_int, [c_void_p]),
    ("convd_poll", c_int, [c_void_p, c_void_p]),
    (
        "convd_conv",
        c_int,
        [c_void_p, POINTER(Problem), c_void_p, c_void_p, c_void_p, c_void_p],
    ),
    ("convd_ping", c_int, [c_void_p, POINTER(c_uint64)]),
    ("convd_status_get", c_int, [c_void_p, c_void_p]),
    ("convd_metrics_get", c_int, [c_void_p, POINTER(c_void_p)]),
    ("convd_problem_init", None, [c_void_p] + [c_int32] * 8),
    ("convd_problem_check", c_int, [POINTER(Problem), c_char_p, c_size_t]),
    ("convd_problem_sizes", c_int, [POINTER(Problem), c_void_p, c_char_p, c_size_t]),
    ("convd_problem_str", c_char_p, [POINTER(Problem), c_char_p, c_size_t]),
    ("convd_out_dim", c_int64, [c_int64] * 6),
    ("convd_strerror", c_char_p, [c_int]),
    ("convd_status_name", c_char_p, [c_int]),
]

# Functions of later library versions: bound where the library has them, absent otherwise
# (callers look them up with getattr(lib, name, None)).
_OPTIONAL = [
    ("convd_client_doorbells", c_int, [c_void_p, c_int]),  # CONVD_0.3
]

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_path: str | None = None
_libc: ctypes.CDLL | None = None


class LibraryError(OSError):
    """libconvd-client could not be loaded, or its structs differ from this package's."""


class LibraryNotFound(LibraryError):
    """No libconvd-client where $CONVD_CLIENT_LIB or the loader's path says."""


def _candidates() -> list[str]:
    env = os.environ.get("CONVD_CLIENT_LIB")
    if env:
        return [env]
    # The loader's own search: LD_LIBRARY_PATH, the ld.so cache, the default directories.
    names = ["libconvd-client.so.0", "libconvd-client.so"]
    # Installed by cmake --install: the library directory of the same install, in case the
    # loader does not search it.
    try:
        from convd import _install
    except ImportError:
        return names
    here = os.path.dirname(os.path.abspath(__file__))
    return names + [os.path.normpath(os.path.join(here, _install.LIBDIR, "libconvd-client.so.0"))]


def load() -> ctypes.CDLL:
    """Loads libconvd-client once ($CONVD_CLIENT_LIB, else the loader's path), declares its
    functions and checks the struct layouts. Raises LibraryError."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        errors = []
        lib = None
        for name in _candidates():
            try:
                lib = ctypes.CDLL(name)
                _path = name
                break
            except OSError as e:
                errors.append(f"{name}: {e}")
        if lib is None:
            raise LibraryNotFound(
                "cannot load libconvd-client ("
                + "; ".join(errors)
                + "): set CONVD_CLIENT_LIB to the library's path (for a build tree, "
                "build/lib/libconvd-client.so) or install it where the loader finds it"
            )
        for name, restype, argtypes in _PROTOTYPES:
            try:
                fn = getattr(lib, name)
            except AttributeError:
                raise LibraryError(f"{_path} has no {name}: not libconvd-client, or too old")
            fn.restype = restype
            fn.argtypes = argtypes
        for name, restype, argtypes in _OPTIONAL:
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.restype = restype
                fn.argtypes = argtypes
        check_layouts(lib)
        _lib = lib
        return lib


def path() -> str | None:
    """The name or path the library was loaded from (None before load())."""
    return _path


def libc() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        c = ctypes.CDLL(None, use_errno=True)
        c.free.argtypes = [c_void_p]
        c.free.restype = None
        c.mmap.argtypes = [c_void_p, c_size_t, c_int, c_int, c_int, ctypes.c_long]
        c.mmap.restype = c_void_p
        _libc = c
    return _libc


_SENTINEL = 0xA5
_SLACK = 64


class FillCheck:
    """A buffer for a struct the library fills, longer than the mirror by _SLACK bytes of
    sentinel. After the call, ``check()`` verifies the library wrote nothing past the mirror."""

    def __init__(self, cls):
        self.cls = cls
        self.size = ctypes.sizeof(cls)
        self.buf = (c_char * (self.size + _SLACK))()
        ctypes.memset(self.buf, _SENTINEL, self.size + _SLACK)
        self.ptr = ctypes.addressof(self.buf)

    def check(self, what: str):
        tail = bytes(self.buf[self.size :])
        if tail != bytes([_SENTINEL]) * _SLACK:
            raise LibraryError(
                f"{_path}: the library wrote past the end of struct {what} as this package "
                f"declares it ({self.size} bytes): the package and the library disagree on the "
                "layout; use the package from the same convd version as the library"
            )
        return self.cls.from_buffer_copy(bytes(self.buf[: self.size]))


def check_layouts(lib: ctypes.CDLL) -> None:
    """Checks the structs the library fills without a daemon (problem, sizes) and the status
    table. Raises LibraryError on a mismatch."""
    f = FillCheck(Problem)
    lib.convd_problem_init(f.ptr, 2, 9, 7, 6, 4, 3, 2, 2)
    p = f.check("convd_problem")
    got = (p.n, p.h, p.w, p.c, p.k, p.r, p.s, p.groups, p.stride_h, p.stride_w, p.dil_h, p.dil_w)
    raw = bytes(f.buf[: f.size])
    # From has_bias on, everything is zero: the flags, the activation and its bounds (and an
    # older library, whose struct ends after the flags, leaves the sentinel there).
    flags = raw[Problem.has_bias.offset :]
    if (
        got != (2, 9, 7, 6, 4, 3, 2, 2, 1, 1, 1, 1)
        or (p.pad_top, p.pad_bottom, p.pad_left, p.pad_right) != (0, 0, 0, 0)
        or (p.dtype, p.layout) != (DTYPE_FP32, LAYOUT_NCHW)
        or flags != bytes(len(flags))
    ):
        raise LibraryError(f"{_path}: struct convd_problem differs from this package's mirror")
    p.pad_top, p.pad_bottom, p.pad_left, p.pad_right = 1, 0, 2, 0
    p.stride_w = 2
    p.dtype = DTYPE_FP16
    p.has_bias = True
    z = FillCheck(ProblemSizes)
    why = ctypes.create_string_buffer(256)
    rc = lib.convd_problem_sizes(ctypes.byref(p), z.ptr, why, 256)
    if rc != 0:
        raise LibraryError(f"{_path}: convd_problem_sizes refused a valid problem: {why.value!r}")
    s = z.check("convd_problem_sizes")
    # h 9 + pads 1 - 3 + 1 = 8 rows; w (7 + 2 - 2) // 2 + 1 = 4 columns.
    want = (8, 4, 2 * 6 * 9 * 7, 4 * 3 * 3 * 2, 4, 2 * 4 * 8 * 4)
    have = (s.out_h, s.out_w, s.input_elems, s.weight_elems, s.bias_elems, s.output_elems)
    if have != want or s.input_bytes != 2 * s.input_elems or s.bias_bytes != 8:
        raise LibraryError(
            f"{_path}: struct convd_problem_sizes differs from this package's mirror "
            f"(read {have}, expected {want})"
        )
    for name, value in STATUS.items():
        if lib.convd_status_name(value).decode() not in (name, "OK"):
            raise LibraryError(f"{_path}: status {value} is not {name} in this library")
