"""The four torchvision models of issue 18, random weights (no download), batch 1 at 224x224:
patched through convd.torch.patch against the same model unpatched, fp32, within 1e-4 relative
L2, in NCHW and channels_last. Each patched forward must send every convolution to the daemon
(its served count grows by the number of Conv2d modules), and convd's outputs are poisoned with
NaN when allocated, so a convolution the daemon did not compute cannot pass."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torchvision

import convd.torch
from conftest import rel_l2, served

MODELS = ["resnext50_32x4d", "regnet_y_400mf", "mobilenet_v3_small", "convnext_tiny"]
SIZE = 224


@pytest.fixture
def poisoned_torch_empty(monkeypatch):
    torch_empty = torch.empty

    def empty(*a, **kw):
        out = torch_empty(*a, **kw)
        if out.is_floating_point():
            out.fill_(float("nan"))
        return out

    monkeypatch.setattr(torch, "empty", empty)


@pytest.mark.parametrize("name", MODELS)
def test_model_patched_matches_unpatched(client, name, poisoned_torch_empty):
    torch.manual_seed(hash(name) & 0xFFFF)
    model = getattr(torchvision.models, name)(weights=None).eval()
    n_convs = sum(type(m) is torch.nn.Conv2d for m in model.modules())
    patched = convd.torch.patch(copy.deepcopy(model), client)
    assert sum(isinstance(m, convd.torch.Conv2d) for m in patched.modules()) == n_convs
    assert not any(type(m) is torch.nn.Conv2d for m in patched.modules())
    assert patched.state_dict().keys() == model.state_dict().keys()

    for channels_last in (False, True):
        x = torch.randn(1, 3, SIZE, SIZE)
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
        with torch.no_grad():
            want = model(x)
            before = served(client)
            got = patched(x)
            assert served(client) - before == n_convs
        err = rel_l2(got.numpy(), want.numpy())
        assert err <= 1e-4, f"{name} channels_last={channels_last}: relative L2 {err:.3g}"

    # Trained weights change in place (an optimizer step, load_state_dict): the patched model
    # copies them again and still agrees.
    state = {k: v * 1.5 if k.endswith("weight") and v.dim() == 4 else v for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    patched.load_state_dict(state)
    x = torch.randn(1, 3, SIZE, SIZE)
    with torch.no_grad():
        want = model(x)
        got = patched(x)
    assert rel_l2(got.numpy(), want.numpy()) <= 1e-4
    assert np.isfinite(got.numpy()).all()
