"""Random problems through the daemon against torch.nn.functional.conv2d (computed in float64 from
the same rounded inputs): every dtype, both layouts, numpy and torch, every argument form.
Outputs are poisoned with NaN when the package allocates them, so an element the daemon did not
write fails the comparison."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import TOL, rel_l2

DTYPES = ["fp32", "fp16", "bf16"]
TORCH_DT = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Every output buffer starts as NaN (fp32/fp16) or 0xFFFF (bf16, a NaN too)."""
    np_empty = np.empty
    torch_empty = torch.empty

    def empty_np(shape, dtype=float, *a, **kw):
        out = np_empty(shape, dtype, *a, **kw)
        if out.ndim > 0 and out.size > 0 and out.flags.c_contiguous:
            out.reshape(-1).view(np.uint8).fill(0xFF)
        return out

    def empty_torch(*a, **kw):
        out = torch_empty(*a, **kw)
        if out.is_floating_point():
            out.fill_(float("nan"))
        return out

    monkeypatch.setattr(np, "empty", empty_np)
    monkeypatch.setattr(torch, "empty", empty_torch)


# The activations conv2d() takes, None and relu=True twice as often, with PyTorch's own.
ACTS = [None, None, True, True, "relu6", ("clamp", -0.3, 0.4), "silu", "hardswish", "gelu",
        "gelu_tanh"]
TORCH_ACT = {
    None: lambda y: y,
    True: F.relu,
    "relu6": F.relu6,
    "silu": F.silu,
    "hardswish": F.hardswish,
    "gelu": F.gelu,
    "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"),
}


def torch_act(act, y):
    if isinstance(act, tuple):
        return torch.clamp(y, act[1], act[2])
    return TORCH_ACT[act](y)


def random_problem(rng):
    """A problem in F.conv2d's argument forms: shapes, stride/padding/dilation as ints, pairs
    or words, bias, an activation (relu as relu=True, or by name), sometimes unbatched."""
    while True:
        kind = rng.integers(0, 4)
        if kind == 0:  # depthwise, sometimes with a channel multiplier
            g = int(rng.integers(2, 9))
            cpg, kpg = 1, int(rng.choice([1, 2]))
        elif kind == 1:  # dense
            g, cpg, kpg = 1, int(rng.integers(1, 9)), int(rng.integers(1, 9))
        else:  # grouped
            g = int(rng.choice([2, 3, 4, 8]))
            cpg, kpg = int(rng.choice([1, 2, 3, 4, 8])), int(rng.choice([1, 2, 3, 5]))
        n = int(rng.integers(1, 3))
        h, w = (int(v) for v in rng.integers(3, 15, size=2))
        r, s = (int(v) for v in rng.integers(1, 6, size=2))
        stride = [1, 2, (1, 2), (2, 1), [2, 2]][rng.integers(0, 5)]
        dil = [1, 1, 2, (2, 1)][rng.integers(0, 4)]
        pads = [0, 1, (1, 2), "valid", 2]
        if stride in (1,) or stride == (1, 1):
            pads += ["same", "same"]
        padding = pads[rng.integers(0, len(pads))]
        sh, sw = (stride, stride) if isinstance(stride, int) else tuple(stride)
        dh, dw = (dil, dil) if isinstance(dil, int) else dil
        if padding == "same":
            ph = pw = 0
        elif padding == "valid":
            ph = pw = 0
        else:
            ph, pw = (padding, padding) if isinstance(padding, int) else padding
        if dh * (r - 1) + 1 > h + 2 * ph or dw * (s - 1) + 1 > w + 2 * pw:
            continue
        return dict(
            n=n, c=g * cpg, k=g * kpg, h=h, w=w, r=r, s=s, groups=g, stride=stride,
            padding=padding, dilation=dil, bias=bool(rng.integers(0, 2)),
            act=ACTS[rng.integers(0, len(ACTS))], unbatched=bool(rng.integers(0, 6) == 0),
        )


def make_data(rng, p, dtype):
    """float32 arrays rounded to dtype, and the same values as float64 torch tensors."""
    x = rng.standard_normal((p["n"], p["c"], p["h"], p["w"]), dtype=np.float32)
    wt = rng.standard_normal((p["k"], p["c"] // p["groups"], p["r"], p["s"]), dtype=np.float32)
    wt *= 1.0 / np.sqrt(wt[0].size)
    b = rng.standard_normal(p["k"], dtype=np.float32) if p["bias"] else None
    t = [torch.from_numpy(a).to(TORCH_DT[dtype]) if a is not None else None for a in (x, wt, b)]
    return t


def reference(p, x, w, b):
    args = {k: p[k] for k in ("stride", "padding", "dilation", "groups")}
    stride = args["stride"]
    args["stride"] = tuple(stride) if isinstance(stride, list) else stride
    y = F.conv2d(x.double(), w.double(), None if b is None else b.double(), **args)
    return torch_act(p["act"], y)


def to_numpy(t, dtype):
    if t is None:
        return None
    if dtype == "bf16":
        return t.contiguous().view(torch.int16).numpy().view(np.uint16).copy()
    return t.contiguous().numpy().copy()


def from_numpy(a, dtype):
    if dtype == "bf16":
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16).double()
    return torch.from_numpy(np.ascontiguousarray(a)).double()


def call_args(p):
    kw = dict(stride=p["stride"], padding=p["padding"], dilation=p["dilation"], groups=p["groups"])
    if p["act"] is True:
        kw["relu"] = True
    elif p["act"] is not None:
        kw["activation"] = p["act"]
    return kw


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_numpy_random_problems(client, rng, dtype, layout):
    for _ in range(12):
        p = random_problem(rng)
        xt, wt, bt = make_data(rng, p, dtype)
        want = reference(p, xt, wt, bt)
        x, w, b = to_numpy(xt, dtype), to_numpy(wt, dtype), to_numpy(bt, dtype)
        if layout == "nhwc":
            x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
            w = np.ascontiguousarray(w.transpose(0, 2, 3, 1))
            want = want.permute(0, 2, 3, 1)
        if p["unbatched"]:
            x, want = x[0], want[0]
        kw = call_args(p)
        if dtype == "bf16":
            kw["dtype"] = "bf16"
        if layout == "nhwc":
            kw["layout"] = "nhwc"
        y = client.conv2d(x, w, b, **kw)
        assert isinstance(y, np.ndarray)
        assert y.dtype == x.dtype
        err = rel_l2(from_numpy(y, dtype), want)
        assert err <= TOL[dtype], f"{p} {dtype} {layout}: relative L2 error {err:.3g}"


def _tf32_flags(client):
    return sorted({plan.problem.allow_tf32 for plan in client._plans.values()})


def test_allow_tf32_reaches_the_problem(client, rng):
    """allow_tf32 travels for fp32 only; None follows PyTorch: exact for numpy and CPU tensors
    whatever torch.backends.cudnn.allow_tf32 says (the CPU daemon computes exact fp32 anyway)."""
    x = rng.standard_normal((2, 8, 9, 9)).astype(np.float32)
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    want = F.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), groups=2)
    client._plans.clear()
    assert rel_l2(client.conv2d(x, w, groups=2, allow_tf32=True), want) <= TOL["fp32"]
    assert _tf32_flags(client) == [True]
    client._plans.clear()
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    try:
        client.conv2d(x, w, groups=2)
        client.conv2d(torch.from_numpy(x), torch.from_numpy(w), groups=2)
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    assert _tf32_flags(client) == [False]
    client._plans.clear()
    h = client.conv2d(x.astype(np.float16), w.astype(np.float16), groups=2, allow_tf32=True)
    assert h.dtype == np.float16 and _tf32_flags(client) == [False]


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_random_problems(client, rng, dtype, channels_last):
    for _ in range(12):
        p = random_problem(rng)
        x, w, b = make_data(rng, p, dtype)
        want = reference(p, x, w, b)
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
        if p["unbatched"]:
            x, want = x[0], want[0]
        y = client.conv2d(x, w, b, **call_args(p))
        assert isinstance(y, torch.Tensor)
        assert y.dtype == TORCH_DT[dtype] and y.device.type == "cpu"
        assert y.shape == want.shape
        if channels_last and not p["unbatched"] and y.shape[1] > 1 and y.shape[2] * y.shape[3] > 1:
            assert y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous()
        elif not channels_last:
            assert y.is_contiguous()
        err = rel_l2(y.double().numpy(), want.numpy())
        assert err <= TOL[dtype], f"{p} {dtype} channels_last={channels_last}: error {err:.3g}"


def test_argument_forms_match_torch(client, rng):
    """Each accepted spelling of stride, padding and dilation, against F.conv2d's reading of
    the same spelling; 'same' with even kernels pads the odd pixel at the bottom and right."""
    x = torch.randn(2, 6, 11, 10)
    cases = [
        (torch.randn(6, 3, 2, 4), dict(padding="same", groups=2)),
        (torch.randn(6, 3, 4, 2), dict(padding="same", dilation=(2, 3), groups=2)),
        (torch.randn(4, 6, 3, 3), dict(padding="valid")),
        (torch.randn(4, 6, 3, 3), dict(stride=[2], padding=[1])),
        (torch.randn(4, 6, 3, 3), dict(stride=(2, 1), padding=(0, 2), dilation=[1, 2])),
        (torch.randn(6, 1, 3, 3), dict(padding=1, groups=6)),
        (torch.randn(12, 1, 5, 5), dict(padding=2, groups=6, stride=2)),
        (torch.randn(4, 6, 1, 1), dict()),
        (torch.randn(3, 2, 3, 3), dict(padding=np.int64(1), groups=np.int32(3))),
    ]
    for w, kw in cases:
        want = F.conv2d(x, w, **{k: (tuple(v) if isinstance(v, list) else v) for k, v in kw.items()})
        got = client.conv2d(x, w, **kw)
        assert rel_l2(got.numpy(), want.numpy()) <= TOL["fp32"], kw
        got = client.conv2d(x.numpy(), w.numpy(), **kw)
        assert rel_l2(got, want.numpy()) <= TOL["fp32"], kw


def test_noncontiguous_inputs(client, rng):
    base = rng.standard_normal((2, 8, 12, 20), dtype=np.float32)
    x = base[:, ::2, :, ::2]  # strided view
    w = rng.standard_normal((3, 3, 4, 5), dtype=np.float32).transpose(3, 2, 0, 1)  # (5, 4, 3, 3)
    b = rng.standard_normal(10, dtype=np.float32)[::2]
    want = F.conv2d(torch.from_numpy(x.copy()), torch.from_numpy(w.copy()), torch.from_numpy(b.copy()), padding=1)
    assert rel_l2(client.conv2d(x, w, b, padding=1), want.numpy()) <= TOL["fp32"]
    xt = torch.from_numpy(base).permute(0, 2, 3, 1)[..., :4].permute(0, 3, 1, 2)  # odd strides
    wt = torch.from_numpy(w.copy())
    want = F.conv2d(xt, wt, padding=1)
    assert rel_l2(client.conv2d(xt, wt, padding=1).numpy(), want.numpy()) <= TOL["fp32"]


def test_every_path_gives_the_same_answer(client, rng):
    """The blocking call, a future, a priority, region-backed input: same numbers."""
    x = rng.standard_normal((2, 16, 9, 9), dtype=np.float32)
    w = rng.standard_normal((16, 4, 3, 3), dtype=np.float32)
    b = rng.standard_normal(16, dtype=np.float32)
    want = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), padding=1, groups=4).numpy()
    outs = [
        client.conv2d(x, w, b, padding=1, groups=4),
        client.submit(x, w, b, padding=1, groups=4).result(),
        client.conv2d(x, w, b, padding=1, groups=4, priority=2),
    ]
    e = client.empty(x.shape)
    e[...] = x
    outs.append(client.conv2d(e, w, b, padding=1, groups=4))
    for y in outs:
        assert rel_l2(y, want) <= TOL["fp32"]


def test_consecutive_calls_do_not_see_each_other(client, rng):
    """Staging is reused between calls: each output must come from its own input."""
    w = rng.standard_normal((8, 8, 3, 3), dtype=np.float32)
    xs = [rng.standard_normal((1, 8, 7, 7), dtype=np.float32) for _ in range(4)]
    futs = [client.submit(x, w, padding=1) for x in xs]
    for x, f in zip(xs, futs):
        want = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1).numpy()
        assert rel_l2(f.result(), want) <= TOL["fp32"]
        assert rel_l2(client.conv2d(x, w, padding=1), want) <= TOL["fp32"]
