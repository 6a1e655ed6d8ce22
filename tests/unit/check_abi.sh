#!/usr/bin/env bash
# The shared library's exported symbols and their versions against tests/unit/abi-symbols.txt:
# nothing removed, nothing re-versioned, nothing new without a line there (which makes the author
# put it in a new node of client/libconvd-client.map rather than in CONVD_0's pattern), and
# nothing exported but convd_* functions and the version nodes.
#
#   check_abi.sh LIBCONVD_CLIENT_SO ABI_SYMBOLS_TXT
set -euo pipefail

lib=$1
want=$2
have=$(readelf --dyn-syms --wide "$lib" | awk '$7 != "UND" && $8 ~ /^convd_/ {
    name = $8; sub(/@.*/, "", name); ver = $8; sub(/^[^@]*@+/, "", ver); print name, ver }' | sort)
expected=$(grep -v '^#' "$want" | sed '/^$/d' | sort)
status=0
if ! diff <(printf '%s\n' "$expected") <(printf '%s\n' "$have") > /dev/null; then
    echo "the exported symbols differ from $want ('<' expected, '>' exported):"
    diff <(printf '%s\n' "$expected") <(printf '%s\n' "$have") | grep '^[<>]' || true
    status=1
fi
# Every exported symbol that is defined here carries a version (no unversioned leak).
others=$(readelf --dyn-syms --wide "$lib" | awk 'NR > 3 && $7 != "UND" && $8 != "" &&
    $8 !~ /^convd_/ && $8 !~ /^CONVD_/ { print $8 }')
if [[ -n $others ]]; then
    echo "symbols other than convd_* are exported:"
    printf '  %s\n' $others
    status=1
fi
unversioned=$(readelf --dyn-syms --wide "$lib" | awk '$7 != "UND" && $8 ~ /^convd_/ && $8 !~ /@/ {
    print $8 }')
if [[ -n $unversioned ]]; then
    echo "convd_* symbols without a version: $unversioned"
    status=1
fi
n=$(printf '%s\n' "$have" | wc -l)
[[ $status -eq 0 ]] && echo "ok: $n symbols, as $want lists them"
exit "$status"
