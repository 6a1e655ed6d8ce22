#!/usr/bin/env bash
# The README's C example must be client/examples/minimal.c exactly (that file is compiled and run
# by the tests, so the README cannot drift into code that does not build).
#
#   it_readme.sh README.md client/examples/minimal.c
set -euo pipefail
readme=$1
example=$2
block=$(awk '/^```c$/ { inside = 1; next } inside && /^```$/ { exit } inside { print }' "$readme")
if [[ -z $block ]]; then
    echo "FAILED: no \`\`\`c block in $readme"
    echo "0 passed, 1 failed"
    exit 1
fi
if diff -u "$example" <(printf '%s\n' "$block"); then
    echo "ok     README's example is $example"
    echo "1 passed, 0 failed"
else
    echo "FAILED: README's example differs from $example (diff above)"
    echo "0 passed, 1 failed"
    exit 1
fi
