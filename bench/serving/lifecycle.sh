# shellcheck shell=bash disable=SC2154 # tmp, OUT and dpid are the sourcing script's
# The pieces the GPU-machine benchmark scripts share (bench/serving/serving-h200.sh,
# bench/python/models-h200.sh): an MPS control daemon with private pipe and log folders, started
# and stopped around the rows that need it, and a cleanup that leaves nothing running. Sourced;
# the script sets tmp (its scratch folder), OUT (where logs go) and dpid (its convd, or "").

mps_on=0

# Starts MPS with pipes and logs under $tmp. Returns non-zero (and starts nothing) when it fails.
mps_start() {
    export CUDA_MPS_PIPE_DIRECTORY=$tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=$tmp/mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d; then
        mps_on=1
        echo "MPS control daemon started (pipes in $CUDA_MPS_PIPE_DIRECTORY)"
        return 0
    fi
    echo "nvidia-cuda-mps-control -d failed"
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    return 1
}

# Records the MPS servers that ran in $OUT/mps-servers.txt and stops the control daemon.
mps_stop() {
    echo get_server_list | nvidia-cuda-mps-control >"$OUT/mps-servers.txt" 2>&1
    echo "MPS servers that ran: $(tr '\n' ' ' <"$OUT/mps-servers.txt")"
    echo quit | nvidia-cuda-mps-control
    mps_on=0
    echo "MPS control daemon stopped"
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}

# The EXIT trap: MPS stopped, the daemon drained (SIGTERM, then SIGKILL after 10 s), MPS logs
# kept in $OUT, $tmp removed.
bench_cleanup() {
    if [ "$mps_on" = 1 ]; then
        echo quit | CUDA_MPS_PIPE_DIRECTORY=$tmp/mps-pipe nvidia-cuda-mps-control >/dev/null 2>&1
        echo "MPS control daemon stopped (cleanup)"
        mps_on=0
    fi
    if [ -n "$dpid" ] && kill -0 "$dpid" 2>/dev/null; then
        kill -TERM "$dpid" 2>/dev/null
        for _ in $(seq 1 100); do kill -0 "$dpid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$dpid" 2>/dev/null && kill -KILL "$dpid" 2>/dev/null
        dpid=""
    fi
    [ -d "$tmp/mps-log" ] && mkdir -p "$OUT/mps-log" && cp -r "$tmp/mps-log/." "$OUT/mps-log/"
    rm -rf "$tmp"
}
