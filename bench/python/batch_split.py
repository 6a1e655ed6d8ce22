#!/usr/bin/env python3
"""Where a daemon's batches spent their time, from its metrics text (convd_stop's files).

    bench/python/batch_split.py daemon-metrics-convd-mps.txt [more files]

One markdown row per file: batches, requests per batch, and the means per batch of exec (the
loop's queueing to the loop seeing it done), the wait for a launch thread, the launch call, the
device (batch_timing), the loop's look before the one that saw it done (a bound), and what is
left of exec (launched, not yet started on the device, and the completion's way back); the
queue per request; the loop's busy seconds and its steps as shares of them; exec summed over the
batches, against the daemon's uptime (when every slot is held throughout the load, the sum is
the slots times the load's length). A histogram absent from the file (an older daemon, or
batch_timing off) shows as a dash.
"""
from __future__ import annotations

import re
import sys

STEPS = ("rings", "gates", "completions", "doorbells", "dispatch")


def parse(text: str) -> dict[str, float]:
    vals = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = re.match(r"^(\S+?)(\{[^}]*\})?\s+(\S+)$", line)
        if m:
            vals[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return vals


def mean(v: dict, name: str):
    n = v.get(name + "_count", 0)
    return v[name + "_sum"] / n if n and name + "_sum" in v else None


def row(path: str) -> str:
    with open(path) as f:
        v = parse(f.read())
    batches = v.get("convd_exec_seconds_count", 0)
    if not batches:
        return f"| {path} | no batches |"
    us = {k: mean(v, f"convd_{k}_seconds") for k in ("exec", "launch_wait", "launch", "device", "seen_lag")}
    us = {k: (x * 1e6 if x is not None else None) for k, x in us.items()}
    known = [us[k] for k in ("launch_wait", "launch", "device", "seen_lag")]
    rest = us["exec"] - sum(known) if all(x is not None for x in known) else None
    queue = mean(v, "convd_queue_seconds")
    up = v.get("convd_uptime_seconds", 0)

    def f(x, unit=""):
        return "-" if x is None else f"{x:.1f}{unit}"

    busy = v.get("convd_loop_busy_seconds_total", 0)

    def share(step):
        return v.get(f'convd_loop_seconds_total{{step="{step}"}}', 0) / busy if busy else 0

    loop = ", ".join(f"{s} {share(s):.2f}" for s in STEPS)
    exec_sum = v.get("convd_exec_seconds_sum", 0)
    per = v.get("convd_batch_size_sum", 0) / batches
    return (
        f"| {path} | {batches:.0f} | {per:.2f} | {f(us['exec'])} | {f(us['launch_wait'])} | "
        f"{f(us['launch'])} | {f(us['device'])} | {f(us['seen_lag'])} | {f(rest)} | "
        f"{f(queue * 1e6 if queue is not None else None)} | {busy:.2f} s ({loop}) | "
        f"{exec_sum:.2f} s / {up:.1f} s |"
    )


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    print("| metrics | batches | requests a batch | exec us | launch-thread wait | launch call "
          "| device | seen late (bound) | rest | queue us a request | loop busy (steps, of it) "
          "| exec summed / uptime |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for p in argv:
        print(row(p))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
