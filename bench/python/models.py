#!/usr/bin/env python3
"""Whole models end to end: P processes on one GPU, each running torchvision models at batch 1,
plain PyTorch or patched through convd with GPU tensors (bench/python/models-h200.sh runs it
alone, under MPS, and against a convd daemon, outside and inside MPS; results in
docs/benchmarks.md, "Whole models").

    models.py --mode convd|plain --procs P [--models resnext50_32x4d,regnet_y_400mf,...]
              [--dtype fp16] [--seconds 2] [--warmup 1] [--socket PATH] [--label mps]
              [--cuda-sched auto|spin|yield|block]
    models.py --report OUTDIR/models.jsonl          (the markdown tables)

Each of the P processes (multiprocessing, spawn: no CUDA state inherited) creates its context,
then for each model in turn: builds it with random weights (seeded alike in every process; no
download) in the dtype on the GPU, channels_last, under torch.inference_mode(), patches it with
convd.torch.patch when --mode convd (its own client of the daemon at --socket or
$CONVD_SOCKET); all processes meet at a barrier, warm up for --warmup seconds (cuDNN's algorithm
search, convd's registrations), meet again and run forward + torch.cuda.synchronize() for
--seconds, recording each forward's latency.

Prints one JSON line per model: images/s = forwards of all processes / the longest window, and
the latency per forward p50/p99/p99.9 over every forward of every process; an "error" when a
process failed. Exit status 1 if any did.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import sys
import time

MODELS = ["resnext50_32x4d", "regnet_y_400mf", "mobilenet_v3_small", "convnext_tiny"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# CU_CTX_SCHED_*: a process that waits in torch.cuda.synchronize() spins on a CPU by default,
# which the daemon's threads then share with it.
CUDA_SCHED = {"auto": 0, "spin": 1, "yield": 2, "block": 4}


def set_cuda_sched(name, device):
    """Sets the device's primary context's scheduling flag before torch creates the context."""
    if CUDA_SCHED[name] == 0:
        return
    import ctypes

    cu = ctypes.CDLL("libcuda.so.1")
    dev = ctypes.c_int()
    for rc in (cu.cuInit(0), cu.cuDeviceGet(ctypes.byref(dev), device),
               cu.cuDevicePrimaryCtxSetFlags_v2(dev, CUDA_SCHED[name])):
        if rc != 0:
            raise RuntimeError(f"setting the CUDA scheduling flag {name}: CUresult {rc}")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=["convd", "plain"], default="plain")
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--dtype", choices=["fp16", "bf16", "fp32"], default="fp16")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--socket", default=os.environ.get("CONVD_SOCKET"))
    ap.add_argument("--label", default="", help="mode label in the JSON (e.g. mps)")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--cpu", action="store_true",
                    help="run on the CPU (a smoke test of this script on a machine without a GPU)")
    ap.add_argument("--cuda-sched", choices=list(CUDA_SCHED), default="auto",
                    help="how each process's CUDA context waits for the GPU (its primary "
                    "context's scheduling flag, set before torch creates it): auto is CUDA's "
                    "default, which spins while a process has fewer contexts than CPUs")
    ap.add_argument("--start-timeout", type=float, default=300.0)
    ap.add_argument("--report", metavar="JSONL", help="print the tables of a models.jsonl")
    return ap.parse_args(argv)


def worker(rank, a, barrier, results):
    try:
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import torch
        import torchvision

        torch.backends.cudnn.benchmark = True
        if a.cpu:
            dev = torch.device("cpu")
            sync = lambda: None  # noqa: E731
        else:
            set_cuda_sched(a.cuda_sched, a.device)
            dev = torch.device("cuda", a.device)
            torch.cuda.set_device(dev)
            sync = torch.cuda.synchronize
        dt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[a.dtype]
        client = None
        if a.mode == "convd":
            import convd
            import convd.torch

            client = convd.connect(a.socket)
        for name in a.models.split(","):
            out = {"rank": rank, "model": name}
            m = None
            try:
                torch.manual_seed(0)
                with torch.inference_mode():
                    m = getattr(torchvision.models, name)(weights=None).eval()
                    m = m.to(device=dev, dtype=dt, memory_format=torch.channels_last)
                    if client is not None:
                        convd.torch.patch(m, client)
                    x = torch.randn(1, 3, a.size, a.size, device=dev, dtype=dt)
                    x = x.contiguous(memory_format=torch.channels_last)
                    barrier.wait(a.start_timeout)
                    end = time.perf_counter() + a.warmup
                    while time.perf_counter() < end:
                        m(x)
                        sync()
                    barrier.wait(a.start_timeout)
                    lat = []
                    t0 = time.perf_counter()
                    end = t0 + a.seconds
                    now = t0
                    while now < end:
                        m(x)
                        sync()
                        t = time.perf_counter()
                        lat.append(t - now)
                        now = t
                    out["window"] = now - t0
                    out["lat"] = lat
            except Exception as e:  # reported in the JSON line
                out["error"] = f"{type(e).__name__}: {e}"
                barrier.abort()
            results.put(out)
            del m
            if not a.cpu:
                torch.cuda.empty_cache()
        if client is not None:
            client.close()
    except Exception as e:
        results.put({"rank": rank, "model": "*", "error": f"{type(e).__name__}: {e}"})
        barrier.abort()


def pct(v, q):
    if not v:
        return None
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def run(a) -> int:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(a.procs)
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, a, barrier, results)) for r in range(a.procs)]
    for p in procs:
        p.start()
    models = a.models.split(",")
    got = {m: [] for m in models}
    failed = False
    deadline = time.monotonic() + a.start_timeout + len(models) * (a.warmup + a.seconds + 120)
    want = a.procs * len(models)
    n = 0
    while n < want and time.monotonic() < deadline:
        try:
            r = results.get(timeout=5)
        except queue.Empty:
            if not any(p.is_alive() for p in procs):
                break
            continue
        n += 1
        if r["model"] == "*":
            for m in models:
                got[m].append(r)
            n = want if a.procs == 1 else n
            continue
        got[r["model"]].append(r)
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
    label = a.label or a.mode
    for m in models:
        rs = got[m]
        errors = [r["error"] for r in rs if "error" in r]
        line = {"model": m, "mode": label, "procs": a.procs, "dtype": a.dtype, "batch": 1,
                "size": a.size, "cuda_sched": a.cuda_sched}
        if errors or len(rs) < a.procs:
            failed = True
            line["images_per_s"] = None
            line["error"] = errors[0] if errors else f"{a.procs - len(rs)} processes gave no result"
        else:
            lat = [x for r in rs for x in r["lat"]]
            window = max(r["window"] for r in rs)
            line["images_per_s"] = round(len(lat) / window, 1)
            line["forwards"] = len(lat)
            for q, k in ((0.5, "p50_ms"), (0.99, "p99_ms"), (0.999, "p999_ms")):
                line[k] = round(pct(lat, q) * 1e3, 3)
        print(json.dumps(line), flush=True)
    return 1 if failed else 0


def report(path) -> int:
    rows = [json.loads(line) for line in open(path) if line.strip()]
    modes = []
    for r in rows:
        if r["mode"] not in modes:
            modes.append(r["mode"])
    by = {(r["model"], r["procs"], r["mode"]): r for r in rows}
    models = []
    for r in rows:
        if r["model"] not in models:
            models.append(r["model"])
    procs = sorted({r["procs"] for r in rows})
    dtype = rows[0]["dtype"] if rows else "?"
    size = rows[0].get("size", 224) if rows else "?"
    print(f"Batch 1, {dtype}, channels_last, {size}x{size}; images/s of all processes together, "
          "and the latency of one forward pass (p50 / p99, ms).\n")
    head = "| model | P | " + " | ".join(f"{m} img/s | {m} p50/p99" for m in modes)
    # Each convd mode against plain PyTorch under MPS, the alternative it must beat.
    ratios = (
        [m for m in ("convd", "convd-mps", "convd-mps-sync") if m in modes] if "mps" in modes else []
    )
    head += "".join(f" | {m} / MPS" for m in ratios)
    print(head + " |")
    print("|" + "---|" * (2 + 2 * len(modes) + len(ratios)))
    for m in models:
        for p in procs:
            cells = [m, str(p)]
            for mode in modes:
                r = by.get((m, p, mode))
                if r is None or r.get("images_per_s") is None:
                    err = r.get("error", "") if r else "not run"
                    cells += ["-", err[:40]]
                else:
                    cells += [f"{r['images_per_s']:.0f}", f"{r['p50_ms']:.2f} / {r['p99_ms']:.2f}"]
            for mode in ratios:
                c, s = by.get((m, p, mode)), by.get((m, p, "mps"))
                if c and s and c.get("images_per_s") and s.get("images_per_s"):
                    cells.append(f"{c['images_per_s'] / s['images_per_s']:.2f}")
                else:
                    cells.append("-")
            print("| " + " | ".join(cells) + " |")
    return 0


def main() -> int:
    a = parse_args()
    if a.report:
        return report(a.report)
    if a.mode == "convd" and not a.socket:
        print("--mode convd needs --socket or $CONVD_SOCKET", file=sys.stderr)
        return 2
    return run(a)


if __name__ == "__main__":
    sys.exit(main())
