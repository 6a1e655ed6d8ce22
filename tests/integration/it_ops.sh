#!/usr/bin/env bash
# Operating convd from scripts and monitoring, against real daemons (CPU backend) whose sockets
# sit in a temporary directory laid out as one daemon per GPU (gpu0.sock, gpu1.sock):
#   - convctl --device N reaches the daemon of GPU N through $CONVD_SOCKET_DIR (the two daemons
#     are told apart by their limits), and --socket and $CONVD_SOCKET win over it;
#   - SIGHUP: live keys applied (seen by new clients), a key that takes a restart refused with a
#     sentence naming it and nothing applied, a broken file refused with its typo hint, each
#     outcome counted in the metrics;
#   - the metrics textfile: rewritten periodically and atomically (never seen half-written),
#     every sample labelled with the socket, valid exposition text, moved by a reload, removed
#     when the daemon stops;
#   - typo hints on the daemon's own command line.
#
#   it_ops.sh CONVD CONVCTL
set -euo pipefail

convd=$1
convctl=$2
if ! command -v python3 > /dev/null; then
    echo "skip: python3 reads the JSON and the metrics here"
    exit 77
fi
tmp=$(mktemp -d /tmp/convd-it-ops.XXXXXX)
pids=()
passed=0
failed=0

cleanup() {
    for p in "${pids[@]}"; do
        if kill -0 "$p" 2> /dev/null; then
            kill -KILL "$p" 2> /dev/null || true
            wait "$p" 2> /dev/null || true
        fi
    done
    rm -rf "$tmp"
}
trap cleanup EXIT

ok() {
    echo "ok     $*"
    passed=$((passed + 1))
}
bad() {
    echo "FAILED $*"
    failed=$((failed + 1))
}
# expect NAME ACTUAL WANTED
expect() {
    if [[ $2 == "$3" ]]; then ok "$1 ($2)"; else bad "$1: got '$2', want '$3'"; fi
}
# A field of the one JSON object on stdin.
jfield() { python3 -c 'import json, sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"; }
# A sample of a Prometheus text file: metric{labels} -> value (labels as written, or "").
sample() {
    python3 - "$1" "$2" << 'EOF2'
import re, sys
path, want = sys.argv[1], sys.argv[2]
for line in open(path):
    m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$', line.rstrip("\n"))
    if m and (m.group(1) + (m.group(2) or "")) == want:
        print(m.group(3))
        break
EOF2
}
# wait_for SECONDS CMD...: until CMD succeeds.
wait_for() {
    local deadline=$((SECONDS + $1))
    shift
    until "$@" > /dev/null 2>&1; do
        [[ $SECONDS -lt $deadline ]] || return 1
        sleep 0.1
    done
}

export CONVD_SOCKET_DIR=$tmp/run
unset CONVD_SOCKET
mkdir -p "$CONVD_SOCKET_DIR" "$tmp/prom"
conf=$tmp/gpu0.conf
prom=$tmp/prom/convd-gpu0.prom
# {device} becomes the daemon's --device: one file per GPU from a shared file.
cat > "$conf" << EOF2
max_inflight = 100
metrics_textfile = $tmp/prom/convd-gpu{device}.prom
metrics_textfile_interval_ms = 1000
EOF2

# Two daemons, as for two GPUs; the CPU backend stands in for each.
"$convd" --backend cpu --threads 1 --device 0 --config "$conf" \
    --socket "$CONVD_SOCKET_DIR/gpu0.sock" --log-level notice 2> "$tmp/gpu0.log" &
pids+=($!)
pid0=$!
"$convd" --backend cpu --threads 1 --config /dev/null --max-inflight 7 \
    --socket "$CONVD_SOCKET_DIR/gpu1.sock" --log-level notice 2> "$tmp/gpu1.log" &
pids+=($!)
pid1=$!
for d in 0 1; do
    if ! wait_for 120 "$convctl" --device "$d" ping; then
        echo "the daemon of device $d did not answer:"
        cat "$tmp/gpu$d.log"
        exit 1
    fi
done

# --- one daemon per GPU -------------------------------------------------------------------------
st0=$("$convctl" --device 0 status --json)
st1=$("$convctl" status --device 1 --json)
expect "--device 0 reaches gpu0.sock" "$(jfield socket <<< "$st0")" "$CONVD_SOCKET_DIR/gpu0.sock"
expect "--device 0 is the daemon with max_inflight 100" "$(jfield max_inflight <<< "$st0")" 100
expect "--device 1 (after the command) reaches gpu1.sock" "$(jfield socket <<< "$st1")" \
    "$CONVD_SOCKET_DIR/gpu1.sock"
expect "--device 1 is the daemon with max_inflight 7" "$(jfield max_inflight <<< "$st1")" 7
out=$("$convctl" --device 1 verify --json)
expect "verify through --device 1" "$(jfield result <<< "$out")" PASS
rc=0
out=$("$convctl" --device 2 ping 2>&1) || rc=$?
if [[ $rc -eq 1 ]] && grep -q "$CONVD_SOCKET_DIR/gpu2.sock" <<< "$out"; then
    ok "--device 2 (no daemon) fails naming gpu2.sock"
else
    bad "--device 2: exit $rc: $out"
fi
out=$("$convctl" --socket "$CONVD_SOCKET_DIR/gpu1.sock" --device 0 status --json)
expect "--socket wins over --device" "$(jfield max_inflight <<< "$out")" 7
out=$(CONVD_SOCKET=$CONVD_SOCKET_DIR/gpu1.sock "$convctl" --device 0 status --json 2> "$tmp/err")
if [[ $(jfield max_inflight <<< "$out") == 7 ]] && grep -q 'overridden by $CONVD_SOCKET' "$tmp/err"; then
    ok "\$CONVD_SOCKET wins over --device, with a note"
else
    bad "\$CONVD_SOCKET and --device: $out $(cat "$tmp/err")"
fi
# Without --device: the default socket of the directory, where no daemon listens here.
rc=0
out=$("$convctl" ping 2>&1) || rc=$?
if [[ $rc -eq 1 ]] && grep -q "$CONVD_SOCKET_DIR/convd.sock" <<< "$out"; then
    ok "no --device: convd.sock in \$CONVD_SOCKET_DIR"
else
    bad "no --device: exit $rc: $out"
fi
rc=0
out=$("$convctl" --device -1 ping 2>&1) || rc=$?
if [[ $rc -eq 2 ]] && grep -q -- "--device" <<< "$out"; then ok "--device -1 is bad usage"; else
    bad "--device -1: exit $rc: $out"; fi

# --- the metrics textfile -----------------------------------------------------------------------
if wait_for 30 test -s "$prom"; then ok "the textfile appears"; else bad "no textfile at $prom"; fi
# Valid exposition text, every sample labelled with its daemon's socket, HELP and TYPE for each.
if res=$(python3 - "$prom" "$CONVD_SOCKET_DIR/gpu0.sock" << 'EOF2'
import re, sys
path, sock = sys.argv[1], sys.argv[2]
text = open(path).read()
assert text.endswith("\n"), "no final newline"
types, samples = {}, 0
for line in text.splitlines():
    if line.startswith("# HELP "):
        continue
    if line.startswith("# TYPE "):
        _, _, name, kind = line.split(" ")
        assert kind in ("counter", "gauge", "histogram"), line
        types[name] = kind
        continue
    m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\} (-?[0-9.e+]+|\+Inf|NaN)$', line)
    assert m, "not a labelled sample: " + line
    name, labels = m.group(1), m.group(2)
    base = re.sub(r'_(bucket|sum|count)$', '', name)
    assert name in types or base in types, "no TYPE for " + name
    assert labels.startswith('socket="%s"' % sock), "no socket label: " + line
    samples += 1
for want in ("convd_info", "convd_clients", "convd_requests_total", "convd_queue_seconds",
             "convd_config_reloads_total"):
    assert want in types, "no " + want
# The CPU backend has no device gauges: absent, not zero.
assert "convd_device_memory_used_bytes" not in types, "device gauges on the CPU backend"
print("%d samples, %d families" % (samples, len(types)))
EOF2
); then ok "textfile: $res"; else bad "textfile is not valid exposition text: $res"; fi
# Rewritten: the uptime moves on.
u1=$(sample "$prom" "convd_uptime_seconds{socket=\"$CONVD_SOCKET_DIR/gpu0.sock\"}")
sleep 2.2
u2=$(sample "$prom" "convd_uptime_seconds{socket=\"$CONVD_SOCKET_DIR/gpu0.sock\"}")
if python3 -c "import sys; sys.exit(0 if float(sys.argv[2]) > float(sys.argv[1]) else 1)" \
    "${u1:-0}" "${u2:-0}"; then ok "textfile rewritten (uptime $u1 -> $u2)"; else
    bad "textfile not rewritten (uptime '$u1' then '$u2')"; fi
# Atomic: 3 s of reads across several rewrites never see a partial file.
if res=$(python3 - "$prom" << 'EOF2'
import sys, time
path = sys.argv[1]
reads = 0
end = time.time() + 3.0
while time.time() < end:
    try:
        text = open(path).read()
    except FileNotFoundError:
        raise SystemExit("the file vanished between rewrites")
    assert text.endswith("\n") and "convd_batch_size_count{" in text, "a partial file: %d bytes" % len(text)
    reads += 1
print("%d reads, all whole" % reads)
EOF2
); then ok "textfile: $res"; else bad "textfile atomicity: $res"; fi
ls "$tmp/prom" > "$tmp/ls"
expect "no temporary file left beside it" "$(grep -c tmp "$tmp/ls" || true)" 0

# --- SIGHUP ---------------------------------------------------------------------------------------
labels="socket=\"$CONVD_SOCKET_DIR/gpu0.sock\""
# wait_sample METRIC VALUE: until the textfile shows it (each look reads the file again).
sample_is() { [[ $(sample "$prom" "$1") == "$2" ]]; }
wait_sample() { wait_for 30 sample_is "$1" "$2"; }

# 1. Live keys: applied, and a new client sees the new limit. The command line still wins over
#    the file (threads and log_level were given there), as at start.
cat > "$conf" << EOF2
max_inflight = 12
queue_limit = 500
threads = 2
log_level = debug
metrics_textfile = $prom
metrics_textfile_interval_ms = 1000
EOF2
kill -HUP "$pid0"
if wait_for 30 grep -q "SIGHUP: configuration reloaded: max_inflight 100 -> 12, queue_limit 4096 -> 500$" "$tmp/gpu0.log"; then
    ok "SIGHUP applies live keys and names them in the log"
else
    bad "SIGHUP (live keys): $(grep SIGHUP "$tmp/gpu0.log" || true)"
fi
expect "a new client gets the new max_inflight" \
    "$("$convctl" --device 0 status --json | jfield max_inflight)" 12
if wait_sample "convd_config_reloads_total{$labels,result=\"applied\"}" 1 &&
    wait_sample "convd_config_last_reload_successful{$labels}" 1; then
    ok "reloads_total{applied} 1, last_reload_successful 1"
else bad "reload metrics after an applied reload: $(grep reload "$prom" || true)"; fi

# 2. A key that takes a restart: refused as a whole, with a sentence naming it.
cat > "$conf" << EOF2
max_inflight = 50
max_batch = 4
spin_us = 0
metrics_textfile = $prom
metrics_textfile_interval_ms = 1000
EOF2
kill -HUP "$pid0"
if wait_for 30 grep -q "SIGHUP: configuration not reloaded: max_batch (32 -> 4) and spin_us (50 -> 0) take a restart, so nothing was applied" "$tmp/gpu0.log"; then
    ok "SIGHUP refuses keys that take a restart, naming them"
else
    bad "SIGHUP (restart keys): $(grep SIGHUP "$tmp/gpu0.log" || true)"
fi
expect "nothing applied: max_inflight stays 12" \
    "$("$convctl" --device 0 status --json | jfield max_inflight)" 12
if wait_sample "convd_config_reloads_total{$labels,result=\"refused\"}" 1 &&
    wait_sample "convd_config_last_reload_successful{$labels}" 0; then
    ok "reloads_total{refused} 1, last_reload_successful 0"
else bad "reload metrics after a refused reload: $(grep reload "$prom" || true)"; fi
# 3. A broken file: refused, with the typo's hint.
printf 'max_inflght = 5\n' > "$conf"
kill -HUP "$pid0"
if wait_for 30 grep -q "configuration not reloaded (the running one stays): $conf:1: unknown key 'max_inflght'; did you mean 'max_inflight'?" "$tmp/gpu0.log"; then
    ok "SIGHUP refuses a broken file with a typo hint"
else
    bad "SIGHUP (broken file): $(grep SIGHUP "$tmp/gpu0.log" || true)"
fi
if wait_sample "convd_config_reloads_total{$labels,result=\"failed\"}" 1; then
    ok "reloads_total{failed} 1"
else bad "reload metrics after a failed reload: $(grep reload "$prom" || true)"; fi

# 4. The textfile moves with the configuration: the old file goes, the new one comes.
prom2=$tmp/prom/convd-gpu0-new.prom
cat > "$conf" << EOF2
max_inflight = 30
metrics_textfile = $prom2
metrics_textfile_interval_ms = 1000
EOF2
kill -HUP "$pid0"
if wait_for 30 test -s "$prom2" && wait_for 30 test ! -e "$prom"; then
    ok "a reload moves the textfile (old one removed)"
else
    bad "textfile after moving it: $(ls "$tmp/prom")"
fi
expect "max_inflight 30 after the fourth reload" \
    "$("$convctl" --device 0 status --json | jfield max_inflight)" 30

# --- the daemon's command line --------------------------------------------------------------------
rc=0
out=$("$convd" --max-inflght 3 --check-config 2>&1) || rc=$?
if [[ $rc -eq 2 ]] && grep -q "did you mean --max-inflight?" <<< "$out"; then
    ok "convd --max-inflght: a typo hint"
else
    bad "convd --max-inflght: exit $rc: $out"
fi
printf 'max_bach = 3\n' > "$tmp/typo.conf"
rc=0
out=$("$convd" --config "$tmp/typo.conf" --check-config 2>&1) || rc=$?
if [[ $rc -eq 2 ]] && grep -q "typo.conf:1: unknown key 'max_bach'; did you mean 'max_batch'?" <<< "$out"; then
    ok "a typo in the file: line and hint"
else
    bad "typo in the file: exit $rc: $out"
fi

# --- stop: both exit 0, the textfile goes with its daemon -----------------------------------------
for p in "$pid0" "$pid1"; do kill -TERM "$p"; done
for p in "$pid0" "$pid1"; do
    rc=0
    wait "$p" || rc=$?
    expect "daemon $p exits 0 on SIGTERM" "$rc" 0
done
pids=()
if [[ ! -e $prom2 ]]; then ok "the textfile is removed at exit"; else bad "$prom2 left behind"; fi

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
