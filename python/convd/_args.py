"""Arguments as torch.nn.functional.conv2d takes them, turned into a convd problem, and the plan
that a problem's calls share (the problem struct, sizes, staging offsets, output shape)."""

from __future__ import annotations

import ctypes
import numbers
import sys

import numpy as np

from convd import _lib
from convd._errors import Error, invalid

# Tensors in a staging region start at multiples of this (the C client's convd_conv() uses the
# same), so that every dtype is aligned and each tensor starts on a cache line.
ALIGN = 256

DTYPE_NAMES = {_lib.DTYPE_FP32: "fp32", _lib.DTYPE_FP16: "fp16", _lib.DTYPE_BF16: "bf16"}
_DTYPE_WORDS = {
    "fp32": _lib.DTYPE_FP32,
    "float32": _lib.DTYPE_FP32,
    "float": _lib.DTYPE_FP32,
    "fp16": _lib.DTYPE_FP16,
    "float16": _lib.DTYPE_FP16,
    "half": _lib.DTYPE_FP16,
    "bf16": _lib.DTYPE_BF16,
    "bfloat16": _lib.DTYPE_BF16,
}
# What numpy holds each dtype as: bf16 travels as its uint16 bit patterns.
NP_DTYPE = {
    _lib.DTYPE_FP32: np.dtype(np.float32),
    _lib.DTYPE_FP16: np.dtype(np.float16),
    _lib.DTYPE_BF16: np.dtype(np.uint16),
}
_NP_CODE = {np.dtype(np.float32): _lib.DTYPE_FP32, np.dtype(np.float16): _lib.DTYPE_FP16}


def dtype_code(spec) -> int:
    """'fp32' / 'fp16' / 'bf16' (or 'float32', 'bfloat16', ...), a numpy dtype, or a torch
    dtype, as a convd dtype."""
    if isinstance(spec, str):
        code = _DTYPE_WORDS.get(spec.lower())
        if code is None:
            raise invalid(f"dtype {spec!r} is not one of 'fp32', 'fp16', 'bf16'")
        return code
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(spec, torch.dtype):
        code = {torch.float32: 1, torch.float16: 2, torch.bfloat16: 3}.get(spec)
        if code is None:
            raise Error("EUNSUPPORTED", f"convd computes in fp32, fp16 and bf16, not {spec}")
        return code
    try:
        dt = np.dtype(spec)
    except TypeError:
        raise invalid(f"dtype {spec!r} is not one of 'fp32', 'fp16', 'bf16'") from None
    return np_code(dt, None)


def np_code(dt: np.dtype, explicit: int | None) -> int:
    """The convd dtype of a numpy array's dtype. uint16 (and ml_dtypes' bfloat16) hold bf16 bit
    patterns; an explicit dtype= must agree."""
    code = _NP_CODE.get(dt)
    if code is None and (dt == np.uint16 or (dt.name == "bfloat16" and dt.itemsize == 2)):
        code = _lib.DTYPE_BF16
    if code is None:
        raise Error(
            "EUNSUPPORTED",
            f"convd computes in fp32, fp16 and bf16; numpy arrays of {dt} are none of them "
            "(cast with .astype(np.float32), or pass bf16 as uint16 bit patterns with "
            "dtype='bf16')",
        )
    if explicit is not None and explicit != code:
        raise invalid(
            f"dtype={DTYPE_NAMES[explicit]!r} was asked for, but the arrays hold {dt} "
            f"({DTYPE_NAMES[code]})"
        )
    return code


def _int(v, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise invalid(f"{what} must be an int or a pair of ints, not {v!r}")
    return int(v)


_ACTIVATIONS = {
    "none": _lib.ACT_NONE,
    "relu": _lib.ACT_RELU,
    "silu": _lib.ACT_SILU,
    "swish": _lib.ACT_SILU,
    "hardswish": _lib.ACT_HARDSWISH,
    "gelu": _lib.ACT_GELU,
    "gelu_tanh": _lib.ACT_GELU_TANH,
}
_ACT_WORDS = "'relu', 'relu6', 'silu', 'hardswish', 'gelu', 'gelu_tanh' or ('clamp', lo, hi)"


def activation_spec(relu, activation) -> tuple[int, float, float]:
    """The (activation, act_min, act_max) of the C problem for conv2d()'s relu and activation
    arguments: a name, 'relu6' (a clamp to [0, 6]), or ('clamp', lo, hi)."""
    if activation is None:
        return (_lib.ACT_RELU, 0.0, 0.0) if relu else (_lib.ACT_NONE, 0.0, 0.0)
    if isinstance(activation, str):
        name = activation.lower()
        if name == "relu6":
            spec = (_lib.ACT_CLAMP, 0.0, 6.0)
        elif name in _ACTIVATIONS:
            spec = (_ACTIVATIONS[name], 0.0, 0.0)
        else:
            raise invalid(f"activation={activation!r} is not one of {_ACT_WORDS}")
    elif (
        isinstance(activation, (tuple, list))
        and len(activation) == 3
        and activation[0] == "clamp"
        and all(isinstance(v, numbers.Real) for v in activation[1:])
    ):
        lo, hi = float(activation[1]), float(activation[2])
        if not lo <= hi:
            raise invalid(f"activation={activation!r}: clamp needs lo <= hi, both numbers")
        spec = (_lib.ACT_CLAMP, lo, hi)
    else:
        raise invalid(f"activation={activation!r} is not one of {_ACT_WORDS}")
    if relu and spec[0] not in (_lib.ACT_NONE, _lib.ACT_RELU):
        raise invalid(f"relu=True and activation={activation!r} ask for two activations")
    return (_lib.ACT_RELU, 0.0, 0.0) if relu and spec[0] == _lib.ACT_NONE else spec


def pair(v, what: str) -> tuple[int, int]:
    """An int or a sequence of one or two ints, as F.conv2d's stride, padding and dilation."""
    if isinstance(v, (tuple, list)):
        if len(v) == 1:
            a = _int(v[0], what)
            return a, a
        if len(v) == 2:
            return _int(v[0], what), _int(v[1], what)
        raise invalid(f"{what} must be an int or a pair of ints, not {v!r}")
    a = _int(v, what)
    return a, a


def paddings(padding, r: int, s: int, stride: tuple, dil: tuple) -> tuple[int, int, int, int]:
    """(top, bottom, left, right). 'same' pads dil*(k-1) in each dimension, the odd pixel at the
    bottom and right as PyTorch does; it needs stride 1, as PyTorch's does."""
    if isinstance(padding, str):
        word = padding.lower()
        if word == "valid":
            return 0, 0, 0, 0
        if word == "same":
            if stride != (1, 1):
                raise invalid(
                    f"padding='same' is not supported for strided convolutions (stride {stride})"
                )
            th, tw = dil[0] * (r - 1), dil[1] * (s - 1)
            return th // 2, th - th // 2, tw // 2, tw - tw // 2
        raise invalid(f"padding {padding!r} is not an int, a pair, 'same' or 'valid'")
    ph, pw = pair(padding, "padding")
    return ph, ph, pw, pw


class Plan:
    """Everything about one problem that does not depend on the data: built once per distinct
    call signature and reused (Client keeps them in a dict)."""

    __slots__ = (
        "problem",
        "dtype",
        "layout",
        "esz",
        "out_shape",
        "squeeze",
        "x_bytes",
        "w_bytes",
        "b_bytes",
        "o_bytes",
        "w_off",
        "b_off",
        "o_off",
        "total",
        "has_bias",
        "text",
        "args",
        "where",
    )

    def conv_args(self):
        """The plan's struct convd_conv_args, made once: calls fill in the tensors and the
        priority under the client's lock (the library copies the struct when it submits)."""
        a = self.args
        if a is None:
            a = self.args = _lib.ConvArgs()
            a.struct_size = ctypes.sizeof(a)
            a.problem = self.problem
        return a


def _align(v: int) -> int:
    return (v + ALIGN - 1) // ALIGN * ALIGN


def make_plan(
    lib,
    *,
    dtype: int,
    layout: int,
    xshape: tuple,
    wshape: tuple,
    bshape,
    stride,
    padding,
    dilation,
    groups,
    act,
    allow_tf32: bool = False,
    out_nhwc_order: bool,
    squeeze: bool,
) -> Plan:
    """Checks a call's shapes and arguments and builds its Plan. xshape and wshape are 4-D, in
    (N, C, H, W) and (K, C/G, R, S) order whatever the layout; out_nhwc_order says whether the
    caller's output shape is (N, Ho, Wo, K) (numpy NHWC) rather than (N, K, Ho, Wo); squeeze,
    that the caller's input had no batch dimension, so neither has the output."""
    n, c, h, w = (int(d) for d in xshape)
    k, cg, r, s = (int(d) for d in wshape)
    sh, sw = pair(stride, "stride")
    dh, dw = pair(dilation, "dilation")
    g = _int(groups, "groups")
    pt, pb, pl, pr = paddings(padding, r, s, (sh, sw), (dh, dw))

    p = _lib.Problem(n, h, w, c, k, r, s, g, sh, sw, pt, pb, pl, pr, dh, dw, dtype, layout)
    p.has_bias = bshape is not None
    # A permission that only fp32 has: ignored for the 16-bit types, as PyTorch's flag is.
    p.allow_tf32 = bool(allow_tf32) and dtype == _lib.DTYPE_FP32
    p.activation, p.act_min, p.act_max = act
    z = _lib.ProblemSizes()
    why = ctypes.create_string_buffer(256)
    rc = lib.convd_problem_sizes(ctypes.byref(p), ctypes.byref(z), why, 256)
    if rc != 0:
        raise Error(rc, why.value.decode(errors="replace"))
    if cg * g != c:
        raise Error(
            "EBADSHAPE",
            f"the weight has {cg} input channels per group, but the input's {c} channels in "
            f"{g} groups make {c // g} per group",
        )
    if bshape is not None and tuple(bshape) != (k,):
        raise Error("EBADSHAPE", f"the bias has shape {tuple(bshape)}; it must be ({k},)")

    plan = Plan()
    plan.args = None
    plan.where = None  # what plan.args names now (Client._host_request)
    plan.problem = p
    plan.dtype = dtype
    plan.layout = layout
    plan.esz = 4 if dtype == _lib.DTYPE_FP32 else 2
    plan.has_bias = p.has_bias
    ho, wo = z.out_h, z.out_w
    plan.out_shape = (n, ho, wo, k) if out_nhwc_order else (n, k, ho, wo)
    plan.squeeze = squeeze
    plan.x_bytes = z.input_bytes
    plan.w_bytes = z.weight_bytes
    plan.b_bytes = z.bias_bytes
    plan.o_bytes = z.output_bytes
    plan.w_off = _align(z.input_bytes)
    plan.b_off = _align(plan.w_off + z.weight_bytes)
    plan.o_off = _align(plan.b_off + z.bias_bytes)
    plan.total = plan.o_off + z.output_bytes
    buf = ctypes.create_string_buffer(160)
    plan.text = lib.convd_problem_str(ctypes.byref(p), buf, 160).decode(errors="replace")
    return plan
