#!/usr/bin/env python3
"""A torchvision model with every convolution computed by the convd daemon.

    CONVD_SOCKET=/tmp/convd.sock python3 python/examples/patch_model.py [resnext50_32x4d] [--cuda]

Builds the model with random weights (nothing is downloaded), runs it once as it is and once
patched through convd, and prints how far apart the outputs are, how long each forward took,
and how many convolutions the daemon served.
"""
import copy
import sys
import time

import torch
import torchvision

import convd
import convd.torch

name = next((a for a in sys.argv[1:] if not a.startswith("-")), "resnext50_32x4d")
device = "cuda" if "--cuda" in sys.argv else "cpu"

model = getattr(torchvision.models, name)(weights=None).eval().to(device)
x = torch.randn(1, 3, 224, 224, device=device)

with convd.connect() as client, torch.no_grad():
    patched = convd.torch.patch(copy.deepcopy(model), client)
    served = client.status()["requests_served"]
    t0 = time.perf_counter()
    want = model(x)
    t1 = time.perf_counter()
    got = patched(x)
    t2 = time.perf_counter()
    served = client.status()["requests_served"] - served
    err = ((got - want).norm() / want.norm()).item()
    print(f"{name} on {device}, daemon {client.info['backend']} ({client.info['device']})")
    print(f"PyTorch {1e3 * (t1 - t0):.1f} ms, through convd {1e3 * (t2 - t1):.1f} ms "
          f"({served} convolutions served), relative L2 difference {err:.2e}")
    sys.exit(0 if err <= 1e-4 else 1)
