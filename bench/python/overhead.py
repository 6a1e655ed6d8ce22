#!/usr/bin/env python3
"""The Python package's cost per call over the C client's, on the same problem and daemon.

    bench/python/overhead.py [--build build] [--backend null] [--calls 2000] [--rounds 25]
                             [--json OUT.json]

Starts a daemon of the build (BUILD/bin/convd --backend BACKEND, on a private socket) and times,
for each problem, back-to-back blocking calls:
  C        convd-bench-call: convd_conv() on plain host memory, the library staging in and out
  C fresh  the same with a newly allocated output buffer each call (malloc/free), as Python's
           calls return a new array each time
  ctypes   convd_conv() called through ctypes from this process on the same arrays, with a new
           numpy output array each call: the C client as Python sees it, in the same process,
           with the same memory placement (the C program's buffers are another process's)
  numpy    Client.conv2d(numpy arrays)
  torch    Client.conv2d(CPU torch tensors)
  Conv2d   convd.torch.Conv2d forward (weight held in the daemon's memory, input staged)
  submit   Client.submit(numpy arrays).result()
Each round runs every mode once, one after the other: a batch of `calls` calls after a warm-up
batch, whose figure is its mean time per call. A mode's figure is the median over the rounds,
and its overhead the median over the rounds of its figure minus C's in the same round: pairing
the rounds cancels most of the drift of a shared machine, which is larger than the overhead on
big problems. With --backend null the daemon completes requests without computing, so the
figures are the serving path alone; --backend cpu adds the (same) computation to both sides.

Prints a markdown table; --json writes the batch figures too.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# name, n, c, h, w, k, r, s, groups, pad
PROBLEMS = [
    ("tiny 1x8x8x8 k8 3x3", 1, 8, 8, 8, 8, 3, 3, 1, 1),
    ("latency_b1_resnext 1x128x56x56 k128 3x3 g32", 1, 128, 56, 56, 128, 3, 3, 32, 1),
]


def start_daemon(build: Path, backend: str, tmp: str):
    sock = os.path.join(tmp, "convd.sock")
    log = open(os.path.join(tmp, "daemon.log"), "w")
    proc = subprocess.Popen(
        [str(build / "bin" / "convd"), "--socket", sock, "--backend", backend, "--log-level", "warning"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    import convd

    deadline = time.monotonic() + 30
    while True:
        try:
            convd.connect(sock).close()
            return proc, sock
        except convd.Error:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"convd did not start; see {log.name}")
            time.sleep(0.02)


def c_batches(build: Path, sock: str, prob, calls: int, batches: int, fresh=False) -> list[float]:
    _, n, c, h, w, k, r, s, g, pad = prob
    out = subprocess.run(
        [
            str(build / "bin" / "convd-bench-call"), "--socket", sock,
            "--n", str(n), "--c", str(c), "--h", str(h), "--w", str(w), "--k", str(k),
            "--r", str(r), "--s", str(s), "--groups", str(g), "--pad", str(pad),
            "--calls", str(calls), "--batches", str(batches),
        ] + (["--fresh-output"] if fresh else []),
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out)["us_per_call"]


def py_batches(fn, calls: int, batches: int) -> list[float]:
    for _ in range(min(calls, 200)):  # warm-up: plans, staging, held weights, caches
        fn()
    res = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        res.append((time.perf_counter() - t0) / calls * 1e6)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--backend", default="null")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--json")
    args = ap.parse_args()
    build = Path(args.build).resolve()
    os.environ.setdefault("CONVD_CLIENT_LIB", str(build / "lib" / "libconvd-client.so"))
    sys.path.insert(0, str(ROOT / "python"))
    import numpy as np
    import torch

    import convd
    import convd.torch

    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="convd-overhead-")
    proc, sock = start_daemon(build, args.backend, tmp)
    results = {}
    try:
        client = convd.connect(sock)
        rng = np.random.default_rng(1)
        for prob in PROBLEMS:
            name, n, c, h, w, k, r, s, g, pad = prob
            x = rng.uniform(-0.5, 0.5, (n, c, h, w)).astype(np.float32)
            wt = rng.uniform(-0.5, 0.5, (k, c // g, r, s)).astype(np.float32)
            xt, wtt = torch.from_numpy(x), torch.from_numpy(wt)
            mod = convd.torch.Conv2d(c, k, (r, s), padding=pad, groups=g, bias=False, client=client)
            with torch.no_grad():
                mod.weight.copy_(wtt)
            lib = convd._lib.load()
            client.conv2d(x, wt, padding=pad, groups=g)
            plan = next(p for p in client._plans.values() if p.problem.c == c and p.problem.h == h)
            xa, wa = x.ctypes.data, wt.ctypes.data

            def raw():
                out = np.empty(plan.out_shape, np.float32)
                lib.convd_conv(client._h, plan.problem, xa, wa, None, out.ctypes.data)
                return out

            modes = {
                "ctypes": raw,
                "numpy": lambda: client.conv2d(x, wt, padding=pad, groups=g),
                "torch": lambda: client.conv2d(xt, wtt, padding=pad, groups=g),
                "Conv2d": lambda: mod(xt),
                "submit": lambda: client.submit(x, wt, padding=pad, groups=g).result(),
            }
            figs = {m: [] for m in ["C", "C fresh", *modes]}
            with torch.no_grad():
                for _ in range(args.rounds):
                    figs["C"] += c_batches(build, sock, prob, args.calls, 1)
                    figs["C fresh"] += c_batches(build, sock, prob, args.calls, 1, True)
                    for m, fn in modes.items():
                        figs[m] += py_batches(fn, args.calls, 1)
            results[name] = figs
        client.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)

    import platform

    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(
        f"backend {args.backend}; {args.calls} calls a batch, {args.rounds} "
        f"rounds; commit {commit}; {time.strftime('%Y-%m-%d')}; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs; python {platform.python_version()}, torch {torch.__version__}"
    )
    print()
    print("| problem | mode | us per call (median) | over C (us) | over C fresh (us) | over ctypes (us) |")
    print("|---|---|---:|---:|---:|---:|")

    def over(v, base):
        return f"{statistics.median(a - c for a, c in zip(v, base)):+.2f}"

    for name, figs in results.items():
        for m, v in figs.items():
            cells = [over(v, figs["C"]), over(v, figs["C fresh"]), over(v, figs["ctypes"])]
            if m in ("C", "C fresh"):
                cells = ["", "", ""]
            elif m == "ctypes":
                cells[2] = ""
            print(f"| {name} | {m} | {statistics.median(v):.2f} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"backend": args.backend, "commit": commit, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
