#!/usr/bin/env bash
# Nsight Compute reports of single kernel launches, on the GPU machine. Run from the repository
# root after scripts/gpu-check.sh (or with the same carried build folder and .deps):
#
#   scripts/gpu-profile.sh OUTDIR SHAPE:DTYPE:LAYOUT:KERNEL_REGEX ...
#
# For each target it runs convd-bench-kernels on that one shape (no cuDNN, one iteration) under
# ncu, profiling the first launch whose kernel name matches the regex, with the full section set
# and the clocks left alone (METHOD.md). Writes OUTDIR/ncu-SHAPE-DTYPE-LAYOUT.txt (and .stalls,
# the stall reasons per issued instruction), and prints
# the lines that say where the time went (throughputs, issue slots, occupancy, top stall reasons).
# With SOURCE=1 it also writes OUTDIR/ncu-SHAPE-DTYPE-LAYOUT-sass.csv, every SASS instruction with
# its execution count and stall samples; bench/gpu/sass_hotspots.py summarises it.
set -uo pipefail

OUT=${1:?usage: scripts/gpu-profile.sh OUTDIR SHAPE:DTYPE:LAYOUT:REGEX ...}
shift
BUILD=${BUILD:-build-gpu}
SHAPES=${SHAPES:-bench/shapes.csv}
mkdir -p "$OUT"

if [ -f "$BUILD/pack.tgz" ] && [ ! -x "$BUILD/bin/convd-bench-kernels" ]; then
    tar xzf "$BUILD/pack.tgz" -C "$BUILD"
fi
if compgen -G ".deps/*.deb" >/dev/null; then
    mkdir -p /tmp/deps
    for f in .deps/*.deb; do dpkg -x "$f" /tmp/deps; done
    export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
command -v ncu >/dev/null || { echo "gpu-profile: ncu not found" >&2; exit 1; }

rc=0
for t in "$@"; do
    IFS=: read -r shape dtype layout regex <<<"$t"
    log="$OUT/ncu-$shape-$dtype-$layout.txt"
    ncu --clock-control none --set full --import-source no -k "regex:$regex" --launch-count 1 \
        "$BUILD/bin/convd-bench-kernels" --shapes "$SHAPES" --only "$shape" --dtypes "$dtype" \
        --layouts "$layout" --no-cudnn --iters 1 --warmup 0 >"$log" 2>&1 || rc=1
    echo "== $shape $dtype $layout ($regex)"
    grep -E "^  [a-z_]+_kernel|Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|L1/TEX Hit|L2 Hit|Issue Slots Busy|Issued Ipc Active|Registers Per Thread|Achieved Occupancy|Theoretical Occupancy|Block Limit Registers|Executed Instructions  |Warp Cycles Per Issued|Local Memory Spilling" "$log" | head -24
    # where warps wait, per issued instruction (the numbers behind the warp-state chart)
    ncu --clock-control none -k "regex:$regex" --launch-count 1 \
        --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
        "$BUILD/bin/convd-bench-kernels" --shapes "$SHAPES" --only "$shape" --dtypes "$dtype" \
        --layouts "$layout" --no-cudnn --iters 1 --warmup 0 >"$log.stalls" 2>&1 || rc=1
    grep -E "stalled" "$log.stalls" | sort -k3 -g -r | head -6
    if [ "${SOURCE:-0}" = 1 ]; then
        ncu --clock-control none -k "regex:$regex" --launch-count 1 --section SourceCounters \
            --page source --print-source sass --csv \
            "$BUILD/bin/convd-bench-kernels" --shapes "$SHAPES" --only "$shape" --dtypes "$dtype" \
            --layouts "$layout" --no-cudnn --iters 1 --warmup 0 >"${log%.txt}-sass.csv" 2>&1 || rc=1
    fi
done
exit $rc
