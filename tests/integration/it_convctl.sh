#!/usr/bin/env bash
# convctl against a real daemon (CPU backend, temporary socket): status, ping, metrics, verify in
# every dtype and layout, conv on .npy files checked against an independent direct convolution
# written here in Python, a short bench, errors for bad input, and a clean SIGTERM exit.
#
#   it_convctl.sh CONVD CONVCTL [EXAMPLE]
#
# EXAMPLE: the README's minimal client program, run against the same daemon.
set -euo pipefail

convd=$1
convctl=$2
example=${3:-}
tmp=$(mktemp -d /tmp/convd-it-ctl.XXXXXX)
sock=$tmp/convd.sock
pid=""
passed=0
failed=0

cleanup() {
    if [[ -n $pid ]] && kill -0 "$pid" 2> /dev/null; then
        kill -KILL "$pid" 2> /dev/null || true
        wait "$pid" 2> /dev/null || true
    fi
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
# check NAME CMD...: the command succeeds.
check() {
    local name=$1
    shift
    local out
    if out=$("$@" 2>&1); then
        ok "$name"
    else
        bad "$name (exit $?)"
        printf '%s\n' "$out" | sed 's/^/       /'
    fi
}
# check_fails NAME WORD CMD...: the command fails with exit status 1 or 2 and says WORD.
check_fails() {
    local name=$1 word=$2
    shift 2
    local out rc=0
    out=$("$@" 2>&1) || rc=$?
    if [[ $rc -ne 0 && $rc -le 2 ]] && grep -qi -- "$word" <<< "$out"; then
        ok "$name"
    else
        bad "$name (exit $rc, want a failure naming '$word')"
        printf '%s\n' "$out" | sed 's/^/       /'
    fi
}

ctl() { "$convctl" --socket "$sock" --timeout 120000 "$@"; }

"$convd" --backend cpu --threads 2 --socket "$sock" --log-level notice &
pid=$!
for _ in $(seq 1 1200); do
    kill -0 "$pid" || { echo "convd exited during start-up"; exit 1; }
    ctl ping > /dev/null 2>&1 && break
    sleep 0.1
done

check "ping" ctl ping
out=$(ctl status)
if grep -q "cpu" <<< "$out" && grep -qi "backend" <<< "$out"; then ok "status names the cpu backend"; else
    bad "status: $out"; fi
# --json: status, verify and bench print one JSON object per line, with the same names for the
# same things (backend, device, the problem's fields).
if command -v python3 > /dev/null; then
    rc=0
    out=$(ctl status --json) || rc=$?
    if [[ $rc -eq 0 ]] && res=$(python3 -c '
import json, sys
lines = sys.argv[1].splitlines()
assert len(lines) == 1, "%d lines on stdout, want 1" % len(lines)
d = json.loads(lines[0])
want = {"socket": str, "client_version": str, "server_version": str, "protocol_version": int,
        "backend": str, "device": str, "clients": int, "queue_depth": int, "inflight": int,
        "requests_served": int, "requests_failed": int, "batches": int, "uptime_ms": int,
        "max_inflight": int, "max_regions": int, "max_mapped_bytes": int, "max_batch": int}
for key, kind in want.items():
    assert isinstance(d.get(key), kind), "%s: %r" % (key, d.get(key))
assert set(d) == set(want), "unexpected fields %s" % (set(d) - set(want))
assert d["socket"] == sys.argv[2], d["socket"]
assert d["backend"] == "cpu" and d["clients"] >= 1 and d["protocol_version"] == 3, d
assert d["max_inflight"] == 256 and d["max_batch"] == 32, d
print("%d fields, %s backend, %d clients" % (len(d), d["backend"], d["clients"]))
' "$out" "$sock" 2>&1); then
        ok "status --json: $res"
    else
        bad "status --json (exit $rc): ${res:-} $out"
    fi
    rc=0
    vout=$(ctl verify --json --dtype bf16 --layout nhwc --bias --repeat 3 --seed 7) || rc=$?
    bout=$(ctl bench --json --dtype bf16 --layout nhwc --bias --clients 1 --requests 10) || rc=$?
    if [[ $rc -eq 0 ]] && res=$(python3 -c '
import json, sys
v = [json.loads(l) for l in sys.argv[1].splitlines()]
b = [json.loads(l) for l in sys.argv[2].splitlines()]
assert len(v) == 1 and len(b) == 1, "%d and %d objects" % (len(v), len(b))
v, b = v[0], b[0]
assert v["result"] == "PASS" and v["runs"] == 3 and v["repeat"] == 3 and v["seed"] == 7, v
assert v["error"] is None and v["rel_error"] <= v["tolerance"] == 0.01, v
for key in ("rtt_us", "rtt_min_us", "queue_us", "exec_us", "reference_us", "max_abs_error"):
    assert isinstance(v[key], (int, float)) and v[key] >= 0, key
# What both describe is named and valued alike.
shared = ("name", "n", "h", "w", "c", "k", "r", "s", "groups", "stride_h", "stride_w", "pad_top",
          "pad_bottom", "pad_left", "pad_right", "dil_h", "dil_w", "dtype", "layout", "bias",
          "relu", "input_bytes", "weight_bytes", "bias_bytes", "output_bytes", "flops",
          "backend", "device")
for key in shared:
    assert v[key] == b[key], "%s: verify %r, bench %r" % (key, v[key], b[key])
assert v["dtype"] == "bf16" and v["layout"] == "nhwc" and v["bias"] is True, v
print("verify PASS (error %.3g), %d fields shared with bench" % (v["rel_error"], len(shared)))
' "$vout" "$bout" 2>&1); then
        ok "verify --json and bench --json: $res"
    else
        bad "verify/bench --json (exit $rc): ${res:-}"
        printf '%s\n' "$vout" "$bout" | sed 's/^/       /'
    fi
else
    echo "skip   status/verify --json (no python3)"
fi
check_fails "a typo of a command gets a hint" "did you mean 'status'?" "$convctl" --socket "$sock" stauts
check_fails "a typo of an option gets a hint" "did you mean '--json'?" ctl status --jsn
check_fails "a typo of a global option gets a hint" "did you mean '--timeout'?" \
    "$convctl" --timout 5 ping
check_fails "an option without its value" "needs a value" ctl verify --csv
out=$(ctl metrics)
if grep -q "^convd_regions " <<< "$out" && grep -q "^# TYPE" <<< "$out"; then ok "metrics"; else
    bad "metrics: $out"; fi

check "verify default" ctl verify
check "verify fp16 nhwc bias relu x3" ctl verify --dtype fp16 --layout nhwc --bias --relu --repeat 3
check "verify bf16 nchw grouped strided" ctl verify --dtype bf16 --n 2 --c 12 --k 18 --groups 3 \
    --h 9 --w 11 --r 3 --s 2 --stride 2,1 --pad 1,0,2,1 --dilation 1,2
check "verify fp32 depthwise" ctl verify --c 16 --k 16 --groups 16 --h 20 --w 20 --r 5 --s 5 --pad 2
check_fails "verify refuses a bad problem" "group" ctl verify --c 6 --k 8 --groups 4

# conv on .npy files, checked against a direct convolution in plain Python.
if command -v python3 > /dev/null; then
    py=$tmp/npy.py
    cat > "$py" << 'EOF'
import random, struct, sys

def save(path, shape, vals, code):
    fmt = {"f4": "<f", "f2": "<e"}[code]
    hdr = "{'descr': '<%s', 'fortran_order': False, 'shape': (%s), }" % (
        code, "".join("%d, " % d for d in shape) if len(shape) == 1 else ", ".join(map(str, shape)))
    pad = 64 - (10 + len(hdr) + 1) % 64
    hdr = hdr + " " * pad + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode())
        f.write(b"".join(struct.pack(fmt, v) for v in vals))

def load(path):
    b = open(path, "rb").read()
    assert b[:6] == b"\x93NUMPY", "not a .npy file"
    hl = struct.unpack("<H", b[8:10])[0]
    hdr = eval(b[10:10 + hl].decode())
    code = hdr["descr"].lstrip("<")
    n = 1
    for d in hdr["shape"]:
        n *= d
    fmt = {"f4": "<f", "f2": "<e"}[code]
    sz = struct.calcsize(fmt)
    data = b[10 + hl:]
    assert len(data) == n * sz, "data size"
    return hdr["shape"], [struct.unpack_from(fmt, data, i * sz)[0] for i in range(n)]

def rnd(n, rng, code):
    fmt = {"f4": "<f", "f2": "<e"}[code]
    # round through the file format so the reference sees what convd sees
    return [struct.unpack(fmt, struct.pack(fmt, rng.uniform(-1, 1)))[0] for _ in range(n)]

cmd = sys.argv[1]
if cmd == "make":
    d, code, layout = sys.argv[2], sys.argv[3], sys.argv[4]
    rng = random.Random(int(sys.argv[5]))
    N, C, H, W, K, G, R, S = 2, 6, 7, 9, 4, 2, 3, 2
    xs = (N, C, H, W) if layout == "nchw" else (N, H, W, C)
    ws = (K, C // G, R, S) if layout == "nchw" else (K, R, S, C // G)
    save(d + "/x.npy", xs, rnd(N * C * H * W, rng, code), code)
    save(d + "/w.npy", ws, rnd(K * C // G * R * S, rng, code), code)
    save(d + "/b.npy", (K,), rnd(K, rng, code), code)
elif cmd == "check":
    d, layout, tol = sys.argv[2], sys.argv[3], float(sys.argv[4])
    sh, st, pt, pb, pl, pr, relu = 2, 1, 1, 0, 2, 1, True
    xs, x = load(d + "/x.npy")
    wsh, w = load(d + "/w.npy")
    _, b = load(d + "/b.npy")
    ys, y = load(d + "/y.npy")
    if layout == "nchw":
        N, C, H, W = xs
        K, cpg, R, S = wsh
    else:
        N, H, W, C = xs
        K, R, S, cpg = wsh
    G = C // cpg
    kpg = K // G
    OH = (H + pt + pb - R) // sh + 1
    OW = (W + pl + pr - S) // st + 1
    want = (N, K, OH, OW) if layout == "nchw" else (N, OH, OW, K)
    assert tuple(ys) == want, "output shape %s, want %s" % (ys, want)
    num = den = 0.0
    for n in range(N):
        for k in range(K):
            g = k // kpg
            for oh in range(OH):
                for ow in range(OW):
                    acc = b[k]
                    for c in range(cpg):
                        for r in range(R):
                            for s in range(S):
                                ih, iw = oh * sh - pt + r, ow * st - pl + s
                                if 0 <= ih < H and 0 <= iw < W:
                                    ci = g * cpg + c
                                    if layout == "nchw":
                                        xi = ((n * C + ci) * H + ih) * W + iw
                                        wi = ((k * cpg + c) * R + r) * S + s
                                    else:
                                        xi = ((n * H + ih) * W + iw) * C + ci
                                        wi = ((k * R + r) * S + s) * cpg + c
                                    acc += x[xi] * w[wi]
                    if relu:
                        acc = max(acc, 0.0)
                    if layout == "nchw":
                        yi = ((n * K + k) * OH + oh) * OW + ow
                    else:
                        yi = ((n * OH + oh) * OW + ow) * K + k
                    num += (y[yi] - acc) ** 2
                    den += acc * acc
    err = (num ** 0.5) / max(den ** 0.5, 1e-30)
    print("relative error %.3g (tolerance %g)" % (err, tol))
    sys.exit(0 if err <= tol else 1)
EOF
    for combo in "f4 nchw 1e-5" "f4 nhwc 1e-5" "f2 nchw 1e-2" "f2 nhwc 1e-2"; do
        read -r code layout tol <<< "$combo"
        seed=$RANDOM
        python3 "$py" make "$tmp" "$code" "$layout" "$seed"
        if out=$(ctl conv --input "$tmp/x.npy" --weight "$tmp/w.npy" --bias "$tmp/b.npy" \
            --output "$tmp/y.npy" --stride 2,1 --pad 1,0,2,1 --groups 2 --layout "$layout" \
            --relu 2>&1) && res=$(python3 "$py" check "$tmp" "$layout" "$tol" 2>&1); then
            ok "conv .npy $code $layout: $res"
        else
            bad "conv .npy $code $layout (seed $seed): $out ${res:-}"
        fi
        rm -f "$tmp/y.npy"
    done
    check_fails "conv refuses a 1-D weight array" "weight" \
        ctl conv --input "$tmp/x.npy" --weight "$tmp/b.npy" --output "$tmp/y.npy"
    check_fails "conv refuses weights whose channels do not fit the groups" "group" \
        ctl conv --input "$tmp/x.npy" --weight "$tmp/w.npy" --groups 3 --output "$tmp/y.npy"
    check_fails "conv names a missing file" "nothere" \
        ctl conv --input "$tmp/nothere.npy" --weight "$tmp/w.npy" --output "$tmp/y.npy"
else
    echo "skip   conv .npy (no python3)"
fi

if [[ -n $example ]]; then
    # 8x8 ones, 3x3 weights of 0.5 over 2 channels per group, padding 1: 9 inside, 4 at corners.
    out=$(CONVD_SOCKET=$sock "$example" 2>&1) || true
    if grep -q "y\[0\]\[0\]\[0\]\[0\] = 4, y\[0\]\[0\]\[4\]\[4\] = 9" <<< "$out"; then
        ok "README example: $out"
    else
        bad "README example: $out"
    fi
fi

check "bench 200 requests" ctl bench --clients 2 --depth 4 --requests 200 --n 1 --c 16 --k 16 \
    --groups 4 --h 14 --w 14
# The report names the daemon's CPU time per request (process_cpu_seconds_total over its counters).
out=$(ctl bench --clients 2 --depth 2 --requests 100 --n 1 --c 16 --k 16 --groups 4 --h 14 \
    --w 14 2>&1) || true
if grep -Eq "^  daemon cpu  [0-9.]+ us per request \(user\+sys, all threads; [0-9]+ requests\)" \
    <<< "$out"; then
    ok "bench reports the daemon's CPU time per request"
else
    bad "bench without a daemon cpu line:"
    printf '%s\n' "$out" | sed 's/^/       /'
fi
# bench_json LABEL CHECK ARGS...: runs convctl bench ARGS --json and CHECK, Python code that gets
# the JSON object as d, asserts on it and prints a line for the ok message.
bench_json() {
    local label=$1 check=$2 rc=0 out res
    shift 2
    if ! command -v python3 > /dev/null; then
        echo "skip   $label (no python3)"
        return
    fi
    out=$(ctl bench "$@" --json 2> "$tmp/bench.err") || rc=$?
    if [[ $rc -eq 0 ]] && res=$(python3 -c '
import json, sys
lines = sys.argv[1].splitlines()
assert len(lines) == 1, "%d lines on stdout, want 1" % len(lines)
d = json.loads(lines[0])
exec(sys.argv[2])
' "$out" "$check" 2>&1); then
        ok "$label: $res"
    else
        bad "$label (exit $rc): ${res:-}"
        printf '%s\n' "$out" "$(cat "$tmp/bench.err")" | sed 's/^/       /'
    fi
}
# --json: one valid JSON object on stdout, with the fields the serving benchmark reads.
bench_json "bench --json" '
for key in ("name", "n", "c", "k", "groups", "dtype", "layout", "clients", "depth", "memory",
            "completed", "failed", "seconds", "req_per_s", "images_per_s", "p50_us", "p99_us",
            "p999_us", "mean_batch", "queue_us", "exec_us", "daemon_cpu_us_per_req", "loop_busy",
            "loop_cpu", "loop_launch"):
    assert key in d, "no field " + key
assert d["completed"] == 100 and d["failed"] == 0, "completed %s failed %s" % (d["completed"], d["failed"])
assert d["memory"] == "host" and d["clients"] == 2 and d["depth"] == 2, "options not echoed"
assert d["daemon_cpu_us_per_req"] is not None and d["daemon_cpu_us_per_req"] > 0, "no CPU time"
assert d["loop_busy"] is not None and 0 < d["loop_busy"] <= 1.05, "loop busy %r" % d["loop_busy"]
print("%d requests, %.0f req/s, daemon cpu %.1f us per request" % (d["completed"], d["req_per_s"],
      d["daemon_cpu_us_per_req"]))
' --clients 2 --depth 2 --requests 100 --n 1 --c 16 --k 16 --groups 4 --h 14 --w 14
# --gated: chains of stream-ordered requests; the daemon polls their ready words (its gates step)
# and every request completes; --distinct 3: three activations in turn, each a problem of its own.
bench_json "bench --gated" '
assert d["gated"] is True and d["distinct"] == 3, "gated or distinct not echoed"
assert d["completed"] == 200 and d["failed"] == 0, "completed %s failed %s" % (d["completed"], d["failed"])
assert d["loop_gates"] is not None and d["loop_gates"] > 0, "the daemon polled no ready words: %r" % d["loop_gates"]
print("%d requests, %.0f req/s, p50 %.1f us from the ready word" % (d["completed"], d["req_per_s"], d["p50_us"]))
' --gated --distinct 3 --clients 2 --depth 4 --requests 200 --n 1 --c 16 --k 16 --groups 4 \
    --h 14 --w 14
# --gap-us: the client waits that long after each completion before the next ready word, so one
# client's chain of 50 cannot go faster than one request per gap.
bench_json "bench --gated --gap-us" '
assert d["gap_us"] == 200, "gap not echoed: %r" % d.get("gap_us")
assert d["completed"] == 50 and d["failed"] == 0, "completed %s failed %s" % (d["completed"], d["failed"])
assert d["req_per_s"] <= 1e6 / 200 * 50 / 49, "%.0f req/s: faster than one per 200 us gap" % d["req_per_s"]
print("%.0f req/s with a 200 us gap" % d["req_per_s"])
' --gated --gap-us 200 --clients 1 --depth 2 --requests 50 --n 1 --c 16 --k 16 --groups 4 \
    --h 14 --w 14
check_fails "--gap-us needs --gated" "needs --gated" ctl bench --gap-us 10
# --memory gpu on the CPU backend: exit status 1 and a sentence naming what is missing.
rc=0
out=$(ctl bench --memory gpu --clients 1 --requests 4 2>&1) || rc=$?
if [[ $rc -eq 1 ]] && grep -Eqi "backend|CUDA runtime" <<< "$out"; then
    ok "bench --memory gpu on the cpu backend fails: $out"
else
    bad "bench --memory gpu on the cpu backend (exit $rc, want 1 and a sentence)"
    printf '%s\n' "$out" | sed 's/^/       /'
fi
check_fails "--device takes a GPU ordinal" "--device" ctl --device gpu1 ping
check_fails "bench --memory names its choices" "host or gpu" ctl bench --memory disk
check_fails "no daemon at a path" "connect" "$convctl" --socket "$tmp/none.sock" ping
check_fails "unknown command" "unknown" "$convctl" --socket "$sock" frobnicate

kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
pid=""
if [[ $rc -eq 0 ]]; then ok "convd exits 0 on SIGTERM"; else bad "convd exited $rc on SIGTERM"; fi

# The null backend, with and without the launch thread (launch_threads = 1, the default on 8 or
# more CPUs: the backend's launch calls on a thread beside the loop), with fewer slots and with
# batches formed only when the launch thread has room (launch_ahead): every request of a bench completes,
# none fails, the loop's accounting is reported, and the daemon exits 0 on SIGTERM (the thread
# stops).
nsock=$tmp/null.sock
# null_start LOG ARGS...: a null-backend daemon on $nsock, its log in LOG, answering pings.
null_start() {
    local log=$1
    shift
    "$convd" --backend null --socket "$nsock" --log-level notice --spin-us 20 "$@" 2> "$log" &
    pid=$!
    for _ in $(seq 1 600); do
        "$convctl" --socket "$nsock" ping > /dev/null 2>&1 && break
        sleep 0.1
    done
}
# metric NAME: the whole-number value of the unlabelled metric NAME in the metrics text on stdin.
metric() {
    sed -n "s/^$1 \\([0-9][0-9]*\\).*/\\1/p"
}
# launch_peak: the daemon's convd_launch_concurrency_peak (most launch calls at once).
launch_peak() {
    "$convctl" --socket "$nsock" metrics 2> /dev/null | metric convd_launch_concurrency_peak
}
# null_stop WHAT: SIGTERM to it, which must exit 0.
null_stop() {
    kill -TERM "$pid"
    local rc=0
    wait "$pid" || rc=$?
    pid=""
    if [[ $rc -eq 0 ]]; then ok "$1: exits 0 on SIGTERM"; else bad "$1: exited $rc on SIGTERM"; fi
    rm -f "$nsock"
}
for args in "--slots 2 --launch-threads 0" "--launch-threads 1" "--launch-threads 1 --slots 1" \
    "--launch-threads 1 --launch-ahead 1" "--launch-threads 2" \
    "--launch-threads 1 --doorbell-threads 2 --doorbell-spin-us 50"; do
    # shellcheck disable=SC2086
    null_start "$tmp/null.log" $args
    rc=0
    out=$("$convctl" --socket "$nsock" --timeout 60000 bench --clients 3 --depth 4 \
        --requests 6000 2>&1) || rc=$?
    if [[ $rc -eq 0 ]] && grep -q "6000 completed, 0 failed" <<< "$out" &&
        grep -q "loop  *busy" <<< "$out"; then
        ok "null backend ($args): 6000 requests completed"
    else
        bad "null backend ($args): bench exit $rc"
        printf '%s\n' "$out" | sed 's/^/       /'
    fi
    if [[ $args == *launch-threads\ 1* ]] && ! grep -q "launched on a thread of their own" "$tmp/null.log"; then
        bad "null backend ($args): the daemon did not say it started the launch thread"
        sed 's/^/       /' "$tmp/null.log"
    fi
    # No more launch calls at once than there are launching threads (the loop counts as one).
    threads=$(sed -n 's/.*--launch-threads \([0-9]\).*/\1/p' <<< "$args")
    peak=$(launch_peak)
    if [[ -z $peak || $peak -lt 1 || $peak -gt $((threads > 1 ? threads : 1)) ]]; then
        bad "null backend ($args): up to '${peak}' launch calls at once"
    fi
    null_stop "null backend ($args)"
done

# launch_ahead against the null backend's model of a launch-bound device (each launch call
# busy for 2 ms): with one batch at a time before the launch thread, what queues during a launch
# goes in the next one together, so batches of more than four requests must appear (spread over
# free slots they stay at four or fewer here); every request still completes.
# model_bench: 600 requests from 3 clients x 4 on the daemon of $nsock; sets out and rc.
model_bench() {
    rc=0
    out=$("$convctl" --socket "$nsock" --timeout 60000 bench --clients 3 --depth 4 --requests 600 \
        2>&1) || rc=$?
}
# log_says LOG TEXT WHAT: fails WHAT, with the log, unless LOG has TEXT.
log_says() {
    if ! grep -q "$2" "$1"; then
        bad "$3"
        sed 's/^/       /' "$1"
    fi
}
null_start "$tmp/paced.log" --launch-threads 1 --launch-ahead 1 --null-launch-us 2000
model_bench
sizes=$(sed -n 's/.*batch sizes \(.*\) (mean.*/\1/p' <<< "$out")
largest=$(tr ',' '\n' <<< "$sizes" | sed -n 's/^ *\([0-9][0-9]*\):.*/\1/p' | sort -n | tail -1)
if [[ $rc -eq 0 ]] && grep -q "600 completed, 0 failed" <<< "$out" && [[ ${largest:-0} -gt 4 ]]; then
    ok "launch_ahead 1 with 2 ms launches: 600 requests in batches of up to $largest"
else
    bad "launch_ahead 1 with 2 ms launches: bench exit $rc, batch sizes '${sizes}'"
    printf '%s\n' "$out" | sed 's/^/       /'
fi
log_says "$tmp/paced.log" "a model, launches 2000 us" \
    "the null backend's model is not named in the daemon's log"
null_stop "paced null backend"

# Several launch threads (launch_threads 3) on the same model: each takes a different slot's
# batch, so launch calls are in progress at the same time (the daemon counts them). Not judged
# by time: the threads' launch time adding up to more than the wall time held on a quiet
# machine (131-161%) but fell to 55% with five busy processes on its two CPUs.
null_start "$tmp/threads.log" --launch-threads 3 --null-launch-us 2000
model_bench
share=$(sed -n 's/.*; launching \([0-9][0-9]*\)%.*/\1/p' <<< "$out")
peak=$(launch_peak)
if [[ $rc -eq 0 ]] && grep -q "600 completed, 0 failed" <<< "$out" && [[ ${peak:-0} -ge 2 &&
    ${peak:-0} -le 3 ]]; then
    ok "launch_threads 3 with 2 ms launches: 600 requests, up to $peak launches at once" \
        "(launching ${share}% of the wall time)"
else
    bad "launch_threads 3 with 2 ms launches: bench exit $rc, up to '${peak}' launches at once"
    printf '%s\n' "$out" | sed 's/^/       /'
fi
log_says "$tmp/threads.log" "launched on 3 threads of their own" \
    "the daemon did not say it started 3 launch threads"
if grep -q "per batch on the device" <<< "$out"; then
    bad "without batch_timing, bench reported a device time"
    printf '%s\n' "$out" | sed 's/^/       /'
fi
null_stop "null backend with 3 launch threads"

# launch_inline (on by default): with launch threads, the loop launches a batch itself when no
# other batch is in flight. One client with one request at a time is always alone, so the loop
# launches every batch (the bench's own first request among them); with launch_inline 0 the
# threads launch them all.
for inl in 1 0; do
    null_start "$tmp/inline.log" --launch-threads 2 --launch-inline "$inl"
    rc=0
    out=$("$convctl" --socket "$nsock" --timeout 60000 bench --clients 1 --depth 1 --requests 300 \
        2>&1) || rc=$?
    metrics=$("$convctl" --socket "$nsock" metrics 2>&1) || true
    inline=$(metric convd_launches_inline_total <<< "$metrics")
    batches=$(metric convd_batches_total <<< "$metrics")
    want=$((inl == 1 ? ${batches:-0} : 0))
    if [[ $rc -eq 0 ]] && grep -q "300 completed, 0 failed" <<< "$out" && [[ ${batches:-0} -ge 300 &&
        $inline == "$want" ]]; then
        ok "launch_inline $inl: 300 lone requests, $inline of their batches launched by the loop"
    else
        bad "launch_inline $inl: bench exit $rc, ${inline:-?} of ${batches:-?} batches launched" \
            "by the loop, want $want"
        printf '%s\n' "$out" | sed 's/^/       /'
    fi
    null_stop "null backend with launch_inline $inl"
done

# batch_timing: the null backend reports its model's batch time (300 us) as each batch's device
# time; the daemon's convd_device_seconds holds every batch, and bench reports their mean.
null_start "$tmp/timing.log" --null-exec-us 300 --batch-timing 1
model_bench
metrics=$("$convctl" --socket "$nsock" metrics 2>&1) || true
count=$(metric convd_device_seconds_count <<< "$metrics")
batches=$(metric convd_batches_total <<< "$metrics")
if [[ $rc -eq 0 ]] && grep -q "device  *300.0 us per batch on the device" <<< "$out" &&
    [[ -n $count && $count -gt 0 && $count == "$batches" ]]; then
    ok "batch_timing: 300 us per batch on the device, $count batches timed"
else
    bad "batch_timing: bench exit $rc, $count batches timed of '${batches}'"
    printf '%s\n' "$out" | sed 's/^/       /'
    grep "^convd_device_seconds\|^convd_batches" <<< "$metrics" | sed 's/^/       /'
fi
null_stop "null backend with batch_timing"

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
