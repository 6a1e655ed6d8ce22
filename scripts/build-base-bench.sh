#!/usr/bin/env bash
# Builds convd-bench-kernels at another commit, for comparing kernel times on the GPU machine in
# one call (scripts/gpu-check.sh runs it beside this build's and writes bench-vs-base.md):
#
#   scripts/build-base-bench.sh REV [BUILD]      (default build-gpu)
#
# The commit is checked out in a temporary worktree and configured like BUILD (its
# CONVD_CUDA_ARCH and build type); the binary lands at BUILD/bin/convd-bench-kernels-base, where
# scripts/pack-gpu-build.sh packs it. Only the kernel benchmark is built: a few minutes.
set -euo pipefail
REV=${1:?usage: scripts/build-base-bench.sh REV [BUILD]}
BUILD=${2:-build-gpu}
[ -f "$BUILD/CMakeCache.txt" ] || { echo "configure $BUILD first" >&2; exit 2; }
arch=$(sed -n 's/^CONVD_CUDA_ARCH:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
wt=$(mktemp -d /tmp/convd-base.XXXXXX)
trap 'git worktree remove --force "$wt" >/dev/null 2>&1 || true; rm -rf "$wt"; git worktree prune' EXIT
git worktree add --quiet --detach "$wt" "$REV"
cmake -S "$wt" -B "$wt/build" -G Ninja -DCMAKE_BUILD_TYPE="${type:-Release}" \
    ${arch:+-DCONVD_CUDA_ARCH="$arch"} >"$wt/configure.log" 2>&1 ||
    { tail -20 "$wt/configure.log"; exit 1; }
cmake --build "$wt/build" --target convd-bench-kernels >"$wt/build.log" 2>&1 ||
    { tail -30 "$wt/build.log"; exit 1; }
mkdir -p "$BUILD/bin"
cp "$wt/build/bin/convd-bench-kernels" "$BUILD/bin/convd-bench-kernels-base"
echo "$BUILD/bin/convd-bench-kernels-base: convd-bench-kernels of $(git rev-parse --short "$REV")"
