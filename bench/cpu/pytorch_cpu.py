#!/usr/bin/python3
"""Times torch.nn.functional.conv2d on the CPU for the shapes of a shapes CSV, the same way
convd-bench-cpu times convd_cpu_conv (N forced to 1 by default, median of the runs after the
warm-ups), and prints CSV: shape,layout,dtype,n,threads,ms,gflops.

Uses Debian's python3-torch (1.13, oneDNN). NHWC is PyTorch's channels_last memory format for
the input and the weight."""
import argparse
import csv
import statistics
import sys
import time

import torch
import torch.nn.functional as F

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def out_dim(size, pad, k, stride, dil):
    return (size + 2 * pad - dil * (k - 1) - 1) // stride + 1


def time_shape(row, n, dtype, layout, runs, warmup):
    h, w, c, k = int(row["h"]), int(row["w"]), int(row["c"]), int(row["k"])
    r, s, stride = int(row["r"]), int(row["s"]), int(row["stride"])
    pad, dil, groups = int(row["pad"]), int(row["dil"]), int(row["groups"])
    x = torch.rand(n, c, h, w, dtype=torch.float32) * 2 - 1
    wt = torch.rand(k, c // groups, r, s, dtype=torch.float32) * 2 - 1
    x, wt = x.to(DTYPES[dtype]), wt.to(DTYPES[dtype])
    if layout == "nhwc":
        x = x.contiguous(memory_format=torch.channels_last)
        wt = wt.contiguous(memory_format=torch.channels_last)
    times = []
    with torch.no_grad():
        for i in range(warmup + runs):
            t0 = time.perf_counter()
            F.conv2d(x, wt, None, stride, pad, dil, groups)
            t1 = time.perf_counter()
            if i >= warmup:
                times.append(t1 - t0)
    ms = statistics.median(times) * 1e3
    oh, ow = out_dim(h, pad, r, stride, dil), out_dim(w, pad, s, stride, dil)
    flops = 2.0 * n * oh * ow * k * r * s * (c // groups)
    return ms, flops / (ms * 1e-3) / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shapes", default="bench/shapes.csv")
    ap.add_argument("--n", type=int, default=1, help="batch size; 0 keeps the CSV's n")
    ap.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layouts", default="nchw,nhwc")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--only", default=None, help="only this shape")
    # convd-only options (--isa, ...) are accepted and ignored, so run.sh can pass one list
    args, _ = ap.parse_known_args()

    torch.set_num_threads(args.threads)
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(["shape", "layout", "dtype", "n", "threads", "ms", "gflops"])
    with open(args.shapes, newline="") as f:
        rows = [row for row in csv.DictReader(f) if args.only in (None, row["name"])]
    # The first convolutions of a process start oneDNN's and OpenMP's machinery; keep that out
    # of the first shape's numbers.
    if rows:
        time_shape(rows[0], 1, args.dtype, "nchw", 20, 0)
    for row in rows:
        n = args.n if args.n > 0 else int(row["n"])
        for layout in args.layouts.split(","):
            ms, gflops = time_shape(row, n, args.dtype, layout, args.runs, args.warmup)
            out.writerow([row["name"], layout, args.dtype, n, args.threads,
                          "%.4f" % ms, "%.1f" % gflops])
            sys.stdout.flush()


if __name__ == "__main__":
    main()
