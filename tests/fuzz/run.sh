#!/usr/bin/env bash
# Builds the libFuzzer targets (CONVD_FUZZ=ON, clang, ASan + UBSan, GPU and benchmarks off) and
# runs each one for a bounded time on a copy of its seed corpus, after replaying every reproducer
# kept in tests/fuzz/regressions/. Fails (non-zero exit) on any crash, timeout, leak, memory limit
# or sanitizer report; prints the executions of each target at the end.
#
#   tests/fuzz/run.sh [SECONDS_PER_TARGET] [BUILD_DIR]     default: 30, build-fuzz
#
# The targets run one after another, so a run takes about 4 x SECONDS_PER_TARGET plus the build
# (well under a minute: only the fuzz targets and the libraries they need are built). Each
# target's log, the corpus it grew and any crashing input are left in BUILD_DIR/fuzz-run/TARGET/.
#
# Runs as root on a fresh Debian 12 with the build's packages (.ci/run installs them) plus
# `clang libclang-rt-14-dev` (clang 14 and its libFuzzer/sanitizer runtimes), which CI must add
# to its apt-get line.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
seconds=${1:-30}
build_dir=${2:-$root/build-fuzz}
targets=(fuzz_client_message fuzz_request fuzz_ring fuzz_config)

if ! [[ $seconds =~ ^[0-9]+$ ]] || [[ $seconds -lt 1 ]]; then
    echo "run.sh: SECONDS_PER_TARGET must be a positive number (got '$seconds')" >&2
    exit 2
fi
if ! command -v clang > /dev/null; then
    echo "run.sh: clang not found; install it: apt-get install -y clang libclang-rt-14-dev" >&2
    exit 1
fi

if [[ ! -f $build_dir/CMakeCache.txt ]]; then
    generator=(-G "Unix Makefiles")
    command -v ninja > /dev/null && generator=(-G Ninja)
    CC=clang cmake -S "$root" -B "$build_dir" "${generator[@]}" -DCONVD_FUZZ=ON -DCONVD_GPU=off \
        -DCONVD_BUILD_BENCH=OFF -DCONVD_BUILD_TESTS=OFF
fi
if ! grep -qiE '^CONVD_FUZZ:BOOL=(ON|1|TRUE|YES)$' "$build_dir/CMakeCache.txt"; then
    echo "run.sh: $build_dir is not a fuzz build (CONVD_FUZZ=ON); name another folder" >&2
    exit 2
fi
cmake --build "$build_dir" --target fuzz --parallel "$(nproc 2> /dev/null || echo 2)"

# Leaks fail a run as crashes do; UBSan stops at its first report (-fno-sanitize-recover).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
limits=(-timeout=10 -rss_limit_mb=2048)

failed=()
summary=()
for t in "${targets[@]}"; do
    bin=$build_dir/bin/$t
    out=$build_dir/fuzz-run/$t
    rm -rf "$out"
    mkdir -p "$out/corpus"
    cp "$root/tests/fuzz/corpus/$t/"* "$out/corpus/"

    # Every reproducer found so far must pass before fuzzing starts.
    regressions=("$root/tests/fuzz/regressions/$t/"*)
    if [[ -e ${regressions[0]} ]]; then
        if ! "$bin" "${limits[@]}" "${regressions[@]}" > "$out/regressions.log" 2>&1; then
            echo "=== $t: a regression input fails (log: $out/regressions.log) ==="
            tail -n 40 "$out/regressions.log"
            failed+=("$t (regressions)")
            summary+=("$(printf '%-22s %12s  %s' "$t" "-" "regression failed")")
            continue
        fi
    fi

    echo "=== $t: ${seconds} s ==="
    rc=0
    "$bin" "${limits[@]}" -max_total_time="$seconds" -print_final_stats=1 \
        -artifact_prefix="$out/" "$out/corpus" > "$out/fuzz.log" 2>&1 || rc=$?
    # A crashed run has neither line: sed, not grep, so that no match is no error.
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/fuzz.log" | tail -n 1)
    cov=$(sed -n 's/^#[0-9]*[[:space:]]*DONE .* cov: \([0-9]*\) .*/\1/p' "$out/fuzz.log" |
        tail -n 1)
    # A sanitizer report that did not end the process still fails the run.
    if [[ $rc -ne 0 ]] ||
        grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:' "$out/fuzz.log"
    then
        echo "=== $t: FAILED (exit $rc; log and crashing input in $out) ==="
        tail -n 60 "$out/fuzz.log"
        failed+=("$t")
        summary+=("$(printf '%-22s %12s  %s' "$t" "${execs:-?}" "FAILED")")
    else
        summary+=("$(printf '%-22s %12s  ok, %s edges, %s corpus inputs' "$t" "${execs:-?}" \
            "${cov:-?}" "$(find "$out/corpus" -type f | wc -l)")")
    fi
done

echo
echo "=== fuzzing summary (${seconds} s per target) ==="
printf '%-22s %12s  %s\n' "target" "executions" "result"
printf '%s\n' "${summary[@]}"
if [[ ${#failed[@]} -ne 0 ]]; then
    echo "failed: ${failed[*]}"
    exit 1
fi
