#!/usr/bin/env bash
# The serving benchmark on one GPU, in one go (about 4 to 5 minutes, under 6). Run from the
# repository root on the GPU machine:
#
#   bench/serving/serving-h200.sh OUTDIR
#
# Takes a GPU build folder made on a build machine ($BUILD, default build-gpu, as for
# scripts/gpu-check.sh: BUILD/pack.tgz from scripts/pack-gpu-build.sh is unpacked, .deps/*.deb
# supply libuv and protobuf-c) and measures, on latency_b1_resnext (bench/shapes.csv) in fp16 NHWC:
#   a. convd on the GPU (started here on a private socket, --backend gpu, not under MPS) with
#      `convctl bench --json`: memory gpu and host, P = 1, 4, 16, 64 clients x D = 1, 4;
#   b. the same convolution from P PyTorch processes (torch_clients.py): alone (time-sliced) at
#      P = 1, 4, 16, under MPS (a private control daemon started and stopped here) at
#      P = 1, 4, 16, 32, 64, and one process with batch P = 16, 32, 64;
#   c. the kernel alone at batch 32 (convd-bench-kernels) against the daemon at batch 32 with
#      GPU memory, 4 clients x depth 2 (target: at least 90% of the kernel's images/s);
#   d. the pinned host <-> device copy bandwidth at one request's sizes (copy_bw.py), the
#      yardstick of the host-memory rows.
# Writes to OUTDIR: serving.log (this script's trace), nvidia-smi.txt, daemon.log,
# daemon-status.txt, daemon-metrics.txt, convd.jsonl + convd-bench.log, shape-n32.csv,
# kernel-n32.md/.csv, daemon-n32.jsonl, copy-bw.json, torch.jsonl + torch.log, mps-log/,
# mps-servers.txt, serving.md and serving.csv (the tables, printed last; bench/serving/report.py).
#
# Environment: BUILD; DURATION (convctl seconds per row, default 2); TORCH_WARMUP and
# TORCH_SECONDS (default 1 and 2); TORCH=0 skips b and d; MPS=0 skips the MPS rows.
set -uo pipefail

OUT=${1:?usage: bench/serving/serving-h200.sh OUTDIR}
BUILD=${BUILD:-build-gpu}
DURATION=${DURATION:-2}
TORCH_WARMUP=${TORCH_WARMUP:-1}
TORCH_SECONDS=${TORCH_SECONDS:-2}
here=bench/serving
[ -f "$here/torch_clients.py" ] || { echo "run from the repository root"; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
exec 3>&1
exec > >(tee "$OUT/serving.log") 2>&1

step() { printf '\n== %s (%s, %ss in)\n' "$1" "$(date +%H:%M:%S)" "$SECONDS"; }

step "environment"
# shellcheck source=bench/serving/gpu-env.sh
. "$here/gpu-env.sh"

tmp=$(mktemp -d /tmp/convd-serving.XXXXXX)
sock=$tmp/convd.sock
dpid=""
# shellcheck source=bench/serving/lifecycle.sh
. "$here/lifecycle.sh"
trap bench_cleanup EXIT
trap 'exit 130' INT TERM

have_torch=0
if [ "${TORCH:-1}" = 1 ] && command -v python3 >/dev/null &&
    python3 -c 'import torch' 2>/dev/null; then
    have_torch=1
fi

step "device"
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
head -12 "$OUT/nvidia-smi.txt"

ctl() { "$BUILD/bin/convctl" --socket "$sock" --timeout 120000 "$@"; }
shape=(--shape latency_b1_resnext --csv bench/shapes.csv --dtype fp16 --layout nhwc)

step "convd on the GPU (not under MPS)"
# MPS is not running yet; the variables are dropped anyway so the daemon never becomes a client.
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
daemon_up=0
convd_start && daemon_up=1

# A JSON row for a convctl bench that printed none (it stopped before measuring): MEMORY CLIENTS
# DEPTH EXIT ERRFILE; the error is the last line convctl wrote on stderr.
error_row() {
    python3 -c '
import json, sys
lines = [l.strip() for l in open(sys.argv[5], errors="replace") if l.strip()]
why = lines[-1] if lines else "no output"
print(json.dumps({"memory": sys.argv[1], "clients": int(sys.argv[2]), "depth": int(sys.argv[3]),
                  "completed": 0, "images_per_s": None,
                  "error": "%s (convctl exit %s)" % (why, sys.argv[4])}))' "$@"
}

# a. P x D on latency_b1_resnext, GPU memory and host memory.
: >"$OUT/convd.jsonl"
[ "$daemon_up" = 1 ] && for mem in gpu host; do
    for p in 1 4 16 64; do
        for d in 1 4; do
            printf '%s P=%-2s D=%s: ' "$mem" "$p" "$d"
            echo "### memory $mem clients $p depth $d" >>"$OUT/convd-bench.log"
            line=$(timeout 90 "$BUILD/bin/convctl" --socket "$sock" --timeout 120000 bench \
                "${shape[@]}" --memory "$mem" --clients "$p" --depth "$d" \
                --duration "$DURATION" --json 2>"$tmp/err")
            rc=$?
            cat "$tmp/err" >>"$OUT/convd-bench.log"
            [ -n "$line" ] || line=$(error_row "$mem" "$p" "$d" "$rc" "$tmp/err")
            printf '%s\n' "$line" >>"$OUT/convd.jsonl"
            printf '%s\n' "$line" >>"$OUT/convd-bench.log"
            python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print("%.0f images/s, p50 %.0f us, p99 %.0f us, batch %.2f, daemon cpu %s us/req" % (d["images_per_s"], d["p50_us"], d["p99_us"], d["mean_batch"], d["daemon_cpu_us_per_req"]) if d.get("completed") else "", "error: " + d["error"] if d.get("error") else "")' "$line" 2>/dev/null || echo "(unreadable line)"
        done
    done
done

# c. Batch 32: the kernel alone, then the daemon with GPU memory, 4 clients x depth 2.
step "batch 32: kernel alone and through the daemon"
awk -F, -v OFS=, 'NR == 1 { print; next } $1 == "latency_b1_resnext" { $1 = $1 "_n32"; $2 = 32; print }' \
    bench/shapes.csv >"$OUT/shape-n32.csv"
cat "$OUT/shape-n32.csv"
timeout 150 "$BUILD/bin/convd-bench-kernels" --shapes "$OUT/shape-n32.csv" --dtypes fp16 \
    --layouts nhwc --no-cudnn --iters 15 --csv-out "$OUT/kernel-n32.csv" >"$OUT/kernel-n32.md" 2>&1 ||
    echo "convd-bench-kernels exit $? (see kernel-n32.md)"
grep -E '^\| latency_b1_resnext_n32' "$OUT/kernel-n32.md"
if [ "$daemon_up" = 1 ]; then
    echo "### n=32 memory gpu clients 4 depth 2" >>"$OUT/convd-bench.log"
    line=$(timeout 90 "$BUILD/bin/convctl" --socket "$sock" --timeout 120000 bench "${shape[@]}" \
        --n 32 --memory gpu --clients 4 --depth 2 --duration 3 --json 2>"$tmp/err")
    rc=$?
    cat "$tmp/err" >>"$OUT/convd-bench.log"
    [ -n "$line" ] || line=$(error_row gpu 4 2 "$rc" "$tmp/err")
    printf '%s\n' "$line" | tee "$OUT/daemon-n32.jsonl"
    convd_stop daemon-metrics.txt
fi

# d. Pinned copy bandwidth at one request's sizes (the host rows' input and output bytes).
if [ "$have_torch" = 1 ]; then
    step "pinned copy bandwidth"
    read -r bin bout < <(python3 -c '
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    print(d["input_bytes"], d["output_bytes"]); break
else:
    print(802816, 802816)' "$OUT/convd.jsonl" 2>/dev/null || echo "802816 802816")
    timeout 60 python3 "$here/copy_bw.py" --bytes-in "${bin:-802816}" --bytes-out "${bout:-802816}" \
        >"$OUT/copy-bw.json" 2>"$OUT/copy-bw.log" || echo "copy_bw.py exit $? (see copy-bw.log)"
    cat "$OUT/copy-bw.json"
fi

# b. PyTorch processes: alone, one process with batch P, then under MPS (torch_run:
# lifecycle.sh).
if [ "$have_torch" = 1 ]; then
    : >"$OUT/torch.jsonl"
    step "PyTorch processes alone (time-sliced)"
    for p in 1 4 16; do torch_run alone "$p" 1 120; done
    step "PyTorch, one process with batch P"
    for p in 16 32 64; do torch_run batch 1 "$p" 60; done
    if [ "${MPS:-1}" = 1 ]; then
        step "PyTorch processes under MPS"
        if mps_start; then
            for p in 1 4 16 32 64; do
                if [ "$SECONDS" -gt 320 ]; then
                    echo "skipping MPS P=$p: ${SECONDS}s spent, the run must stay under 6 minutes"
                    printf '{"mode": "mps", "procs": %s, "batch": 1, "images_per_s": null, "error": "skipped: time budget"}\n' \
                        "$p" >>"$OUT/torch.jsonl"
                    continue
                fi
                torch_run mps "$p" 1 $((p >= 32 ? 150 : 90))
            done
            mps_stop
        else
            echo "no MPS rows"
            for p in 1 4 16 32 64; do
                printf '{"mode": "mps", "procs": %s, "batch": 1, "images_per_s": null, "error": "MPS control daemon did not start"}\n' \
                    "$p" >>"$OUT/torch.jsonl"
            done
        fi
    fi
else
    echo "no torch in python3 (or TORCH=0): PyTorch rows and the copy bandwidth skipped"
fi

step "tables"
python3 "$here/report.py" "$OUT" >"$OUT/serving.md" 2>"$OUT/report.err" || cat "$OUT/report.err"
echo "total: ${SECONDS}s"
exec 1>&3 2>&3
cat "$OUT/serving.md"
echo "total: ${SECONDS}s; logs and JSON in $OUT"
