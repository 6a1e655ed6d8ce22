#!/usr/bin/env bash
# Checks the man pages against the programs they describe (ctest: man_pages):
#   1. each built page renders with `man --warnings` (else groff -ww) and prints no warning;
#   2. convd.8 names every option of `convd --help`, convd.conf.5 every key that
#      `convd --check-config` prints, convctl.1 every global option of `convctl --help` in its
#      GLOBAL OPTIONS, every command, and every option of `convctl help COMMAND` in that
#      command's entry (or in SHAPE OPTIONS, for a command that takes shape options);
#   3. the example configuration names every key, and with its settings uncommented it gives the
#      same configuration as the defaults (so the values it shows are the defaults).
#
#   man/check-pages.sh BUILT_MAN_DIR SOURCE_MAN_DIR CONVD CONVCTL EXAMPLE_CONF
# Exits 0 when all hold, 1 naming each that does not, 77 when neither man nor groff is there.
set -euo pipefail

built=$1 src=$2 convd=$3 convctl=$4 example=$5
fail=0
bad() {
    echo "check-pages: $*" >&2
    fail=1
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset CONVD_SOCKET

# 1. Rendering.
if command -v man > /dev/null; then
    render() { MANWIDTH=80 man --warnings -E UTF-8 -l -Tutf8 "$1"; }
elif command -v groff > /dev/null; then
    render() { groff -ww -man -Tutf8 "$1"; }
else
    echo "check-pages: neither man nor groff is installed; cannot render the pages" >&2
    exit 77
fi
for page in convd.8 convd.conf.5 convctl.1; do
    if [[ ! -s $built/$page ]]; then
        bad "$built/$page was not built"
        continue
    fi
    if ! render "$built/$page" > "$tmp/out" 2> "$tmp/err"; then
        bad "$page: rendering failed: $(cat "$tmp/err")"
    elif [[ -s $tmp/err ]]; then
        bad "$page: warnings: $(cat "$tmp/err")"
    elif grep -q '@[A-Z_]*@' "$tmp/out"; then
        bad "$page: a placeholder was left unfilled: $(grep -o '@[A-Z_]*@' "$tmp/out" | head -1)"
    fi
done

# 2. Options, keys and commands. The sources are searched (markup: *--name* and *key*).
"$convd" --help > "$tmp/convd-help"
mapfile -t convd_opts < <(grep -oE '^  (-[a-zA-Z], )?--[a-z][a-z0-9-]*' "$tmp/convd-help" |
    grep -oE -- '--[a-z][a-z0-9-]*' | sort -u)
[[ ${#convd_opts[@]} -ge 20 ]] || bad "found only ${#convd_opts[@]} options in convd --help"
for o in "${convd_opts[@]}"; do
    grep -qF -- "*$o*" "$src/convd.8.scd" || bad "convd.8 does not describe $o"
done

"$convd" --config /dev/null --check-config > "$tmp/defaults"
mapfile -t keys < <(sed -n 's/^\([a-z_]*\) =.*/\1/p' "$tmp/defaults")
[[ ${#keys[@]} -ge 20 ]] || bad "found only ${#keys[@]} keys in convd --check-config"
for k in "${keys[@]}"; do
    grep -qF -- "*$k* =" "$src/convd.conf.5.scd" || bad "convd.conf.5 does not describe $k"
done

"$convctl" --help > "$tmp/convctl-help"
mapfile -t cmds < <(sed -n '/^Commands:/,/^$/s/^  \([a-z][a-z-]*\) .*/\1/p' "$tmp/convctl-help")
[[ ${#cmds[@]} -ge 5 ]] || bad "found only ${#cmds[@]} commands in convctl --help"
# convctl.1 in parts: GLOBAL OPTIONS, SHAPE OPTIONS, and each command's entry under COMMANDS
# (from its line `*name*...` to the next such line or heading).
section() { awk -v h="# $1" '$0 == h { on = 1; next } /^# / { on = 0 } on' "$src/convctl.1.scd"; }
section "GLOBAL OPTIONS" > "$tmp/man-global"
section "SHAPE OPTIONS" > "$tmp/man-shape"
entry() {
    section COMMANDS | awk -v c="$1" '/^\*[a-z]+\*/ { on = index($0, "*" c "*") == 1 } on'
}
mapfile -t global_opts < <(sed -n '/^Global options/,/^$/p' "$tmp/convctl-help" |
    grep -oE -- '--[a-z][a-z0-9-]*' | sort -u)
for o in "${global_opts[@]}"; do
    grep -qF -- "*$o*" "$tmp/man-global" || bad "convctl.1 does not describe the global $o"
done
for c in "${cmds[@]}"; do
    entry "$c" > "$tmp/man-$c"
    [[ -s $tmp/man-$c ]] || bad "convctl.1 does not describe the command $c"
    [[ $c == help ]] && continue
    "$convctl" help "$c" > "$tmp/help-$c" || bad "convctl help $c failed"
    cat "$tmp/man-$c" > "$tmp/man-$c-all"
    if grep -q 'SHAPE OPTION' "$tmp/man-$c"; then
        cat "$tmp/man-shape" >> "$tmp/man-$c-all"
    fi
    mapfile -t cmd_opts < <(grep -oE -- '--[a-z][a-z0-9-]*' "$tmp/help-$c" | sort -u)
    for o in "${cmd_opts[@]}"; do
        # Every command answers --help (the page says so once); global options are checked above.
        [[ $o == --help ]] && continue
        printf '%s\n' "${global_opts[@]}" | grep -qxF -- "$o" && continue
        grep -qF -- "*$o*" "$tmp/man-$c-all" || bad "convctl.1 does not describe $c $o"
    done
done

# 3. The example configuration.
for k in "${keys[@]}"; do
    grep -qE "^#? ?$k( =|:)" "$example" || bad "$(basename "$example") does not name $k"
done
sed -n 's/^#\([a-z_]* =.*\)/\1/p' "$example" > "$tmp/example.conf"
if ! "$convd" --config "$tmp/example.conf" --check-config > "$tmp/example-effective" 2> "$tmp/err"; then
    bad "the example configuration, uncommented, does not load: $(cat "$tmp/err")"
elif ! diff -u "$tmp/defaults" "$tmp/example-effective" > "$tmp/diff"; then
    bad "the example configuration's values are not the defaults:"$'\n'"$(cat "$tmp/diff")"
fi

if [[ $fail -eq 0 ]]; then
    echo "check-pages: 3 pages render without warnings; ${#convd_opts[@]} convd options," \
        "${#keys[@]} keys and ${#cmds[@]} convctl commands described; the example holds the defaults"
fi
exit $fail
