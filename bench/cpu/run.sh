#!/bin/sh
# Runs PyTorch (bench/cpu/pytorch_cpu.py, Debian's python3-torch) and convd-bench-cpu on the same
# shapes, one after the other in the same session, and prints convd's table with PyTorch's
# times joined in. Without torch it falls back to the stored baseline numbers
# (pytorch_cpu_baseline.csv) and says so under the table.
#
# usage: bench/cpu/run.sh [--bin PATH] [options of convd-bench-cpu: --shapes --n --dtype
#                          --layouts --threads --runs --warmup]
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

tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
if [ -n "$py" ]; then
    version=$("$py" -c "import torch; print(torch.__version__)")
    "$py" "$here/pytorch_cpu.py" "$@" >"$tmp"
    label="measured in this run by bench/cpu/pytorch_cpu.py (torch $version)"
else
    cp "$here/pytorch_cpu_baseline.csv" "$tmp"
    label="stored baseline bench/cpu/pytorch_cpu_baseline.csv (torch not importable here)"
fi
"$bin" "$@" --pytorch "$tmp" --pytorch-label "$label"
