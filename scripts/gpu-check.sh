#!/usr/bin/env bash
# Everything that runs on the GPU machine, in one go. Run from the repository root:
#
#   scripts/gpu-check.sh OUTDIR
#
# It takes a build folder made on a build machine (default build-gpu, configured with default
# options so that nvcc is used; BUILD=... to choose another) and the runtime .debs of libuv1,
# libprotobuf-c1 and libcmocka0 in .deps/ (apt-get download on a build machine; add python3-pytest
# and its dependencies, python3-pluggy, -py, -iniconfig, -packaging, -attr, -more-itertools and
# -exceptiongroup, for the Python GPU tests where the GPU machine has no pytest), both carried to
# the GPU machine. Writes full logs to OUTDIR and prints a short table last:
#   nvidia-smi.txt     the device as found
#   gpu-tests.log      ctest -L gpu, the Python package's GPU tests (python_gpu) among them
#   sass.txt.gz        cuobjdump --dump-sass of the kernel library
#   sass-summary.txt   per kernel: HMMA, LDSM, LDGSTS, 16-byte global loads/stores, local memory
#   bench.md/.csv      convd-bench-kernels against cuDNN on $SHAPES (default bench/shapes.csv;
#                      bench/shapes-extra.csv holds shapes not in it), $BENCH_ARGS added
#   bench-vs-base.md   with $BUILD/bin/convd-bench-kernels-base (scripts/build-base-bench.sh):
#                      that build's kernel times on the same shapes, and ours row by row against
#                      them (bench-base.md/.csv its own output)
#   torch-check.log    PyTorch's conv2d against the daemon (fixed, random and $SHAPES problems)
#   check.log          this script's own trace
set -uo pipefail

OUT=${1:?usage: scripts/gpu-check.sh OUTDIR}
BUILD=${BUILD:-build-gpu}
SHAPES=${SHAPES:-bench/shapes.csv}
mkdir -p "$OUT"
exec 3>&1
exec > >(tee "$OUT/check.log") 2>&1

step() { printf '\n== %s (%s)\n' "$1" "$(date +%H:%M:%S)"; }

# The packed build folder, the runtime .debs (and pytest where python3 lacks it), and the build
# machine's source path that the ctest files name: bench/serving/gpu-env.sh prepares them all.
step "runtime libraries"
# shellcheck source=bench/serving/gpu-env.sh
. bench/serving/gpu-env.sh

step "device"
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
head -15 "$OUT/nvidia-smi.txt"

# TESTS=0 skips the tests (a second benchmark of the same build on another CSV).
tests_rc=0
if [ "${TESTS:-1}" = 1 ]; then
    step "GPU tests"
    # python_gpu among them, on the python3 on PATH (CONVD_TEST_PYTHON, from gpu-env.sh): the
    # build machine's /usr/bin/python3 that ctest names has no CUDA torch.
    (cd "$BUILD" && ctest -L gpu --output-on-failure --timeout 600) >"$OUT/gpu-tests.log" 2>&1
    tests_rc=$?
    tail -25 "$OUT/gpu-tests.log"
fi

step "SASS"
lib=$(find "$BUILD" -name 'libconvd_gpu.a' | head -1)
[ -n "$lib" ] || lib="$BUILD/bin/convd-bench-kernels"  # links every kernel
if [ -n "$lib" ] && command -v cuobjdump >/dev/null; then
    cuobjdump --dump-sass "$lib" >"$OUT/sass.txt" 2>&1
    awk '
        /Function :/ { if (name != "") print name, h, l, a, g, s, loc; name = $3; h = l = a = g = s = loc = 0; next }
        /HMMA/ { h++ } /LDSM/ { l++ } /LDGSTS/ { a++ } /LDG\.E\.128/ { g++ } /STG\.E\.128/ { s++ }
        /LDL|STL/ { loc++ }
        END { if (name != "") print name, h, l, a, g, s, loc }' "$OUT/sass.txt" |
        sort -u | (echo "kernel HMMA LDSM LDGSTS LDG.E.128 STG.E.128 local"; cat) \
        >"$OUT/sass-summary.txt"
    gzip -f "$OUT/sass.txt"
    grep -E "mma_(tma_)?kernel|dw_|fma_kernel|pw_kernel" "$OUT/sass-summary.txt" | head -12
else
    echo "no cuobjdump or no libconvd_gpu.a"
fi

step "kernel benchmark"
# shellcheck disable=SC2086
"$BUILD/bin/convd-bench-kernels" --shapes "$SHAPES" --csv-out "$OUT/bench.csv" ${BENCH_ARGS:-} \
    >"$OUT/bench.md" 2>"$OUT/bench.err"
bench_rc=$?
cat "$OUT/bench.err" >>"$OUT/bench.md"
rm -f "$OUT/bench.err"

# Another build's kernels on the same device in the same call (scripts/build-base-bench.sh puts
# one at $BUILD/bin/convd-bench-kernels-base): our times row by row against it, for changes that
# must not make any row slower. Its cuDNN is not run again.
base_rc=0
if [ -x "$BUILD/bin/convd-bench-kernels-base" ]; then
    step "kernel benchmark of the base build"
    # shellcheck disable=SC2086
    "$BUILD/bin/convd-bench-kernels-base" --shapes "$SHAPES" --csv-out "$OUT/bench-base.csv" \
        --no-cudnn ${BENCH_ARGS:-} >"$OUT/bench-base.md" 2>&1
    python3 bench/gpu/report.py "$OUT/bench.csv" --against "$OUT/bench-base.csv" \
        >"$OUT/bench-vs-base.md" 2>&1
    base_rc=$?
    tail -3 "$OUT/bench-vs-base.md"
fi

# Optional (PROFILE=1): Nsight Compute on one kernel of each family, into profile.txt.
if [ "${PROFILE:-0}" = 1 ] && command -v ncu >/dev/null; then
    step "profile"
    # PROFILE_SPECS: "shape dtype layout kernel-regex;..." to profile others; PROFILE_ARGS are
    # added to the benchmark's arguments (e.g. --sweep-dw to reach non-default kernels) and
    # NCU_ARGS to Nsight Compute's (e.g. --launch-skip 2, --print-details all).
    specs=${PROFILE_SPECS:-"resnext50_l2 fp16 nhwc mma_(tma_)?kernel;effnet_dw5 fp16 nhwc dw_direct|dw_nhwc;resnext50_l4 fp32 nhwc pw_kernel|fma_kernel;mbv2_dw_s2 fp16 nchw dw_nchw"}
    IFS=';' read -r -a spec_list <<<"$specs"
    for spec in "${spec_list[@]}"; do
        set -- $spec
        echo "### $spec" >>"$OUT/profile.txt"
        # shellcheck disable=SC2086
        timeout 120 ncu --clock-control none --kernel-name "regex:$4" --launch-count 1 ${NCU_ARGS:-} \
            --section SpeedOfLight --section WarpStateStats --section Occupancy \
            --section LaunchStats --section MemoryWorkloadAnalysis \
            "$BUILD/bin/convd-bench-kernels" --shapes "$SHAPES" --only "$1" --dtypes "$2" \
            --layouts "$3" --iters 2 --warmup 1 --no-cudnn ${PROFILE_ARGS:-} >>"$OUT/profile.txt" 2>&1
    done
    grep -E "###|Duration|Memory Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|Stall" \
        "$OUT/profile.txt" | head -40
fi

# The daemon on the GPU (DAEMON=0 skips it): correctness through the whole serving path
# (convctl verify on named shapes of bench/shapes.csv; PyTorch's conv2d through convctl conv on
# fixed odd shapes, random ones and every row of $SHAPES at full size), then (DAEMON_BENCH=0
# skips it) the load benchmark: P client processes, each doing batch-1 resnext convolutions
# (fp16 NHWC, host memory) with D in flight, the same workload as the "many processes, one GPU"
# table of the cuDNN baseline.
daemon_rc=0
if [ "${DAEMON:-1}" = 1 ]; then
    step "daemon on the GPU"
    sock=/tmp/convd-gpu-check.sock
    rm -f "$sock"
    "$BUILD/bin/convd" --socket "$sock" --backend gpu --log-level info >"$OUT/daemon.log" 2>&1 &
    dpid=$!
    ctl() { "$BUILD/bin/convctl" --socket "$sock" "$@"; }
    for _ in $(seq 1 120); do ctl ping >/dev/null 2>&1 && break; sleep 0.5; done
    ctl status | tee "$OUT/daemon-status.txt"
    {
        for spec in "latency_b1_resnext fp16 nhwc" "resnext50_l2 bf16 nhwc" \
            "mbv2_dw_s2 fp32 nchw" "cpg2_hero fp16 nchw" "dense_resnet50_l1 bf16 nhwc"; do
            set -- $spec
            ctl verify --shape "$1" --csv bench/shapes.csv --dtype "$2" --layout "$3" --bias \
                --relu --repeat 2 || daemon_rc=1
        done
    } >"$OUT/daemon-verify.log" 2>&1
    grep -E "PASS|FAIL" "$OUT/daemon-verify.log" | head -12
    if command -v python3 >/dev/null && python3 -c 'import torch, numpy' 2>/dev/null; then
        python3 scripts/torch-check.py --convctl "$BUILD/bin/convctl" --socket "$sock" \
            --count 8 --shapes "$SHAPES" >"$OUT/torch-check.log" 2>&1 || daemon_rc=1
        tail -1 "$OUT/torch-check.log"
    fi
    # DAEMON_BENCH=0 keeps the correctness checks and skips the load benchmark.
    [ "${DAEMON_BENCH:-1}" = 1 ] && {
        echo "| clients | depth | requests/s | images/s | p50 | p99 | mean batch |"
        echo "|---:|---:|---:|---:|---:|---:|---:|"
        for cd in "1 1" "4 1" "16 1" "16 4" "64 1" "64 4"; do
            set -- $cd
            ctl bench --shape latency_b1_resnext --csv bench/shapes.csv --dtype fp16 \
                --layout nhwc --clients "$1" --depth "$2" --duration 4 \
                >"$OUT/daemon-bench-$1x$2.txt" 2>&1 || daemon_rc=1
            awk -v c="$1" -v d="$2" '
                /requests\/s/ && !rq { for (i = 1; i <= NF; i++) if ($(i+1) ~ /^requests\/s/) rq = $i }
                /images\/s/ && !im { for (i = 1; i <= NF; i++) if ($(i+1) ~ /^images\/s/) im = $i }
                /latency/ { gsub(",", ""); p50 = $3 " " $4; p99 = $6 " " $7 }
                /mean .* per request/ { match($0, /mean [0-9.]+/); mb = substr($0, RSTART + 5, RLENGTH - 5) }
                END { printf "| %s | %s | %s | %s | %s | %s | %s |\n", c, d, rq, im, p50, p99, mb }' \
                "$OUT/daemon-bench-$1x$2.txt"
        done
    } | tee "$OUT/daemon-bench.md"
    ctl metrics >"$OUT/daemon-metrics.txt" 2>&1
    kill -TERM "$dpid"
    wait "$dpid" || daemon_rc=1
    echo "daemon exit after SIGTERM: $? (log: daemon.log)"
fi

step "summary"
exec 1>&3
[ -f "$OUT/gpu-tests.log" ] &&
    echo "tests: $(grep -E 'tests passed|tests failed' "$OUT/gpu-tests.log" | tail -1) (rc $tests_rc)"
echo "bench rc $bench_rc (1 = some output differed from cuDNN's)"
[ -f "$OUT/bench-vs-base.md" ] &&
    echo "against the base build: rc $base_rc (1 = a row more than 3% slower, or rows differ); $(grep -E '^[0-9]+ rows' "$OUT/bench-vs-base.md")"
echo "daemon rc $daemon_rc (verify, torch-check, bench, clean exit)"
[ -f "$OUT/daemon-bench.md" ] && cat "$OUT/daemon-bench.md"
sed -n '/^Ceilings/,$p' "$OUT/bench.md"
