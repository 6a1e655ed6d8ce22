#!/usr/bin/env bash
# Builds the README's example (client/examples/minimal.c) against an installed convd the two ways
# a user would, and runs each build against a CPU daemon of that installation:
#   1. CMake: find_package(convd) in tests/consumer/ (convd::client, convd::client_static), with a
#      version check that must refuse the next major version;
#   2. pkg-config: cc minimal.c $(pkg-config --cflags --libs convd), with the run path the docs
#      give for a prefix the dynamic loader does not search.
# Each program must load libconvd-client.so.0 from the installation under test (not from another
# one the loader would find first, such as an old /usr/local), and print the example's result.
#
#   tests/consumer/run.sh PREFIX [DESTDIR]
# PREFIX is the install prefix (/usr for the Debian packages); DESTDIR, when given, is where a
# `DESTDIR=... cmake --install` put it (the files are then under DESTDIR/PREFIX). Exits 0 when
# every build runs and prints the right numbers, 1 otherwise.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
prefix=${1:?usage: run.sh PREFIX [DESTDIR]}
destdir=${2:-}
top=$destdir$prefix
example=$root/client/examples/minimal.c
expect='y[0][0][0][0] = 4, y[0][0][4][4] = 9'

die() {
    echo "consumer: $*" >&2
    exit 1
}
step() { printf '\n== consumer: %s\n' "$*"; }

# The library directory is where convd.pc is (lib, lib64 or lib/<multiarch>).
pc=$(find "$top/lib" "$top/lib64" -path '*/pkgconfig/convd.pc' 2> /dev/null | head -1 || true)
[[ -n $pc ]] || die "no convd.pc under $top/lib*: is convd installed at $top?"
libdir=$(dirname "$(dirname "$pc")")
libdir=$(cd "$libdir" && pwd -P)
[[ -x $top/bin/convd && -x $top/bin/convctl ]] || die "no convd and convctl in $top/bin"

tmp=$(mktemp -d /tmp/convd-consumer.XXXXXX)
pid=""
cleanup() {
    if [[ -n $pid ]] && kill -0 "$pid" 2> /dev/null; then
        kill -TERM "$pid" 2> /dev/null || true
        wait "$pid" 2> /dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT

# Where the dynamic loader takes libconvd-client.so.0 from for a program: it must be the file of
# the installation under test.
check_loads_ours() {
    local prog=$1 got
    got=$(ldd "$prog" | awk '$1 == "libconvd-client.so.0" { print $3 }')
    [[ -n $got ]] || die "$prog does not load libconvd-client.so.0 (ldd: $(ldd "$prog" | tr '\n' ' '))"
    got=$(cd "$(dirname "$got")" && pwd -P)/$(basename "$got")
    [[ $got == "$libdir/libconvd-client.so.0" ]] ||
        die "$prog loads $got, not the installed $libdir/libconvd-client.so.0 (another" \
            "installation comes first in the loader's path: remove it and run ldconfig)"
    echo "$prog: libconvd-client.so.0 => $got"
}

step "CMake package (convd_DIR=$libdir/cmake/convd)"
cmake -S "$root/tests/consumer" -B "$tmp/cmake" -Dconvd_DIR="$libdir/cmake/convd" \
    -DCONVD_EXAMPLE="$example" > "$tmp/cmake.log" 2>&1 || {
    cat "$tmp/cmake.log"
    die "find_package(convd) failed"
}
grep 'convd .* from' "$tmp/cmake.log"
cmake --build "$tmp/cmake" > "$tmp/build.log" 2>&1 || {
    cat "$tmp/build.log"
    die "the CMake consumer did not build"
}
while IFS='=' read -r target file; do
    case $file in
    "$libdir"/*) echo "convd::$target is $file" ;;
    *) die "convd::$target is $file, not under $libdir" ;;
    esac
done < "$tmp/cmake/linked-libraries.txt"
[[ -x $tmp/cmake/minimal-static ]] || die "convd::client_static was not found (pkg-config libprotobuf-c?)"
check_loads_ours "$tmp/cmake/minimal"
if ldd "$tmp/cmake/minimal-static" | grep -q libconvd-client; then
    die "minimal-static loads libconvd-client.so: it should carry the static library"
fi

major=$(sed -n 's/^Version: \([0-9]*\)\..*/\1/p' "$pc")
step "find_package(convd $((major + 1)).0) must fail (this is convd $major.x)"
if cmake -S "$root/tests/consumer" -B "$tmp/cmake-next" -Dconvd_DIR="$libdir/cmake/convd" \
    -DCONVD_WANT_VERSION=$((major + 1)).0 > "$tmp/next.log" 2>&1; then
    die "find_package(convd $((major + 1)).0) accepted convd $major.x"
fi
grep -m1 -i 'version' "$tmp/next.log" || true

step "pkg-config (PKG_CONFIG_PATH=$libdir/pkgconfig)"
export PKG_CONFIG_PATH=$libdir/pkgconfig
pc_libdir=$(pkg-config --variable=libdir convd)
[[ $(cd "$pc_libdir" && pwd -P) == "$libdir" ]] || die "pkg-config's libdir is $pc_libdir, not $libdir"
rpath=()
# The loader's own directories need no run path (and Debian forbids one there).
case $libdir in
/lib | /usr/lib | /lib/*-linux-gnu | /usr/lib/*-linux-gnu | /lib64 | /usr/lib64) ;;
*) rpath=("-Wl,-rpath,$pc_libdir") ;;
esac
echo "cc minimal.c \$(pkg-config --cflags --libs convd) ${rpath[*]}"
# shellcheck disable=SC2046 # pkg-config's words are separate arguments
cc -std=c11 -Wall -Wextra -Werror "$example" $(pkg-config --cflags --libs convd) "${rpath[@]}" \
    -o "$tmp/minimal-pc" || die "the pkg-config consumer did not build"
check_loads_ours "$tmp/minimal-pc"

step "a CPU daemon of this installation ($top/bin/convd)"
sock=$tmp/convd.sock
"$top/bin/convd" --config /dev/null --backend cpu --socket "$sock" > "$tmp/convd.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do
    kill -0 "$pid" 2> /dev/null || {
        cat "$tmp/convd.log"
        die "convd exited during start-up"
    }
    "$top/bin/convctl" --socket "$sock" ping > /dev/null 2>&1 && break
    sleep 0.1
done
"$top/bin/convctl" --socket "$sock" status | head -3

for prog in "$tmp/cmake/minimal" "$tmp/cmake/minimal-static" "$tmp/minimal-pc"; do
    out=$(CONVD_SOCKET=$sock "$prog") || die "$(basename "$prog") failed: $out"
    echo "$(basename "$prog"): $out"
    [[ $out == *"$expect"* ]] || die "$(basename "$prog") printed '$out', expected '$expect'"
done

kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
pid=""
[[ $rc -eq 0 ]] || die "convd exited $rc after SIGTERM"
echo
echo "consumer: OK (CMake shared and static, pkg-config; $("$top/bin/convd" --version))"
