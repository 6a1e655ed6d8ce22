#!/usr/bin/env python3
"""Markdown tables for docs/benchmarks.md from one convd-bench-kernels CSV.

    bench/gpu/report.py RUN.csv [--baseline cudnn-h200-baseline.md]
    bench/gpu/report.py RUN.csv --against BASE.csv [--tolerance 0.03]

Prints the per-row table (ours, the same run's cuDNN, and, when the baseline file is given, the
PyTorch-cuDNN time of that file with the ratio against it) and the per dtype/layout summary:
geometric mean of the speedups, median fraction of the roofline, and the grouped shapes
(groups > 1) slower than each cuDNN. Dense shapes (groups = 1: the CSV's groups column, or for
CSVs written before it existed the shapes CSVs' groups, --shapes, by default bench/shapes.csv and
bench/shapes-extra.csv) are left out of the "slower" lists, as the issue's targets treat them
separately, and listed after the table.

With --against, it compares our kernel times instead, row by row, with another run's CSV (another
build on the same device in the same call: scripts/gpu-check.sh's bench-base.csv): each row's
time over the base's, their median and range, and the rows more than --tolerance slower. It exits
1 when a row is, or when the two runs have different rows or outputs that differ from cuDNN's.
"""
import argparse
import csv
import math
import os
import re
import statistics

DTYPE_NAMES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
BENCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_SHAPES = [os.path.join(BENCH_DIR, "shapes.csv"), os.path.join(BENCH_DIR, "shapes-extra.csv")]


def load_groups(paths):
    """shape name -> groups, from shapes CSVs (name,n,h,w,c,k,r,s,stride,pad,dil,groups)."""
    groups = {}
    for path in paths:
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as f:
            for line in f:
                cells = line.strip().split(",")
                if len(cells) == 12 and not line.startswith(("#", "name,")):
                    groups[cells[0]] = int(cells[11])
    return groups


def load_baseline(path):
    """(shape, dtype, layout) -> microseconds from the baseline markdown table."""
    base = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) < 4 or cells[1] not in DTYPE_NAMES:
                continue
            try:
                base[(cells[0], DTYPE_NAMES[cells[1]], cells[2])] = float(cells[3])
            except ValueError:
                continue
    return base


def geomean(values):
    values = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def against(rows, base_path, tolerance):
    """Our times in rows against those of another run; 0 when no row is slower than tolerance."""
    key = lambda r: (r["shape"], r["dtype"], r["layout"])  # noqa: E731
    base = {key(r): r for r in csv.DictReader(open(base_path, encoding="utf-8"))}
    print("| shape | dtype | layout | kernel | base kernel | ours us | base us | ours / base |")
    print("|---|---|---|---|---|---:|---:|---:|")
    ratios, slower, missing, wrong = [], [], [], []
    for r in rows:
        b = base.pop(key(r), None)
        if b is None:
            missing.append(" ".join(key(r)))
            continue
        ours, theirs = float(r["ours_us"]), float(b["ours_us"])
        ratio = ours / theirs
        ratios.append(ratio)
        if ratio > 1 + tolerance:
            slower.append(f"{' '.join(key(r))} ({ratio:.3f})")
        if r["ok"] != "1" or b["ok"] != "1":
            wrong.append(" ".join(key(r)))
        print(f"| {r['shape']} | {r['dtype']} | {r['layout']} | {r['kernel']} | {b['kernel']} | "
              f"{ours:.1f} | {theirs:.1f} | {ratio:.3f} |")
    missing += [" ".join(k) + " (base only)" for k in base]
    print()
    if ratios:
        print(f"{len(ratios)} rows: ours / base median {statistics.median(ratios):.3f}, "
              f"range {min(ratios):.3f}-{max(ratios):.3f}; more than {tolerance:.0%} slower: "
              f"{', '.join(slower) or 'none'}")
    if missing:
        print("Rows in one run only: " + ", ".join(missing))
    if wrong:
        print("Outputs that differ from cuDNN's: " + ", ".join(wrong))
    return 1 if slower or missing or wrong or not ratios else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--baseline")
    ap.add_argument("--against", metavar="BASE_CSV", help="compare our times with another run's")
    ap.add_argument("--tolerance", type=float, default=0.03,
                    help="with --against: how much slower a row may be (default 0.03)")
    ap.add_argument("--shapes", action="append", help="shapes CSV for the groups of each shape")
    args = ap.parse_args()
    rows = list(csv.DictReader(open(args.csv, encoding="utf-8")))
    if args.against:
        raise SystemExit(against(rows, args.against, args.tolerance))
    base = load_baseline(args.baseline) if args.baseline else {}
    groups = load_groups(args.shapes or DEFAULT_SHAPES)

    def dense(r):
        g = r.get("groups") or groups.get(r["shape"])
        if g is None:
            raise SystemExit("report.py: groups of %s unknown (give --shapes)" % r["shape"])
        return int(g) == 1

    head = "| shape | dtype | layout | kernel | ours us | cuDNN us (same run) | speedup |"
    rule = "|---|---|---|---|---:|---:|---:|"
    if base:
        head += " PyTorch cuDNN us (baseline) | vs baseline |"
        rule += "---:|---:|"
    print(head + " floor us | frac |")
    print(rule + "---:|---:|")
    for r in rows:
        ours, dnn = float(r["ours_us"]), float(r["cudnn_us"])
        line = (f"| {r['shape']} | {r['dtype']} | {r['layout']} | {r['kernel']} | {ours:.1f} | "
                f"{dnn:.1f} | {dnn / ours:.2f}x |")
        if base:
            b = base.get((r["shape"], r["dtype"], r["layout"]))
            line += f" {b:.1f} | {b / ours:.2f}x |" if b else " - | - |"
        ok = "" if r["ok"] == "1" else " WRONG"
        print(line + f" {float(r['floor_us']):.1f} | {float(r['frac']):.2f}{ok} |")

    print()
    head = "| dtype | layout | geomean vs same run |"
    rule = "|---|---|---:|"
    if base:
        head += " geomean vs baseline |"
        rule += "---:|"
    head += " median frac | grouped shapes slower than same-run cuDNN |"
    rule += "---:|---|"
    if base:
        head += " grouped shapes slower than the baseline |"
        rule += "---|"
    print(head)
    print(rule)
    for dt in ("fp16", "bf16", "fp32"):
        for lay in ("nhwc", "nchw"):
            sel = [r for r in rows if r["dtype"] == dt and r["layout"] == lay]
            if not sel:
                continue
            same = [float(r["cudnn_us"]) / float(r["ours_us"]) for r in sel]
            line = f"| {dt} | {lay} | {geomean(same):.2f}x |"
            vs_base = []
            for r in sel:
                b = base.get((r["shape"], dt, lay))
                vs_base.append(b / float(r["ours_us"]) if b else float("nan"))
            if base:
                line += f" {geomean([v for v in vs_base if not math.isnan(v)]):.2f}x |"
            line += f" {statistics.median(float(r['frac']) for r in sel):.2f} |"
            slow = [f"{r['shape']} ({s:.2f}x)" for r, s in zip(sel, same)
                    if s < 1.0 and not dense(r)]
            line += f" {', '.join(slow) or 'none'} |"
            if base:
                slow_b = [f"{r['shape']} ({v:.2f}x)" for r, v in zip(sel, vs_base)
                          if v < 1.0 and not dense(r)]
                line += f" {', '.join(slow_b) or 'none'} |"
            print(line)
    dense_rows = [f"{r['shape']} {r['dtype']} {r['layout']} "
                  f"{float(r['cudnn_us']) / float(r['ours_us']):.2f}x" for r in rows if dense(r)]
    if dense_rows:
        print()
        print("Dense (groups = 1), against the same-run cuDNN: " + ", ".join(dense_rows) + ".")


if __name__ == "__main__":
    main()
