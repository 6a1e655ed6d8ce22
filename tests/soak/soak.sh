#!/usr/bin/env bash
# The soak (tests/soak/README.md): builds convd and convd-soak with AddressSanitizer and
# UndefinedBehaviorSanitizer, runs the soak for SECONDS (default 120) and fails if it fails or if
# the daemon's stderr, or the soak's own (clients and hostile processes), holds a sanitizer report.
#
#   tests/soak/soak.sh [SECONDS] [-- convd-soak options]     e.g. tests/soak/soak.sh 600 -- --clients 16
#
#   BUILD=dir        use this (already configured) build folder instead of configuring build-soak/
#                    with -DCONVD_SANITIZE=ON -DCONVD_GPU=off -DCONVD_BUILD_BENCH=OFF
#   SOAK_OUT=dir     where the CSV and the logs go (default: a new /tmp/convd-soak.XXXXXX)
#
# Writes SOAK_OUT/soak.csv (one row per second), daemon.log (the daemon's stderr), soak.out and
# soak.err. Exits 0 when the soak passed and no sanitizer said anything.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
seconds=120
if [[ $# -gt 0 && $1 != -- ]]; then
    seconds=$1
    shift
fi
if [[ $# -gt 0 && $1 == -- ]]; then
    shift
fi
if ! [[ $seconds =~ ^[0-9]+$ ]] || [[ $seconds -lt 1 ]]; then
    echo "soak.sh: SECONDS must be a positive integer, got '$seconds'" >&2
    exit 2
fi

# shellcheck source=scripts/deps.sh
source "$root/scripts/deps.sh"
deps_ensure

jobs=$(nproc 2> /dev/null || echo 2)
if [[ -n ${BUILD:-} ]]; then
    build=$BUILD
else
    build=$root/build-soak
    generator=()
    if [[ ! -f $build/CMakeCache.txt ]]; then
        if command -v ninja > /dev/null; then generator=(-G Ninja); else generator=(-G "Unix Makefiles"); fi
    fi
    cmake -S "$root" -B "$build" "${generator[@]}" -DCONVD_SANITIZE=ON -DCONVD_GPU=off \
        -DCONVD_BUILD_BENCH=OFF
fi
cmake --build "$build" --parallel "$jobs" --target convd convd-soak

out=${SOAK_OUT:-$(mktemp -d /tmp/convd-soak.XXXXXX)}
mkdir -p "$out"

# Leak checking on (the daemon's exit is checked; so is each client process that exits
# normally). ASan's quarantine (freed memory held back to catch use after free) is 256 MB by
# default and takes minutes to fill, which would look like growth of the daemon's RSS: 16 MB
# still holds seconds of frees at the soak's rate, and keeps the RSS bound meaningful.
asan=${ASAN_OPTIONS:-abort_on_error=0}
[[ $asan == *quarantine_size_mb=* ]] || asan+=:quarantine_size_mb=16
export ASAN_OPTIONS=$asan:detect_leaks=1
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
echo "soak.sh: $seconds s; ASAN_OPTIONS=$ASAN_OPTIONS; output in $out"

# stderr shown and kept too; waited for before it is scanned.
exec 4> >(tee "$out/soak.err" >&2)
tee_pid=$!
set +e
"$build/bin/convd-soak" --seconds "$seconds" --csv "$out/soak.csv" \
    --daemon-log "$out/daemon.log" "$@" 2>&4 | tee "$out/soak.out"
status=("${PIPESTATUS[@]}")
set -e
exec 4>&-
wait "$tee_pid" || true
rc=${status[0]} # the soak's exit status, not tee's

# The daemon's stderr (convd-soak scans it too) and the soak's own.
reports=0
for f in "$out/daemon.log" "$out/soak.err"; do
    if grep -E -n 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|SUMMARY: (AddressSanitizer|UndefinedBehaviorSanitizer|LeakSanitizer)' \
        "$f" > "$out/reports.txt"; then
        echo "soak.sh: sanitizer report(s) in $f:" >&2
        head -20 "$out/reports.txt" >&2
        reports=$((reports + 1))
    fi
done
rm -f "$out/reports.txt"

if [[ $rc -ne 0 || $reports -ne 0 ]]; then
    echo "soak.sh: FAIL (convd-soak exit $rc, $reports log(s) with sanitizer reports); see $out" >&2
    exit 1
fi
echo "soak.sh: PASS ($out)"
