#!/usr/bin/env bash
# Everything that runs on the GPU machine, in one go. Run from the repository root:
#
#   scripts/gpu-check.sh OUTDIR
#
# It takes a build folder made on a build machine (default build-gpu, configured with default
# options so that nvcc is used; BUILD=... to choose another) and the runtime .debs of libuv1,
# libprotobuf-c1 and libcmocka0 in .deps/ (apt-get download on a build machine), both carried to
# the GPU machine. Writes full logs to OUTDIR and prints a short table last:
#   nvidia-smi.txt     the device as found
#   gpu-tests.log      ctest -L gpu
#   sass.txt.gz        cuobjdump --dump-sass of the kernel library
#   sass-summary.txt   per kernel: HMMA, LDSM, LDGSTS, 16-byte global loads/stores, local memory
#   bench.md/.csv      convd-bench-kernels against cuDNN on bench/shapes.csv ($BENCH_ARGS added)
#   check.log          this script's own trace
set -uo pipefail

OUT=${1:?usage: scripts/gpu-check.sh OUTDIR}
BUILD=${BUILD:-build-gpu}
SHAPES=${SHAPES:-bench/shapes.csv}
mkdir -p "$OUT"
exec 3>&1
exec > >(tee "$OUT/check.log") 2>&1

step() { printf '\n== %s (%s)\n' "$1" "$(date +%H:%M:%S)"; }

step "runtime libraries"
if compgen -G ".deps/*.deb" >/dev/null; then
    mkdir -p /tmp/deps
    for f in .deps/*.deb; do dpkg -x "$f" /tmp/deps; done
    export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
    echo "no .deps/*.deb: relying on installed libuv, protobuf-c, cmocka"
fi

# ctest files hold the absolute paths of the build machine; make them resolve here too.
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
if [ -n "$src" ] && [ "$src" != "$PWD" ] && [ ! -e "$src" ]; then
    mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src" && echo "linked $src -> $PWD"
fi

step "device"
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
head -15 "$OUT/nvidia-smi.txt"

step "GPU tests"
(cd "$BUILD" && ctest -L gpu --output-on-failure --timeout 300) >"$OUT/gpu-tests.log" 2>&1
tests_rc=$?
tail -25 "$OUT/gpu-tests.log"

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
    grep -E "mma_kernel|dw_nhwc|fma_kernel" "$OUT/sass-summary.txt" | head -12
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

# Optional (PROFILE=1): Nsight Compute on one kernel of each family, into profile.txt.
if [ "${PROFILE:-0}" = 1 ] && command -v ncu >/dev/null; then
    step "profile"
    for spec in "resnext50_l2 fp16 nhwc mma_kernel" "effnet_dw5 fp16 nhwc dw_nhwc" \
        "resnext50_l4 fp32 nhwc fma_kernel" "mbv2_dw_s2 fp16 nchw dw_nchw"; do
        set -- $spec
        echo "### $spec" >>"$OUT/profile.txt"
        timeout 120 ncu --clock-control none --kernel-name "regex:$4" --launch-count 1 \
            --section SpeedOfLight --section WarpStateStats --section Occupancy \
            --section LaunchStats --section MemoryWorkloadAnalysis \
            "$BUILD/bin/convd-bench-kernels" --shapes "$SHAPES" --only "$1" --dtypes "$2" \
            --layouts "$3" --iters 2 --warmup 1 --no-cudnn >>"$OUT/profile.txt" 2>&1
    done
    grep -E "###|Duration|Memory Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|Stall" \
        "$OUT/profile.txt" | head -40
fi

# ---- daemon benchmark: added here by the lead (convctl bench against a running convd) ----
# ---- end of the daemon benchmark ----

step "summary"
exec 1>&3
echo "tests: $(grep -E 'tests passed|tests failed' "$OUT/gpu-tests.log" | tail -1) (rc $tests_rc)"
echo "bench rc $bench_rc (1 = some output differed from cuDNN's)"
sed -n '/^Ceilings/,$p' "$OUT/bench.md"
