#!/usr/bin/env python3
"""convd from numpy: one convolution, a few in flight at once, the same from asyncio, and input
that already lives in memory the daemon has mapped.

    CONVD_SOCKET=/tmp/convd.sock python3 python/examples/conv2d.py
"""
import asyncio

import numpy as np

import convd

rng = np.random.default_rng(0)
x = rng.standard_normal((1, 64, 28, 28), dtype=np.float32)
w = rng.standard_normal((64, 2, 3, 3), dtype=np.float32)  # 32 groups of 2 channels
b = rng.standard_normal(64, dtype=np.float32)

with convd.connect() as client:
    # torch.nn.functional.conv2d's arguments, plus a fused ReLU.
    y = client.conv2d(x, w, b, stride=1, padding="same", groups=32, relu=True)
    print("conv2d:", y.shape, y.dtype)

    # Several in flight: submit() returns at once, result() waits.
    futures = [client.submit(x * i, w, b, padding=1, groups=32) for i in range(8)]
    print("submit:", [f.result().shape for f in futures][:2], "...")

    # asyncio: the event loop runs while the daemon computes.
    async def main():
        return await asyncio.gather(*[client.conv2d_async(x, w, padding=1, groups=32) for _ in range(4)])

    print("asyncio:", len(asyncio.run(main())), "results")

    # Input in a region: the request names it in place instead of copying it.
    xr = client.empty(x.shape, "fp32")
    xr[...] = x
    print("empty():", np.allclose(client.conv2d(xr, w, b, padding="same", groups=32, relu=True), y))

    # Mistakes raise convd.Error with the status name and a sentence; the client goes on.
    try:
        client.conv2d(x, w, groups=3)
    except convd.Error as e:
        print("error:", e.code, "-", e.message)
    print(client.status()["requests_served"], "requests served by", client.info["backend"])
