#!/usr/bin/env bash
# Whole models through convd on one GPU, in one go (about 8 to 10 minutes with every phase).
# Run from the repository root on the GPU machine:
#
#   bench/python/models-h200.sh OUTDIR
#
# Takes a GPU build folder made on a build machine ($BUILD, default build-gpu, prepared as
# bench/serving/gpu-env.sh does: BUILD/pack.tgz unpacked, .deps/*.deb for libuv and protobuf-c)
# and python3 with torch and torchvision (torch 2.11 / torchvision 0.26 there). Then:
#   0. (TESTS=1, the default) the package's GPU tests against a GPU daemon:
#      python3 -m pytest python/tests/test_gpu.py (CUDA tensors in every dtype and layout, the
#      stream rule, registration per allocation, the four models in fp32/fp16/bf16);
#   a. convd on the GPU (started here on a private socket, --backend gpu, not under MPS) and
#      bench/python/models.py --mode convd at P = 1, 4, 16 processes: the four models patched
#      with convd.torch.patch, GPU tensors, batch 1;
#   b. the plain models, P = 1, 4, 16 processes alone (time-sliced);
#   c. the plain models under MPS (a private control daemon started and stopped here), P = 1,
#      4, 16;
#   d. convd again, started under that MPS with its clients: the clients' own GPU work (all but
#      the convolutions) no longer takes turns with the daemon's in time slices. The clients
#      order their requests on their streams through gates (docs/python.md, "Stream
#      ordering") when the daemon speaks protocol 3;
#   e. (PHASES with convd-mps-sync) d with the synchronous path instead
#      (CONVD_STREAM_ORDERED=0: each convolution synchronises the stream and waits), to compare
#      the two in one run.
# After the model rows of a and d, bench/python/cuda_call.py splits one convolution's time in
# that setting (cuda-call-convd.md, cuda-call-convd-mps.md).
# Each row: images/s of all processes together, the latency of one forward p50/p99/p99.9.
# Writes to OUTDIR: models.log (this script's trace), nvidia-smi.txt, daemon.log,
# daemon-status.txt, daemon-metrics-{convd,convd-mps}.txt, pytest-gpu.log, models.jsonl,
# mps-log/, models.md (the table, printed last, with each convd mode's ratio to MPS) and
# batch-split.md (bench/python/batch_split.py over the daemons' metrics: where their batches'
# time went; the split is complete with DAEMON_ARGS="--batch-timing 1").
#
# Environment: BUILD; DTYPE (fp16, bf16 or fp32; default fp16); SECONDS_PER_ROW (measured
# seconds per model and row, default 2); WARMUP (default 1); MODELS (comma-separated, default
# the four); PROCS (default "1 4 16"); TESTS=0 skips step 0; PHASES (default
# "convd plain mps convd-mps convd-mps-sync") picks the rows: a, b, c, d and e; DAEMON_ARGS,
# more options for each daemon started (bench/serving/lifecycle.sh): "--batch-timing 1" puts
# each batch's device time in the metrics files and cuda_call.py's "daemon device" column;
# DAEMON_PREFIX, a command the daemon runs under (e.g. "nice -n -10"); CUDA_SCHED (auto, spin,
# yield or block: how every PyTorch process of the rows waits for its GPU, models.py
# --cuda-sched); CLIENT_MPS_THREADS (a percentage: the clients of phase d, not the daemon, get
# CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, so that their kernels leave SMs to the daemon's); CALLS=0
# skips the one-call splits (cuda_call.py); CALL_ARGS adds arguments to them (--split).
set -uo pipefail

OUT=${1:?usage: bench/python/models-h200.sh OUTDIR}
BUILD=${BUILD:-build-gpu}
DTYPE=${DTYPE:-fp16}
ROW_SECONDS=${SECONDS_PER_ROW:-2}
WARMUP=${WARMUP:-1}
MODELS=${MODELS:-resnext50_32x4d,regnet_y_400mf,mobilenet_v3_small,convnext_tiny}
PROCS=${PROCS:-1 4 16}
PHASES=${PHASES:-convd plain mps convd-mps convd-mps-sync}
here=bench/python
[ -f "$here/models.py" ] || { echo "run from the repository root"; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
exec 3>&1
exec > >(tee "$OUT/models.log") 2>&1

step() { printf '\n== %s (%s, %ss in)\n' "$1" "$(date +%H:%M:%S)" "$SECONDS"; }

step "environment"
# shellcheck source=bench/serving/gpu-env.sh
. bench/serving/gpu-env.sh
export CONVD_CLIENT_LIB=$PWD/$BUILD/lib/libconvd-client.so
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
python3 -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))' ||
    { echo "python3 has no torch with a GPU: nothing to measure"; exit 1; }
python3 -c 'import convd; print("convd package over", convd.library_path())' || exit 1

tmp=$(mktemp -d /tmp/convd-models.XXXXXX)
sock=$tmp/convd.sock
dpid=""
# shellcheck source=bench/serving/lifecycle.sh
. bench/serving/lifecycle.sh
trap bench_cleanup EXIT
trap 'exit 130' INT TERM

step "device"
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
head -12 "$OUT/nvidia-smi.txt"

if [ "${TESTS:-1}" = 1 ]; then
    step "the package's GPU tests (python/tests/test_gpu.py)"
    # The tests start their own GPU daemon from CONVD_DAEMON.
    (cd python && CONVD_DAEMON=$PWD/../$BUILD/bin/convd timeout 300 python3 -m pytest -q \
        -p no:cacheprovider -rs tests/test_gpu.py) >"$OUT/pytest-gpu.log" 2>&1
    echo "pytest exit $? (pytest-gpu.log):"
    tail -15 "$OUT/pytest-gpu.log"
fi

: >"$OUT/models.jsonl"
row() { # MODE LABEL PROCS TIMEOUT [--socket S]
    local mode=$1 label=$2 p=$3 limit=$4
    shift 4
    printf '%s P=%s: ' "$label" "$p"
    timeout "$limit" python3 "$here/models.py" --mode "$mode" --label "$label" --procs "$p" \
        --models "$MODELS" --dtype "$DTYPE" --seconds "$ROW_SECONDS" --warmup "$WARMUP" \
        --cuda-sched "${CUDA_SCHED:-auto}" "$@" >"$tmp/row.jsonl" 2>>"$OUT/models-stderr.log"
    local rc=$?
    if [ ! -s "$tmp/row.jsonl" ]; then
        for m in ${MODELS//,/ }; do
            printf '{"model": "%s", "mode": "%s", "procs": %s, "dtype": "%s", "batch": 1, "images_per_s": null, "error": "no result (exit %s; see models-stderr.log)"}\n' \
                "$m" "$label" "$p" "$DTYPE" "$rc" >>"$tmp/row.jsonl"
        done
    fi
    cat "$tmp/row.jsonl" >>"$OUT/models.jsonl"
    python3 -c '
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    if d.get("images_per_s"):
        print("  %-20s %8.1f images/s  p50 %.2f ms  p99 %.2f ms" % (d["model"], d["images_per_s"], d["p50_ms"], d["p99_ms"]))
    else:
        print("  %-20s error: %s" % (d["model"], d.get("error")))' "$tmp/row.jsonl"
}
# A row's time limit: starting P processes (torch, torchvision, CUDA contexts: a minute, plus
# more for many), and per model building, warming up and measuring.
n_models=$(echo "$MODELS" | tr ',' '\n' | grep -c .)
limit_for() { echo $((60 + 3 * $1 + n_models * (WARMUP + ROW_SECONDS + 30))); }

# One convolution's time split (bench/python/cuda_call.py), into $OUT/cuda-call-LABEL.md.
calls() {
    [ "${CALLS:-1}" = 0 ] && return
    echo "one call, split (cuda_call.py, $1):"
    # shellcheck disable=SC2086  # CALL_ARGS is a list of words
    timeout 180 python3 "$here/cuda_call.py" --socket "$sock" ${CALL_ARGS:-} \
        --json "$OUT/cuda-call-$1.jsonl" >"$OUT/cuda-call-$1.md" 2>>"$OUT/models-stderr.log"
    cat "$OUT/cuda-call-$1.md"
}
want() { case " $PHASES " in *" $1 "*) return 0 ;; esac; return 1; }

if want convd; then
    step "convd on the GPU (not under MPS)"
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    if convd_start; then
        for p in $PROCS; do row convd convd "$p" "$(limit_for "$p")" --socket "$sock"; done
        calls convd
        convd_stop daemon-metrics-convd.txt
    fi
fi

if want plain; then
    step "plain PyTorch processes alone (time-sliced)"
    for p in $PROCS; do row plain plain "$p" "$(limit_for "$p")"; done
fi

if want mps || want convd-mps || want convd-mps-sync; then
    if mps_start; then
        if want mps; then
            step "plain PyTorch processes under MPS"
            for p in $PROCS; do row plain mps "$p" "$(limit_for "$p")"; done
        fi
        # The daemon and its clients are all MPS clients: the clients' own kernels (batch
        # norm, activations, additions) and the daemon's run side by side instead of taking
        # turns in time slices.
        if want convd-mps; then
            step "convd on the GPU under MPS, its clients too"
            if convd_start; then
                for p in $PROCS; do
                    if [ -n "${CLIENT_MPS_THREADS:-}" ]; then
                        CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$CLIENT_MPS_THREADS \
                            row convd convd-mps "$p" "$(limit_for "$p")" --socket "$sock"
                    else
                        row convd convd-mps "$p" "$(limit_for "$p")" --socket "$sock"
                    fi
                done
                calls convd-mps
                convd_stop daemon-metrics-convd-mps.txt
            fi
        fi
        if want convd-mps-sync; then
            step "convd on the GPU under MPS, its clients too, without gates"
            if convd_start; then
                for p in $PROCS; do
                    CONVD_STREAM_ORDERED=0 row convd convd-mps-sync "$p" "$(limit_for "$p")" \
                        --socket "$sock"
                done
                CONVD_STREAM_ORDERED=0 calls convd-mps-sync
                convd_stop daemon-metrics-convd-mps-sync.txt
            fi
        fi
        mps_stop
    else
        echo "no MPS rows"
    fi
fi

step "table"
python3 "$here/models.py" --report "$OUT/models.jsonl" >"$OUT/models.md" 2>"$OUT/report.err" ||
    cat "$OUT/report.err"
# Where each daemon's batches spent their time (bench/python/batch_split.py).
set -- "$OUT"/daemon-metrics-*.txt
if [ -e "$1" ]; then
    python3 "$here/batch_split.py" "$@" >"$OUT/batch-split.md" 2>>"$OUT/report.err" ||
        cat "$OUT/report.err"
fi
echo "total: ${SECONDS}s"
exec 1>&3 2>&3
cat "$OUT/models.md"
[ -f "$OUT/batch-split.md" ] && cat "$OUT/batch-split.md"
echo "total: ${SECONDS}s; logs and JSON in $OUT"
