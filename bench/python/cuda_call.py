#!/usr/bin/env python3
"""Where one convolution of a patched model spends its time: a CUDA tensor handed to convd,
against F.conv2d in the same process, batch 1, fp16, channels_last.

    cuda_call.py --socket PATH [--calls 2000] [--json OUT.json]

Needs torch with a CUDA device and a GPU daemon on PATH's socket (bench/python/models-h200.sh
runs it in its convd phases, under MPS and not). For each problem, one figure per mode, the
median over --calls calls after a warm-up, in microseconds per call:

  torch       F.conv2d + torch.cuda.synchronize(): what PyTorch's own call costs when its
              result is waited for
  convd       client.conv2d(x, w): the whole call (the package synchronises the stream, names
              the tensors' allocations, submits and waits)
  sync        torch.cuda.current_stream().synchronize() on an idle stream
  locate      the package's lookup of the input's, weight's and output's allocations
              (three driver attribute queries and a dictionary)
  empty       torch.empty of the output, channels_last
  rest        convd - sync - locate - empty: the request's round trip through the daemon (its
              queue and exec, below) and the package's own code around it

and the daemon's mean queue and exec per request over the convd calls (its metrics).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import convd  # noqa: E402

# name: N, C, H, W, K, R, S, stride, pad, groups (resnext50_32x4d's first stage, and layer 3)
PROBLEMS = {
    "rx50_s1_1x1_in": (1, 256, 56, 56, 128, 1, 1, 1, 0, 1),
    "rx50_s1_3x3_g32": (1, 128, 56, 56, 128, 3, 3, 1, 1, 32),
    "rx50_s1_1x1_out": (1, 128, 56, 56, 256, 1, 1, 1, 0, 1),
    "rx50_s3_3x3_g32": (1, 512, 14, 14, 512, 3, 3, 1, 1, 32),
}


def median_us(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


def metric_sums(client) -> dict:
    """(sum, count) of the daemon's queue and exec histograms."""
    want = {"convd_queue_seconds_sum", "convd_queue_seconds_count", "convd_exec_seconds_sum",
            "convd_exec_seconds_count"}
    out = {}
    for line in client.metrics().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in want:
            out[parts[0]] = float(parts[1])
    return out


def measure(client, name, spec, calls: int) -> dict:
    n, c, h, w_, k, r, s, stride, pad, groups = spec
    dev = torch.device("cuda")
    cl = torch.channels_last
    x = torch.randn(n, c, h, w_, device=dev, dtype=torch.float16).contiguous(memory_format=cl)
    wt = torch.randn(k, c // groups, r, s, device=dev, dtype=torch.float16)
    wt = wt.contiguous(memory_format=cl)
    args = dict(stride=stride, padding=pad, groups=groups)
    torch.backends.cudnn.benchmark = True
    out = client.conv2d(x, wt, **args)
    ref = F.conv2d(x, wt, **args).float()
    err = (out.float() - ref).norm() / ref.norm()
    stream = torch.cuda.current_stream()

    def plain():
        F.conv2d(x, wt, **args)
        torch.cuda.synchronize()

    def through():
        client.conv2d(x, wt, **args)

    regions = client._cuda  # the package's CUDA registrations, made by the call above

    def locate():
        regions.locate(x.data_ptr(), x.numel() * 2)
        regions.locate(wt.data_ptr(), wt.numel() * 2)
        regions.locate(out.data_ptr(), out.numel() * 2)

    def empty():
        torch.empty(out.shape, device=dev, dtype=out.dtype, memory_format=cl)

    for fn in (plain, through, stream.synchronize, locate, empty):
        for _ in range(max(50, calls // 10)):
            fn()
    before = metric_sums(client)
    row = {"problem": name, "calls": calls, "rel_err": float(err)}
    row["convd_us"] = median_us(through, calls)
    after = metric_sums(client)
    row["torch_us"] = median_us(plain, calls)
    row["sync_us"] = median_us(stream.synchronize, calls)
    row["locate_us"] = median_us(locate, calls)
    row["empty_us"] = median_us(empty, calls)
    row["rest_us"] = row["convd_us"] - row["sync_us"] - row["locate_us"] - row["empty_us"]
    for what in ("queue", "exec"):
        ds = after.get(f"convd_{what}_seconds_sum", 0) - before.get(f"convd_{what}_seconds_sum", 0)
        dn = after.get(f"convd_{what}_seconds_count", 0) - before.get(f"convd_{what}_seconds_count", 0)
        row[f"daemon_{what}_us"] = ds / dn * 1e6 if dn else None
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--json", help="write the rows here too")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch sees no CUDA device", file=sys.stderr)
        return 1
    client = convd.connect(a.socket)
    dev_name = torch.cuda.get_device_name(0)
    rows = [measure(client, name, spec, a.calls) for name, spec in PROBLEMS.items()]
    client.close()
    print(f"{dev_name}, torch {torch.__version__}, {a.calls} calls a mode; medians in us per call")
    print()
    print("| problem | torch | convd | sync | locate | empty | rest | daemon queue | daemon exec | rel err |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        dq = "-" if r["daemon_queue_us"] is None else f"{r['daemon_queue_us']:.1f}"
        de = "-" if r["daemon_exec_us"] is None else f"{r['daemon_exec_us']:.1f}"
        print(f"| {r['problem']} | {r['torch_us']:.1f} | {r['convd_us']:.1f} | {r['sync_us']:.1f} | "
              f"{r['locate_us']:.1f} | {r['empty_us']:.1f} | {r['rest_us']:.1f} | {dq} | {de} | "
              f"{r['rel_err']:.1e} |")
    if a.json:
        Path(a.json).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
