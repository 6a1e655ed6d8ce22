#!/usr/bin/env python3
"""P PyTorch processes on one GPU, each with its own CUDA context, running the same convolution.

The comparison for convd's serving benchmark (bench/serving/serving-h200.sh): each process keeps
its tensors on the GPU, sets torch.backends.cudnn.benchmark = True, and loops over
F.conv2d(x, w, None, stride, pad, 1, groups) + torch.cuda.synchronize() in fp16 channels_last.
All processes start together (multiprocessing with spawn, so that no CUDA state is inherited):
they create their contexts and tensors, meet at a barrier, warm up for --warmup seconds (cuDNN's
algorithm search, then the steady state with every process running), meet again, and measure for
--seconds. Under MPS (CUDA_MPS_PIPE_DIRECTORY exported, control daemon running) the same code runs
as MPS clients.

Prints one JSON line: images/s = images of all processes / the longest process window, calls/s,
the per-call latency (one conv2d + synchronize, as the process sees it) p50/p99/p99.9 over every
call of every process, and errors, if any. Exit status 1 if any process failed.

  python3 torch_clients.py --procs 16 --batch 1 --seconds 2 --warmup 1 --mps-note alone
"""
import argparse
import array
import json
import multiprocessing as mp
import os
import queue
import sys
import time

DTYPES = ("fp16", "bf16", "fp32")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--procs", type=int, default=1, help="processes (default 1)")
    ap.add_argument("--batch", type=int, default=1, help="images per call (default 1)")
    ap.add_argument("--seconds", type=float, default=2.0, help="measured window (default 2)")
    ap.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds (default 1)")
    ap.add_argument("--mps-note", default="", help="label for the JSON line (e.g. alone, mps)")
    ap.add_argument("--device", type=int, default=0, help="CUDA device (default 0)")
    # The shape: latency_b1_resnext of bench/shapes.csv (resnext50_l1 at batch 1).
    ap.add_argument("--h", type=int, default=56)
    ap.add_argument("--w", type=int, default=56)
    ap.add_argument("--c", type=int, default=128)
    ap.add_argument("--k", type=int, default=128)
    ap.add_argument("--r", type=int, default=3)
    ap.add_argument("--s", type=int, default=3)
    ap.add_argument("--groups", type=int, default=32)
    ap.add_argument("--stride", type=int, default=1)
    ap.add_argument("--pad", type=int, default=1)
    ap.add_argument("--dtype", choices=DTYPES, default="fp16")
    ap.add_argument("--start-timeout", type=float, default=240.0,
                    help="seconds all processes have to start (default 240)")
    a = ap.parse_args(argv)
    if a.procs < 1 or a.batch < 1 or a.seconds <= 0 or a.warmup < 0:
        ap.error("--procs and --batch must be >= 1, --seconds > 0, --warmup >= 0")
    if a.c % a.groups or a.k % a.groups:
        ap.error("--c and --k must be multiples of --groups")
    return a


def worker(rank, a, start, go, results):
    """One client process: context, tensors, warm-up, measured loop; puts one dict on results."""
    out = {"rank": rank}
    conv = None
    try:
        import torch
        import torch.nn.functional as F

        torch.backends.cudnn.benchmark = True
        dev = torch.device("cuda", a.device)
        torch.cuda.set_device(dev)
        dt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[a.dtype]
        x = torch.randn(a.batch, a.c, a.h, a.w, device=dev, dtype=dt)
        x = x.contiguous(memory_format=torch.channels_last)
        w = torch.randn(a.k, a.c // a.groups, a.r, a.s, device=dev, dtype=dt)
        w = w.contiguous(memory_format=torch.channels_last)

        def conv():
            F.conv2d(x, w, None, a.stride, a.pad, 1, a.groups)
            torch.cuda.synchronize()

        conv()
        if rank == 0:
            out["torch"] = torch.__version__
            out["cudnn"] = torch.backends.cudnn.version()
            out["device_name"] = torch.cuda.get_device_name(dev)
    except Exception as e:  # reported, and the others go on
        out["error"] = "%s: %s" % (type(e).__name__, e)
        conv = None
    try:
        start.wait(a.start_timeout)
        if conv is not None:
            end = time.perf_counter() + a.warmup
            n = 0
            while n < 3 or time.perf_counter() < end:
                conv()
                n += 1
        go.wait(a.start_timeout)
    except Exception as e:  # a broken barrier: some process never arrived
        out.setdefault("error", "barrier: %s" % type(e).__name__)
        conv = None
    if conv is not None:
        try:
            lat = array.array("d")
            t0 = time.perf_counter()  # CLOCK_MONOTONIC: comparable across processes
            deadline = t0 + a.seconds
            t = t0
            while t < deadline:
                s = time.perf_counter()
                conv()
                t = time.perf_counter()
                lat.append(t - s)
            out.update(calls=len(lat), t0=t0, t1=t, lat=lat.tobytes())
        except Exception as e:
            out["error"] = "%s: %s" % (type(e).__name__, e)
    results.put(out)


def percentile(sorted_vals, q):
    if not sorted_vals:
        return None
    i = min(len(sorted_vals) - 1, max(0, int(q * len(sorted_vals) + 0.999999) - 1))
    return sorted_vals[i]


def main(argv=None):
    a = parse_args(argv)
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(a.procs)
    go = ctx.Barrier(a.procs)
    results = ctx.Queue()
    t_launch = time.perf_counter()
    procs = [ctx.Process(target=worker, args=(i, a, start, go, results), daemon=True)
             for i in range(a.procs)]
    for p in procs:
        p.start()
    got = []
    limit = time.perf_counter() + 2 * a.start_timeout + a.warmup + a.seconds + 60
    while len(got) < a.procs and time.perf_counter() < limit:
        try:
            got.append(results.get(timeout=1.0))
        except queue.Empty:
            if not any(p.is_alive() for p in procs):
                # The last results may still be in the pipe.
                try:
                    while len(got) < a.procs:
                        got.append(results.get(timeout=1.0))
                except queue.Empty:
                    pass
                break
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    errors = ["process %d: %s" % (r["rank"], r["error"]) for r in got if "error" in r]
    if len(got) < a.procs:
        errors.append("%d of %d processes sent no result (died or timed out; exit codes %s)"
                      % (a.procs - len(got), a.procs, [p.exitcode for p in procs]))
    ok = [r for r in got if "calls" in r]
    lat = array.array("d")
    for r in ok:
        lat.frombytes(r["lat"])
    lat = sorted(lat)
    calls = sum(r["calls"] for r in ok)
    longest = max((r["t1"] - r["t0"] for r in ok), default=0.0)
    span = (max(r["t1"] for r in ok) - min(r["t0"] for r in ok)) if ok else 0.0
    info = next((r for r in got if "torch" in r), {})
    def us(v):
        return None if v is None else round(v * 1e6, 2)

    res = {
        "mode": a.mps_note,
        "mps": bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")),
        "procs": a.procs,
        "procs_measured": len(ok),
        "batch": a.batch,
        "shape": {"n": a.batch, "h": a.h, "w": a.w, "c": a.c, "k": a.k, "r": a.r, "s": a.s,
                  "groups": a.groups, "stride": a.stride, "pad": a.pad},
        "dtype": a.dtype,
        "layout": "nhwc",
        "seconds": a.seconds,
        "warmup": a.warmup,
        "calls": calls,
        "images": calls * a.batch,
        "window_s": round(longest, 6),
        "span_s": round(span, 6),
        "images_per_s": round(calls * a.batch / longest, 1) if longest > 0 else 0.0,
        "calls_per_s": round(calls / longest, 1) if longest > 0 else 0.0,
        "p50_us": us(percentile(lat, 0.50)),
        "p99_us": us(percentile(lat, 0.99)),
        "p999_us": us(percentile(lat, 0.999)),
        "mean_us": us(sum(lat) / len(lat)) if lat else None,
        "wall_s": round(time.perf_counter() - t_launch, 2),
        "torch": info.get("torch"),
        "cudnn": info.get("cudnn"),
        "device_name": info.get("device_name"),
        "error": "; ".join(errors[:4]) + ("; ..." if len(errors) > 4 else "") if errors else None,
    }
    print(json.dumps(res), flush=True)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
