#!/usr/bin/env bash
# convd in one command: builds convd and convctl into build/, starts the daemon on its default
# backend (the GPU when there is one, else the CPU) on a temporary socket, checks real layer
# shapes from bench/shapes.csv at batch 1 against the CPU reference in every dtype and both
# layouts (`convctl verify`), runs a short load benchmark (`convctl bench`), prints the daemon's
# status and stops it with SIGTERM. Exits non-zero on any failure.
#
#   scripts/demo.sh                   build/ (configured with the defaults if new)
#   BUILD_DIR=build-int scripts/demo.sh   another, already configured, build folder
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/deps.sh
source "$root/scripts/deps.sh"
deps_ensure
build=${BUILD_DIR:-$root/build}
csv=$root/bench/shapes.csv

step() { printf '\n== %s\n' "$*"; }
die() {
    echo "demo: $*" >&2
    exit 1
}

step "building convd and convctl in ${build}"
if [[ ! -f $build/CMakeCache.txt ]]; then
    if command -v ninja > /dev/null; then gen=(-G Ninja); else gen=(-G "Unix Makefiles"); fi
    cmake -S "$root" -B "$build" "${gen[@]}" "$(deps_cuda_arch_arg "$build")" \
        > "$build.configure.log" 2>&1 ||
        { cat "$build.configure.log"; die "cmake configure failed"; }
    rm -f "$build.configure.log"
fi
cmake --build "$build" --target convd convctl --parallel "$(nproc 2> /dev/null || echo 2)"
convd=$build/bin/convd
convctl=$build/bin/convctl
[[ -x $convd && -x $convctl ]] || die "the build did not produce $convd and $convctl"

tmp=$(mktemp -d /tmp/convd-demo.XXXXXX)
sock=$tmp/convd.sock
log=$tmp/convd.log
pid=""
cleanup() {
    if [[ -n $pid ]] && kill -0 "$pid" 2> /dev/null; then
        kill -TERM "$pid" 2> /dev/null || true
        wait "$pid" 2> /dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT

step "starting convd on ${sock}"
"$convd" --socket "$sock" > "$log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
    if ! kill -0 "$pid" 2> /dev/null; then
        cat "$log" >&2
        die "convd exited during start-up"
    fi
    if "$convctl" --socket "$sock" ping > /dev/null 2>&1; then
        break
    fi
    sleep 0.1
done
"$convctl" --socket "$sock" ping > /dev/null || { cat "$log" >&2; die "convd does not answer"; }
sed 's/^<[0-9]>/  /' "$log"

step "convctl verify: layers of bench/shapes.csv at batch 1, daemon against the CPU reference"
# shape, dtype, layout, extra options
runs=(
    "resnext50_l1 fp32 nhwc"
    "resnext50_l1 fp16 nchw"
    "regnety16_l2 fp16 nhwc --bias --relu"
    "regnety16_l2 fp32 nchw"
    "mbv2_dw_s1 fp16 nhwc --bias --act relu6"
    "mbv2_dw_s1 fp32 nchw --bias"
    "convnext_dw7 fp32 nhwc"
    "convnext_dw7 bf16 nchw --act gelu"
    "shufflenet_1x1_g3 fp16 nhwc --bias --act silu"
    "dense_resnet50_l1 fp32 nhwc"
)
failed=0
for run in "${runs[@]}"; do
    read -r shape dtype layout extra <<< "$run"
    # shellcheck disable=SC2086 # extra holds separate options
    if out=$("$convctl" --socket "$sock" --timeout 60000 verify --shape "$shape" --csv "$csv" \
        --n 1 --dtype "$dtype" --layout "$layout" $extra 2>&1); then
        status=PASS
    else
        status=FAIL
        failed=$((failed + 1))
    fi
    result=$(grep -E '^result' <<< "$out" | sed 's/^result *//') || true
    timing=$(grep -E '^timing' <<< "$out" | sed 's/^timing *//') || true
    printf '%-18s %-4s %-4s %-20s %s\n' "$shape" "$dtype" "$layout" "${extra:-}" "$status"
    if [[ $status == PASS && -n $result ]]; then
        printf '    %s\n    %s\n' "$result" "$timing"
    else
        while IFS= read -r line; do printf '    %s\n' "$line"; done <<< "$out"
    fi
done
[[ $failed -eq 0 ]] || die "$failed of ${#runs[@]} verify runs failed"
echo "all ${#runs[@]} matched the reference"

step "convctl bench: 4 clients x 2 requests in flight for 3 s, latency_b1_resnext"
"$convctl" --socket "$sock" --timeout 60000 bench --shape latency_b1_resnext --csv "$csv" \
    --clients 4 --depth 2 --duration 3

step "convctl status"
"$convctl" --socket "$sock" status

step "stopping convd (SIGTERM)"
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
pid=""
sed -n '/SIGTERM/,$p' "$log" | sed 's/^<[0-9]>/  /'
[[ $rc -eq 0 ]] || die "convd exited with status $rc"
echo
echo "demo: OK"
