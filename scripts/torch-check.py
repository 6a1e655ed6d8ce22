#!/usr/bin/env python3
"""Independent end-to-end check: PyTorch's conv2d against convd through `convctl conv`.

For each problem it draws fresh random tensors with torch, writes them as .npy files (bf16 as
uint16 bit patterns), runs `convctl conv` against a running daemon, reads the output back and
compares with torch.nn.functional.conv2d computed in float64 from the same (rounded) inputs, on
the GPU when torch sees one (PyTorch's own kernels, not convd's), else on the CPU. Relative L2
error must be under 1e-5 for fp32 and 1e-2 for fp16/bf16.

Usage: torch-check.py --convctl build/bin/convctl --socket /path/convd.sock [--count N] [--seed S]
                      [--shapes CSV]...
--shapes adds every row of a shapes CSV (bench/shapes.csv's columns: name,n,h,w,c,k,r,s,stride,
pad,dil,groups) at its full size, each in one dtype and layout, taken in turn from the six
combinations so that a CSV of six or more rows covers them all.
Needs numpy and torch. Exit status 0 when every problem passed.
"""
import argparse
import os
import random
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

TOL = {"fp32": 1e-5, "fp16": 1e-2, "bf16": 1e-2}
REF_DEVICE = "cpu"
TORCH_DTYPE = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

# Shapes chosen to be unlike bench/shapes.csv: odd channels per group, non-square filters,
# asymmetric padding, dilation, stride 2, tiny and wide images.
FIXED = [
    # n, c, h, w, k, r, s, groups, stride, pad (t,b,l,r), dil
    (3, 30, 17, 11, 45, 3, 3, 15, (1, 1), (1, 1, 1, 1), (1, 1)),      # cpg 2, kpg 3
    (2, 72, 20, 20, 72, 3, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1)),       # cpg 24, stride 2
    (1, 40, 9, 31, 40, 5, 3, 8, (1, 1), (2, 2, 1, 1), (1, 1)),        # cpg 5, 5x3 filter
    (4, 96, 14, 14, 96, 3, 3, 96, (1, 1), (1, 1, 1, 1), (2, 2)),      # depthwise, dilated
    (2, 48, 13, 13, 96, 3, 3, 48, (2, 1), (0, 1, 1, 0), (1, 1)),      # channel multiplier 2
    (2, 64, 12, 12, 128, 1, 1, 2, (1, 1), (0, 0, 0, 0), (1, 1)),      # 1x1, cpg 32
    (1, 256, 8, 8, 256, 3, 3, 8, (1, 1), (1, 1, 1, 1), (1, 1)),       # cpg 32
    (2, 64, 10, 9, 48, 3, 3, 1, (1, 1), (1, 1, 1, 1), (1, 1)),        # dense
    (1, 9, 5, 7, 6, 2, 4, 3, (1, 2), (0, 1, 2, 3), (2, 1)),           # everything odd
]


def to_npy(t, dtype):
    a = t.detach().cpu().contiguous()
    if dtype == "bf16":
        return a.view(torch.int16).numpy().view(np.uint16)
    return a.numpy()


def from_npy(a, dtype):
    if dtype == "bf16":
        return torch.from_numpy(a.astype(np.uint16).view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


# convctl's --act values and PyTorch's functions for them; none and relu half the time.
ACTS = {
    "none": lambda y: y,
    "relu": F.relu,
    "relu6": F.relu6,
    "clamp:-0.5,0.25": lambda y: torch.clamp(y, -0.5, 0.25),
    "silu": F.silu,
    "hardswish": F.hardswish,
    "gelu": F.gelu,
    "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"),
}


def pick_act(pr):
    names = list(ACTS)
    return names[pr.randrange(2)] if pr.random() < 0.5 else names[pr.randrange(2, len(names))]


def check(convctl, socket, tmp, prob, dtype, layout, bias, act, rng):
    n, c, h, w, k, r, s, g, stride, pad, dil = prob
    td = TORCH_DTYPE[dtype]
    x = (torch.rand(n, c, h, w, generator=rng) * 2 - 1).to(td)
    wt = (torch.rand(k, c // g, r, s, generator=rng) * 2 - 1).to(td)
    b = (torch.rand(k, generator=rng) * 2 - 1).to(td) if bias else None

    # reference in float64 from the rounded inputs; asymmetric padding through F.pad. On the GPU
    # when torch sees one (full-size shapes in float64 take minutes on the CPU), else the CPU.
    xp = F.pad(x.double().to(REF_DEVICE), (pad[2], pad[3], pad[0], pad[1]))
    ref = F.conv2d(xp, wt.double().to(REF_DEVICE),
                   None if b is None else b.double().to(REF_DEVICE), stride=stride, padding=0,
                   dilation=dil, groups=g)
    ref = ACTS[act](ref).cpu()

    if layout == "nhwc":
        xs, ws = x.permute(0, 2, 3, 1), wt.permute(0, 2, 3, 1)
    else:
        xs, ws = x, wt
    paths = {name: os.path.join(tmp, name + ".npy") for name in ("x", "w", "b", "y")}
    np.save(paths["x"], to_npy(xs, dtype))
    np.save(paths["w"], to_npy(ws, dtype))
    cmd = [convctl, "--socket", socket, "conv", "--input", paths["x"], "--weight", paths["w"],
           "--output", paths["y"], "--groups", str(g), "--layout", layout, "--dtype", dtype,
           "--stride", "%d,%d" % stride, "--pad", "%d,%d,%d,%d" % pad,
           "--dilation", "%d,%d" % dil]
    if b is not None:
        np.save(paths["b"], to_npy(b, dtype))
        cmd += ["--bias", paths["b"]]
    if act != "none":
        cmd += ["--act", act]
    t0 = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True)
    ms = (time.monotonic() - t0) * 1e3
    if res.returncode != 0:
        return False, "convctl failed (%d): %s" % (res.returncode, res.stderr.strip()), ms
    y = from_npy(np.load(paths["y"]), dtype).double()
    if layout == "nhwc":
        y = y.permute(0, 3, 1, 2)
    if tuple(y.shape) != tuple(ref.shape):
        return False, "shape %s, expected %s" % (tuple(y.shape), tuple(ref.shape)), ms
    if not torch.isfinite(y).all():
        return False, "non-finite output", ms
    err = ((y - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    return err < TOL[dtype], "rel err %.2e (tol %.0e)" % (err, TOL[dtype]), ms


def random_problem(pr):
    g = pr.choice([1, 2, 3, 4, 7, 16])
    cpg, kpg = pr.choice([1, 2, 3, 5, 8, 16, 24]), pr.choice([1, 2, 3, 8, 16])
    r, s = pr.randint(1, 5), pr.randint(1, 5)
    h, w = pr.randint(2 * r - 1, 24), pr.randint(2 * s - 1, 24)
    pad = tuple(pr.randint(0, 2) for _ in range(4))
    return (pr.randint(1, 4), g * cpg, h, w, g * kpg, r, s, g,
            (pr.randint(1, 2), pr.randint(1, 2)), pad, (pr.randint(1, 2), pr.randint(1, 2)))


def load_csv(path):
    """(name, problem) for each row of a shapes CSV; a malformed row is an error."""
    rows = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#") or line.startswith("name,"):
                continue
            fields = line.split(",")
            if len(fields) != 12:
                sys.exit("%s:%d: expected 12 fields, got %d" % (path, lineno, len(fields)))
            name = fields[0]
            n, h, w, c, k, r, s, st, pd, dl, g = (int(v) for v in fields[1:])
            rows.append((name, (n, c, h, w, k, r, s, g, (st, st), (pd,) * 4, (dl, dl))))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--convctl", required=True)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--count", type=int, default=12, help="random problems beyond the fixed ones")
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--shapes", action="append", default=[],
                    help="also check every row of this shapes CSV (repeatable)")
    args = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    global REF_DEVICE
    if torch.cuda.is_available():
        REF_DEVICE = "cuda"
    print("torch-check seed %d, torch %s, reference on %s" % (args.seed, torch.__version__,
                                                            REF_DEVICE))
    pr = random.Random(args.seed)
    rng = torch.Generator().manual_seed(args.seed)
    probs = FIXED + [random_problem(pr) for _ in range(args.count)]
    # (label, problem, dtype, layout): the fixed and random problems in every dtype and layout,
    # then each CSV row in one combination, taken in turn.
    jobs = [("%2d" % i, prob, dtype, layout) for i, prob in enumerate(probs)
            for dtype in ("fp32", "fp16", "bf16") for layout in ("nhwc", "nchw")]
    combos = [(d, l) for d in ("fp16", "bf16", "fp32") for l in ("nhwc", "nchw")]
    for path in args.shapes:
        jobs += [(name, prob) + combos[j % len(combos)]
                 for j, (name, prob) in enumerate(load_csv(path))]
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for label, prob, dtype, layout in jobs:
            bias, act = pr.random() < 0.5, pick_act(pr)
            ok, msg, ms = check(args.convctl, args.socket, tmp, prob, dtype, layout, bias, act,
                                rng)
            if not ok:
                failures += 1
            print("%-4s %-2s %-4s %-4s bias=%d act=%s %s  %s  (%.0f ms)" % (
                "ok" if ok else "FAIL", label, dtype, layout, bias, act, prob, msg, ms))
    total = len(jobs)
    print("torch-check: %d of %d passed" % (total - failures, total))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
