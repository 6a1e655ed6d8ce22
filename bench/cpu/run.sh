#!/bin/sh
# Runs PyTorch (bench/cpu/pytorch_cpu.py, Debian's python3-torch) and convd-bench-cpu on the
# same shapes in the same session and prints convd's table with PyTorch's times joined in.
#
# The two alternate, PyTorch first: torch, convd, torch, convd. Each side reports, per shape and
# layout, the faster of its two passes (each pass the median of --runs calls), so that a burst of
# load from other processes during one pass does not decide a row. Without torch it falls back to
# the stored baseline numbers (pytorch_cpu_baseline.csv) and says so under the table.
#
# usage: bench/cpu/run.sh [--bin PATH] [options of convd-bench-cpu: --shapes --n --dtype
#                          --layouts --threads --runs --warmup --only]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin="$root/build/bin/convd-bench-cpu"
if [ "${1:-}" = "--bin" ]; then
    bin=$2
    shift 2
fi
cd "$root"

py=""
for cand in /usr/bin/python3 python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import torch" 2>/dev/null; then
        py=$cand
        break
    fi
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -n "$py" ]; then
    version=$("$py" -c "import torch; print(torch.__version__)")
    "$py" "$here/pytorch_cpu.py" "$@" >"$tmp/torch1.csv"
    "$bin" "$@" --csv >"$tmp/convd1.csv"
    "$py" "$here/pytorch_cpu.py" "$@" >"$tmp/torch2.csv"
    "$bin" "$@" --csv >"$tmp/convd2.csv"
    refs="$tmp/torch1.csv,$tmp/torch2.csv"
    label="measured in this run by bench/cpu/pytorch_cpu.py (torch $version)"
else
    "$bin" "$@" --csv >"$tmp/convd1.csv"
    "$bin" "$@" --csv >"$tmp/convd2.csv"
    refs="$here/pytorch_cpu_baseline.csv"
    label="stored baseline bench/cpu/pytorch_cpu_baseline.csv (torch not importable here)"
fi
"$bin" "$@" --ours "$tmp/convd1.csv,$tmp/convd2.csv" --pytorch "$refs" --pytorch-label "$label"
