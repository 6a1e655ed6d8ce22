"""convd.torch.Conv2d and convd.torch.patch: results, which modules are replaced, weights held
across calls and copied again when they change, copies and pickles of patched models."""

from __future__ import annotations

import copy
import ctypes
import pickle

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import convd
import convd.torch
from conftest import TOL, rel_l2, served
from test_conv import torch_act


def ref(conv, x, act=None):
    y = F.conv2d(
        x.double(),
        conv.weight.double(),
        None if conv.bias is None else conv.bias.double(),
        conv.stride,
        conv.padding,
        conv.dilation,
        conv.groups,
    )
    return torch_act(act, y)


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_module_matches_functional(client, dtype):
    dt = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    for kw in (
        dict(in_channels=16, out_channels=32, kernel_size=3, padding=1, groups=4),
        dict(in_channels=8, out_channels=8, kernel_size=(2, 4), padding="same", groups=8, bias=False),
        dict(in_channels=6, out_channels=12, kernel_size=5, stride=2, dilation=2, padding=3),
        dict(in_channels=4, out_channels=6, kernel_size=1, padding="valid"),
    ):
        for act in (None, True, "relu6", ("clamp", -0.2, 0.3), "silu", "hardswish", "gelu",
                    "gelu_tanh"):
            akw = {"relu": True} if act is True else {"activation": act}
            m = convd.torch.Conv2d(**kw, client=client, **akw).to(dt)
            x = torch.randn(2, kw["in_channels"], 13, 11).to(dt)
            for xx in (x, x.to(memory_format=torch.channels_last), x[0]):
                with torch.no_grad():
                    y = m(xx)
                assert y.dtype == dt
                want = ref(m, xx, act).detach()
                assert rel_l2(y.double().numpy(), want.numpy()) <= TOL[dtype], (kw, act)
                if dt == torch.float32:  # PyTorch's CPU convolutions are fp32 only
                    # the same module without a client computes with PyTorch
                    m.convd_client = None
                    with torch.no_grad():
                        y_torch = m(xx)
                    m.convd_client = client
                    assert rel_l2(y_torch.double().numpy(), want.numpy()) <= TOL[dtype], (kw, act)


def test_weights_are_copied_once_and_again_when_they_change(client, monkeypatch):
    m = convd.torch.Conv2d(8, 16, 3, padding=1, client=client)
    x = torch.randn(1, 8, 10, 10)
    copies = []
    memmove = ctypes.memmove

    def counting(dst, src, n):
        copies.append(n)
        return memmove(dst, src, n)

    monkeypatch.setattr(ctypes, "memmove", counting)
    wbytes = m.weight.numel() * 4
    with torch.no_grad():
        m(x)
        assert wbytes in copies  # first call: weight (and bias) into the held block
        copies.clear()
        y = m(x)
        assert wbytes not in copies  # held: only the input in and the output out
        assert len(copies) == 2
        m.weight.mul_(-1)  # in place, as an optimizer step: the version changes
        copies.clear()
        y2 = m(x)
        assert wbytes in copies
        assert rel_l2(y2.numpy(), ref(m, x).numpy()) <= TOL["fp32"]
        assert rel_l2((y2 - m.bias.view(1, -1, 1, 1)).numpy(), (m.bias.view(1, -1, 1, 1) - y).numpy()) <= TOL["fp32"]
        m.weight = nn.Parameter(torch.randn_like(m.weight))  # a new tensor
        assert rel_l2(m(x).numpy(), ref(m, x).numpy()) <= TOL["fp32"]
        m.bias.zero_()
        assert rel_l2(m(x).numpy(), ref(m, x).numpy()) <= TOL["fp32"]
        # Changes through .data bypass the version counter: convd_refresh() says so.
        m.weight.data.mul_(2)
        m.convd_refresh()
        assert rel_l2(m(x).numpy(), ref(m, x).numpy()) <= TOL["fp32"]
        # channels_last input wants the weight in (K, R, S, C/G) order: held again.
        xc = x.to(memory_format=torch.channels_last)
        y3 = m(xc)
        assert y3.is_contiguous(memory_format=torch.channels_last)
        assert rel_l2(y3.numpy(), ref(m, x).numpy()) <= TOL["fp32"]


def test_patch_replaces_what_convd_can_serve(client):
    class Custom(nn.Conv2d):
        def forward(self, x):
            return super().forward(x) * 2

    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1, padding_mode="reflect"),
        nn.ModuleList([nn.Conv2d(8, 8, 1)]),
        nn.ModuleDict({"a": nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=2))}),
        Custom(8, 8, 1),
    )
    x = torch.randn(1, 3, 9, 9)

    def forward(mdl, x):
        x = mdl[1](mdl[0](x))
        x = mdl[2](x)
        x = mdl[3][0](x)
        x = mdl[4]["a"](x)
        return mdl[5](x)

    with torch.no_grad():
        want = forward(model, x)
    params = {k: v for k, v in model.named_parameters()}
    out = convd.torch.patch(model, client)
    assert out is model
    assert isinstance(model[0], convd.torch.Conv2d)
    assert type(model[2]) is nn.Conv2d  # reflect padding: untouched
    assert isinstance(model[3][0], convd.torch.Conv2d)
    assert isinstance(model[4]["a"][0], convd.torch.Conv2d)
    assert type(model[5]) is Custom  # a subclass with its own forward: untouched
    for k, v in model.named_parameters():
        assert v is params[k]  # the same Parameter objects
    before = served(client)
    with torch.no_grad():
        got = forward(model, x)
    assert served(client) - before == 3
    assert rel_l2(got.numpy(), want.numpy()) <= TOL["fp32"]

    bare = nn.Conv2d(3, 4, 3)
    p = convd.torch.patch(bare, client)
    assert isinstance(p, convd.torch.Conv2d) and p.weight is bare.weight


def test_patched_models_copy_and_pickle(daemon):
    with daemon.connect() as c:
        model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 1))
        x = torch.randn(2, 3, 8, 8)
        with torch.no_grad():
            want = model(x)
        convd.torch.patch(model, c)
        for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
            assert other[0].convd_client is None  # computes with PyTorch until patched again
            with torch.no_grad():
                assert rel_l2(other(x).numpy(), want.numpy()) <= TOL["fp32"]
            convd.torch.patch(other, c)
            assert other[0].convd_client is c
            with torch.no_grad():
                assert rel_l2(other(x).numpy(), want.numpy()) <= TOL["fp32"]


def test_unpatched_module_and_errors(client):
    m = convd.torch.Conv2d(4, 4, 3, padding=1)  # no client: PyTorch computes
    x = torch.randn(1, 4, 5, 5)
    with torch.no_grad():
        assert rel_l2(m(x).numpy(), ref(m, x).numpy()) <= TOL["fp32"]
    m.convd_client = client
    with pytest.raises(convd.Error) as e:
        m(x.double())
    assert e.value.code == "EUNSUPPORTED"
    with torch.no_grad():
        assert rel_l2(m(x).numpy(), ref(m, x).numpy()) <= TOL["fp32"]
    assert "convd" in repr(m)


def test_module_made_under_inference_mode(client):
    """Parameters made under torch.inference_mode() are inference tensors, without a version
    counter: the module still serves them, and convd_refresh() picks up an in-place change."""
    with torch.inference_mode():
        model = convd.torch.patch(nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.ReLU()), client)
        x = torch.randn(1, 4, 7, 7)
        assert rel_l2(model(x).numpy(), torch.relu(ref(model[0], x)).numpy()) <= TOL["fp32"]
        model[0].weight.mul_(3)
        model[0].convd_refresh()
        assert rel_l2(model(x).numpy(), torch.relu(ref(model[0], x)).numpy()) <= TOL["fp32"]
