#!/usr/bin/env bash
# A short look at the serving path on the GPU machine, for tuning between full runs of
# serving-h200.sh: the launch floor (convd-bench-launch), then a few convd rows with GPU memory
# for each client spin budget in SPINS (CONVD_SPIN_US of the clients), and the daemon's
# launch-time and doorbell counters.
#   bench/serving/probe.sh OUTDIR    (BUILD, DURATION, ROWS="P:D ...", SPINS="50 200", LAUNCH=0,
#                                     DAEMON_ARGS="--slots 2 ..." for the daemon, or
#                                     VARIANTS=";--launch-ahead 1;--launch-ahead 2" to run the
#                                     rows under each argument set in turn; a set may start with
#                                     "nice=N " to run that daemon at nice value N, e.g.
#                                     VARIANTS=";nice=-10 " for the defaults at -10 after them;
#                                     MPS_PROCS="16 64": then that many PyTorch processes under
#                                     MPS, the baseline in the same call, in OUTDIR/torch.jsonl)
set -uo pipefail
OUT=${1:?usage: bench/serving/probe.sh OUTDIR}
BUILD=${BUILD:-build-gpu}
DURATION=${DURATION:-2}
ROWS=${ROWS:-"1:1 4:1 16:1 64:1 16:4 64:4"}
SPINS=${SPINS:-"50 200"}
mkdir -p "$OUT"
. bench/serving/gpu-env.sh
[ "${LAUNCH:-1}" = 1 ] && [ -x "$BUILD/bin/convd-bench-launch" ] && timeout 60 "$BUILD/bin/convd-bench-launch" --iters 1000 | tee "$OUT/launch.md"
tmp=$(mktemp -d)
# VARIANTS: daemon argument sets separated by ';' (an empty one: the defaults; read drops an
# empty last one, so put the defaults first), each run in turn on the same machine, so that one
# call compares them; default: DAEMON_ARGS alone.
IFS=';' read -r -a variants <<<"${VARIANTS-${DAEMON_ARGS:-}}"
[ ${#variants[@]} -gt 0 ] || variants=("")
v=0
for args in "${variants[@]}"; do
  for spin in $SPINS; do
    tag=v$v-spin$spin
    sock=$tmp/convd-$tag.sock
    echo "== daemon args '${args}', client spin $spin us ($tag)"
    prefix=() label=$args dargs=$args
    if [[ $args == nice=* ]]; then
        n=${args%% *}; prefix=(nice -n "${n#nice=}"); dargs=${args#"$n"}
    fi
    # shellcheck disable=SC2086
    "${prefix[@]}" "$BUILD/bin/convd" --socket "$sock" --backend gpu $dargs >"$OUT/daemon-$tag.log" 2>&1 &
    dpid=$!
    for _ in $(seq 1 200); do "$BUILD/bin/convctl" --socket "$sock" ping >/dev/null 2>&1 && break; sleep 0.1; done
    for row in $ROWS; do
        p=${row%:*}; d=${row#*:}
        line=$(CONVD_SPIN_US=$spin timeout 60 "$BUILD/bin/convctl" --socket "$sock" bench --shape latency_b1_resnext \
            --csv bench/shapes.csv --dtype fp16 --layout nhwc --memory gpu --clients "$p" --depth "$d" \
            --duration "$DURATION" --json 2>>"$OUT/errors.log")
        python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d["daemon_args"] = sys.argv[3] or "default"; d["client_spin_us"] = int(sys.argv[2]); print(json.dumps(d))' \
            "$line" "$spin" "$label" >>"$OUT/probe.jsonl" 2>/dev/null
        python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print("spin %s P=%s D=%s: %.0f img/s p50 %.1f p99 %.1f batch %.2f exec %.1f queue %.1f cpu %.2f fair %.2f-%.2f loop busy %.2f launch %.2f rings %.2f done %.2f (doorbells %.2f dispatch %.2f) query %.2f uv %.2f" % (sys.argv[2], d["clients"], d["depth"], d["images_per_s"], d["p50_us"], d["p99_us"], d["mean_batch"], d["exec_us"], d["queue_us"], d["daemon_cpu_us_per_req"] or -1, d["fair_min"] or 0, d["fair_max"] or 0, d.get("loop_busy") or -1, d.get("loop_launch") or -1, d.get("loop_rings") or -1, d.get("loop_completions") or -1, d.get("loop_doorbells") or -1, d.get("loop_dispatch") or -1, d.get("loop_query") or -1, d.get("loop_uv") or -1))' "$line" "$spin" 2>/dev/null || echo "spin $spin P=$p D=$d: failed"
    done
    "$BUILD/bin/convctl" --socket "$sock" metrics >"$OUT/metrics-$tag.txt" 2>&1
    grep -E "^convd_(launch|exec)_seconds_(sum|count)|^convd_doorbell(s|_wakeups)_total" "$OUT/metrics-$tag.txt"
    kill -TERM $dpid; wait $dpid
  done
  v=$((v + 1))
done
if [ -n "${MPS_PROCS:-}" ]; then
    # The same convolution from P PyTorch processes under MPS (bench/serving/lifecycle.sh's
    # control daemon, private folders), after the daemons above have exited.
    sock=$tmp/none.sock dpid=""
    # shellcheck source=bench/serving/lifecycle.sh
    . bench/serving/lifecycle.sh
    if mps_start; then
        for p in $MPS_PROCS; do
            TORCH_SECONDS=$DURATION TORCH_WARMUP=1 torch_run mps "$p" 1 150
        done
        mps_stop
    fi
fi
rm -rf "$tmp"
