#!/usr/bin/env bash
# Runs bench/python/handover.py on the GPU machine twice: without MPS, then under an MPS control
# daemon of its own (private pipe and log directories, stopped afterwards). Writes
# OUTDIR/handover.md (both tables) and OUTDIR/handover-{plain,mps}.json.
#
#   bench/python/handover-h200.sh OUTDIR
set -uo pipefail
OUT=${1:?usage: handover-h200.sh OUTDIR}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
tmp=$(mktemp -d /tmp/convd-handover.XXXXXX)
stop_mps() { [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] && echo quit | nvidia-cuda-mps-control; }
trap 'stop_mps; rm -rf "$tmp"' EXIT
{
    echo "## Without MPS"
    echo
    timeout 90 python3 "$here/handover.py" --json "$OUT/handover-plain.json"
    echo
    echo "## Under MPS"
    echo
    export CUDA_MPS_PIPE_DIRECTORY=$tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=$tmp/mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    nvidia-cuda-mps-control -d || { echo "nvidia-cuda-mps-control -d failed"; exit 1; }
    timeout 90 python3 "$here/handover.py" --json "$OUT/handover-mps.json"
} 2>&1 | tee "$OUT/handover.md"
