#!/usr/bin/env bash
# The daemon's threads under ThreadSanitizer: convd built with -fsanitize=thread (CPU backend
# only, no GPU), driven by convctl bench on the null backend with the loop launching, with the
# launch thread (launch_threads = 1) and with three, with one slot, with batches paced by the
# launch thread (launch_ahead) and two doorbell threads, with clients killed mid-request, and on
# the CPU backend's worker threads, each also with gated chains (convctl bench --gated); then,
# where the main build has it (IT_LANES, default build/bin/it_lanes), the lanes' integration
# test against this daemon (its watchdog thread, launch threads taking turns on a lane). Fails
# on any ThreadSanitizer report or lost request.
#
#   tests/tsan/run.sh [BUILD_DIR]        (default build-tsan; configured here when absent)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-tsan}
tmp=$(mktemp -d /tmp/convd-tsan.XXXXXX)
pid=""
# shellcheck disable=SC2317 # called by the trap
cleanup() {
    if [[ -n $pid ]]; then kill -KILL "$pid" 2> /dev/null || true; fi
    rm -rf "$tmp"
}
trap cleanup EXIT
# GCC warns that it cannot instrument atomic_thread_fence (the rings' fences); TSan still sees
# the atomics around them.
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCONVD_GPU=off \
    -DCONVD_MAN=off -DCONVD_BUILD_BENCH=OFF -DCONVD_BUILD_TESTS=OFF \
    -DCMAKE_C_FLAGS="-fsanitize=thread -Wno-tsan" -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread \
    -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread > "$tmp/cmake.log" 2>&1 ||
    { cat "$tmp/cmake.log"; exit 1; }
cmake --build "$build" --target convd convctl --parallel "$(nproc)" > "$tmp/build.log" 2>&1 ||
    { tail -40 "$tmp/build.log"; exit 1; }
export TSAN_OPTIONS="halt_on_error=0 exitcode=66"
ctl() { "$build/bin/convctl" --socket "$tmp/s.sock" --timeout 120000 "$@"; }
failed=0
for args in "--backend null --launch-threads 0" "--backend null --launch-threads 1" \
    "--backend null --launch-threads 3 --doorbell-threads 2 --doorbell-spin-us 50" \
    "--backend null --launch-threads 1 --slots 1" \
    "--backend null --launch-threads 1 --launch-ahead 1 --doorbell-threads 2" \
    "--backend cpu --threads 2"; do
    rm -f "$tmp/s.sock"
    # shellcheck disable=SC2086
    "$build/bin/convd" --socket "$tmp/s.sock" --spin-us 20 $args 2> "$tmp/d.log" &
    pid=$!
    for _ in $(seq 1 300); do ctl ping > /dev/null 2>&1 && break; sleep 0.1; done
    n=20000
    [[ $args == *cpu* ]] && n=2000
    out=$(ctl bench --clients 3 --depth 4 --requests "$n" 2>&1) || true
    grep -q "$n completed, 0 failed" <<< "$out" || { echo "$args: $out"; failed=1; }
    # Stream-ordered chains: the loop's scan of ready words beside the launch threads.
    out=$(ctl bench --gated --clients 3 --depth 8 --requests "$n" 2>&1) || true
    grep -q "$n completed, 0 failed" <<< "$out" || { echo "$args --gated: $out"; failed=1; }
    # Clients killed with requests in flight.
    for _ in 1 2 3; do
        (timeout -s KILL 0.3 "$build/bin/convctl" --socket "$tmp/s.sock" bench --clients 2 \
            --depth 8 --duration 5 > /dev/null 2>&1 || true) 2> /dev/null
    done
    out=$(ctl bench --clients 1 --depth 1 --requests 500 2>&1) || true
    grep -q "500 completed, 0 failed" <<< "$out" || { echo "$args after kills: $out"; failed=1; }
    kill -TERM "$pid"
    rc=0
    wait "$pid" || rc=$?
    pid=""
    reports=$(grep -c "WARNING: ThreadSanitizer" "$tmp/d.log" || true)
    echo "$args: exit $rc, $reports ThreadSanitizer report(s)"
    if [[ $rc -ne 0 || $reports -ne 0 ]]; then
        grep -A30 "WARNING: ThreadSanitizer" "$tmp/d.log" | head -80
        failed=1
    fi
done
lanes=${IT_LANES:-$root/build/bin/it_lanes}
if [[ -x $lanes ]]; then
    rc=0
    CONVD_IT_DAEMON=$build/bin/convd "$lanes" > "$tmp/lanes.log" 2>&1 || rc=$?
    reports=$(grep -c "WARNING: ThreadSanitizer" "$tmp/lanes.log" || true)
    echo "it_lanes: exit $rc, $reports ThreadSanitizer report(s)"
    if [[ $rc -ne 0 || $reports -ne 0 ]]; then
        grep -E -A30 "WARNING: ThreadSanitizer|ERROR|FAILED" "$tmp/lanes.log" | head -80
        failed=1
    fi
else
    echo "it_lanes: $lanes not built; lanes not run under ThreadSanitizer"
fi
exit $failed
