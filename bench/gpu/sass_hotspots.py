#!/usr/bin/env python3
"""Where a kernel's instructions and stalls go, from an Nsight Compute source page.

Input: the CSV of `ncu --section SourceCounters --page source --print-source sass --csv`
(scripts/gpu-profile.sh writes it with SOURCE=1). Consecutive SASS instructions that ran the same
number of times are one straight-line run (a loop body, an unrolled block); the script prints the
runs that hold at least --min percent of the executed instructions or of the stall samples, with
their execution count per instruction, length and first instruction, and the opcode mix.
"""
import argparse
import collections
import csv
import io
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="ncu source-page CSV")
    ap.add_argument("--min", type=float, default=1.5, help="percent threshold (default 1.5)")
    args = ap.parse_args()
    text = open(args.csv, encoding="utf-8", errors="replace").read()
    start = text.find('"Address"')
    if start < 0:
        sys.exit(f"{args.csv}: no source table (was ncu run with --page source --csv?)")
    rows = list(csv.DictReader(io.StringIO(text[start:])))
    execs = [int(r["Instructions Executed"] or 0) for r in rows]
    samples = [int(r["Warp Stall Sampling (All Samples)"] or 0) for r in rows]
    total, total_s = sum(execs), max(sum(samples), 1)
    print(f"{len(rows)} instructions, {total} executed (warp level), {sum(samples)} stall samples")

    runs = []  # [first, last, count per instruction, length, samples]
    for i, e in enumerate(execs):
        if e == 0:
            continue
        if runs and runs[-1][2] == e and i - runs[-1][1] <= 3:
            runs[-1][1] = i
            runs[-1][3] += 1
            runs[-1][4] += samples[i]
        else:
            runs.append([i, i, e, 1, samples[i]])
    print(f"\n{'lines':>11} {'x count':>9} {'len':>5} {'instr %':>8} {'stall %':>8}  first")
    for a, b, e, n, s in runs:
        pi, ps = 100.0 * e * n / total, 100.0 * s / total_s
        if pi >= args.min or ps >= args.min:
            print(f"{a:5d}-{b:5d} {e:9d} {n:5d} {pi:8.1f} {ps:8.1f}  {rows[a]['Source'].strip()[:60]}")

    mix = collections.Counter()
    for r, e in zip(rows, execs):
        words = r["Source"].split()
        if not words:
            continue
        op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
        mix[op.split(".")[0]] += e
    print("\nopcodes: " + ", ".join(f"{k} {100.0 * v / total:.1f}%" for k, v in mix.most_common(12)))


if __name__ == "__main__":
    main()
