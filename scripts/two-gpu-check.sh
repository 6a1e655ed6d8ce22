#!/usr/bin/env bash
# One daemon per GPU, on a machine with two or more NVIDIA GPUs (issue 20's "test on a machine
# with two GPUs"). Run from the repository root on that machine, with a GPU build made as
# scripts/gpu-check.sh takes it (BUILD/pack.tgz unpacked, .deps for libuv and protobuf-c):
#
#   scripts/two-gpu-check.sh [BUILD]          (default build-gpu; exits 77 with fewer GPUs)
#
# Starts `convd --backend gpu --device N` on gpuN.sock of a private socket directory for N = 0
# and 1 ($CONVD_SOCKET_DIR, the layout of convd@.socket under /run/convd), then checks:
#   - each daemon runs on its own GPU: nvidia-smi lists each daemon's process on the bus id of
#     GPU N, and on no other;
#   - convctl --device N reaches the daemon of GPU N (status names gpuN.sock) and verify passes
#     there (random convolutions against the CPU reference);
#   - convctl --device N bench with tensors in GPU memory of device N, on both daemons at once:
#     every request completes and none fails;
#   - both daemons exit 0 on SIGTERM.
# Prints ok/bad lines and exits non-zero when a check failed.
set -uo pipefail
BUILD=${1:-build-gpu}
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "${ngpu:-0}" -lt 2 ]; then
    echo "skip: this machine has ${ngpu:-0} NVIDIA GPU(s); the check needs two"
    exit 77
fi
# shellcheck source=bench/serving/gpu-env.sh
. bench/serving/gpu-env.sh
convd=$BUILD/bin/convd
convctl=$BUILD/bin/convctl
tmp=$(mktemp -d /tmp/convd-two-gpu.XXXXXX)
export CONVD_SOCKET_DIR=$tmp
pids=()
passed=0
failed=0
cleanup() {
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT
ok() { echo "ok     $*"; passed=$((passed + 1)); }
bad() { echo "BAD    $*"; failed=$((failed + 1)); }

for d in 0 1; do
    "$convd" --backend gpu --device "$d" --socket "$tmp/gpu$d.sock" --log-level notice \
        2>"$tmp/gpu$d.log" &
    pids[d]=$!
done
for d in 0 1; do
    for _ in $(seq 1 240); do
        "$convctl" --device "$d" ping >/dev/null 2>&1 && break
        sleep 0.25
    done
    if ! "$convctl" --device "$d" ping >/dev/null 2>&1; then
        echo "the daemon of GPU $d did not answer; its log:"
        cat "$tmp/gpu$d.log"
        exit 1
    fi
done

# Each daemon's process on its own GPU's bus id, as the driver sees it.
for d in 0 1; do
    bus=$(nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader | awk -F', ' -v d="$d" '$1 == d {print $2}')
    on=$(nvidia-smi --query-compute-apps=pid,gpu_bus_id --format=csv,noheader |
        awk -F', ' -v p="${pids[d]}" '$1 == p {print $2}' | sort -u | tr '\n' ' ')
    if [ "$on" = "$bus " ]; then
        ok "the daemon of --device $d runs on GPU $d only ($bus)"
    else
        bad "the daemon of --device $d (pid ${pids[d]}) runs on '${on}', GPU $d is $bus"
    fi
done

for d in 0 1; do
    st=$("$convctl" --device "$d" status 2>&1)
    if grep -q "gpu$d.sock" <<<"$st" && grep -qw gpu <<<"$st"; then
        ok "convctl --device $d reaches the GPU daemon on gpu$d.sock"
    else
        bad "convctl --device $d status: $st"
    fi
    if out=$("$convctl" --device "$d" verify 2>&1) && grep -q PASS <<<"$out"; then
        ok "verify through --device $d"
    else
        bad "verify through --device $d: $out"
    fi
done

# Both at once, each client process with its tensors on its daemon's GPU.
for d in 0 1; do
    "$convctl" --device "$d" bench --shape latency_b1_resnext --csv bench/shapes.csv --dtype fp16 \
        --layout nhwc --memory gpu --clients 4 --depth 2 --duration 3 >"$tmp/bench$d.txt" 2>&1 &
    bench[d]=$!
done
for d in 0 1; do
    rc=0
    wait "${bench[d]}" || rc=$?
    if [ "$rc" -eq 0 ] && grep -q " 0 failed" "$tmp/bench$d.txt"; then
        ok "bench on GPU $d beside GPU $((1 - d)): $(grep -m1 throughput "$tmp/bench$d.txt" | sed 's/^ *//')"
    else
        bad "bench on GPU $d: exit $rc"
        sed 's/^/       /' "$tmp/bench$d.txt"
    fi
done

for d in 0 1; do
    kill -TERM "${pids[d]}"
    rc=0
    wait "${pids[d]}" || rc=$?
    if [ "$rc" -eq 0 ]; then ok "the daemon of GPU $d exits 0 on SIGTERM"; else bad "GPU $d: exit $rc"; fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
