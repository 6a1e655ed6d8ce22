#!/usr/bin/env bash
# Packs a GPU build folder for the trip to the GPU machine (scripts/gpu-check.sh unpacks it):
# the binaries that run there, stripped, with the ctest files, as BUILD/pack.tgz. Binaries that
# only the build machine runs move to BUILD/hostbin so that they do not travel.
#
#   scripts/pack-gpu-build.sh [BUILD]      (default build-gpu)
#
# SKIP="convd-routes convd-bench-launch" leaves those binaries out of this pack (they stay in
# BUILD/bin): with the base build's benchmark beside ours the full pack passes the 64 MiB carry.
set -euo pipefail
BUILD=${1:-build-gpu}
keep="convd convctl test_gpu_kernels test_gpu_backend test_gpu_daemon fault_gpu convd-bench-kernels convd-bench-launch convd-routes convd-bench-kernels-base"
mkdir -p "$BUILD/hostbin"
for f in "$BUILD"/bin/*; do
    name=$(basename "$f")
    case " $keep " in
    *" $name "*) strip "$f" ;;
    *) mv "$f" "$BUILD/hostbin/" ;;
    esac
done
# The shared client library: fault_gpu and the Python package (CONVD_CLIENT_LIB) load it.
# python/CTestTestfile.cmake: ctest -L gpu there runs python_gpu (python/tests/test_gpu.py).
skip_args=()
for name in ${SKIP:-}; do skip_args+=(--exclude "bin/$name"); done
(cd "$BUILD" && tar czf pack.tgz "${skip_args[@]}" bin tests CTestTestfile.cmake CMakeCache.txt lib/libconvd-client.so* \
    python/CTestTestfile.cmake)
ls -l "$BUILD/pack.tgz"
# The device tool carries at most 64 MiB; every extra architecture (CONVD_CUDA_ARCH defaults to
# 80-real;86-real;89-real;90) adds its SASS to each binary.
if [ "$(stat -c %s "$BUILD/pack.tgz")" -gt $((64 << 20)) ]; then
    echo "warning: $BUILD/pack.tgz is over 64 MiB, the device tool's carry limit; for the H200" \
        "configure with -DCONVD_CUDA_ARCH=90" >&2
fi
