# shellcheck shell=bash disable=SC2154 # tmp, OUT, BUILD, sock and dpid are the sourcing script's
# The pieces the GPU-machine benchmark scripts share (bench/serving/serving-h200.sh,
# bench/python/models-h200.sh): convd on the GPU started and stopped, an MPS control daemon with
# private pipe and log folders, started and stopped around the rows that need it, and a cleanup
# that leaves nothing running. Sourced; the script sets tmp (its scratch folder), OUT (where logs
# go), BUILD, sock (the daemon's socket) and dpid (its convd, or "").

# Starts convd on the GPU on $sock, DAEMON_ARGS added, with the environment as it is (an MPS
# client once mps_start has run), logging to $OUT/daemon.log and its status to
# $OUT/daemon-status.txt. Returns non-zero, with the log's tail, when it does not answer; the
# daemon is then stopped.
convd_start() {
    # DAEMON_ARGS: more options for the daemon (e.g. "--slots 2 --launch-threads 1");
    # DAEMON_PREFIX: a command it runs under (e.g. "nice -n -10").
    # shellcheck disable=SC2086
    ${DAEMON_PREFIX:-} "$BUILD/bin/convd" --socket "$sock" --backend gpu --log-level info ${DAEMON_ARGS:-} \
        >>"$OUT/daemon.log" 2>&1 &
    dpid=$!
    for _ in $(seq 1 240); do
        "$BUILD/bin/convctl" --socket "$sock" ping >/dev/null 2>&1 && break
        kill -0 "$dpid" 2>/dev/null || break
        sleep 0.25
    done
    if "$BUILD/bin/convctl" --socket "$sock" status >>"$OUT/daemon-status.txt" 2>&1; then
        tail -12 "$OUT/daemon-status.txt"
        return 0
    fi
    echo "convd did not start on the GPU: no rows. Its log:"
    tail -20 "$OUT/daemon.log"
    kill -KILL "$dpid" 2>/dev/null
    wait "$dpid" 2>/dev/null
    dpid=""
    return 1
}

# Stops the daemon convd_start started (SIGTERM, then its exit status), keeping its metrics in
# $OUT/FILE.
convd_stop() {
    "$BUILD/bin/convctl" --socket "$sock" metrics >"$OUT/$1" 2>&1
    kill -TERM "$dpid" 2>/dev/null
    local drc=0
    wait "$dpid" || drc=$?
    dpid=""
    echo "daemon exit after SIGTERM: $drc (log: daemon.log)"
}

mps_on=0

# P PyTorch processes running the serving shape (bench/serving/torch_clients.py; TORCH_SECONDS
# and TORCH_WARMUP, default 2 and 1): their JSON row appended to $OUT/torch.jsonl, the trace to
# $OUT/torch.log, one line printed. MODE is the row's label (alone, batch, mps).
torch_run() { # MODE PROCS BATCH TIMEOUT
    printf 'torch %s procs=%s batch=%s: ' "$1" "$2" "$3"
    echo "### mode $1 procs $2 batch $3" >>"$OUT/torch.log"
    local line rc=0
    line=$(timeout "$4" python3 bench/serving/torch_clients.py --procs "$2" --batch "$3" \
        --seconds "${TORCH_SECONDS:-2}" --warmup "${TORCH_WARMUP:-1}" --mps-note "$1" \
        2>>"$OUT/torch.log") ||
        rc=$?
    if [ -z "$line" ]; then
        line=$(printf '{"mode": "%s", "procs": %s, "batch": %s, "images_per_s": null, "error": "no result (exit %s; see torch.log)"}' \
            "$1" "$2" "$3" "$rc")
    fi
    printf '%s\n' "$line" | tee -a "$OUT/torch.log" >>"$OUT/torch.jsonl"
    python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print("%s images/s, p50 %s us, p99 %s us%s" % (d.get("images_per_s"), d.get("p50_us"), d.get("p99_us"), ", error: " + d["error"] if d.get("error") else ""))' "$line" 2>/dev/null || echo "$line"
}

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
