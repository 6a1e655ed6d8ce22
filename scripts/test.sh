#!/usr/bin/env bash
# Builds convd and runs every test with ctest: unit tests, integration tests (each starts a real
# daemon on the CPU backend on a temporary socket) and, in a GPU build on a machine with a GPU,
# the GPU tests.
#
#   scripts/test.sh                      build/ with the default GPU setting (nvcc if found)
#   scripts/test.sh --sanitize           build-asan/ with ASan + UBSan, GPU and benchmarks off
#   scripts/test.sh --gpu off            any CMake GPU setting: auto, nvidia, amd, off
#   scripts/test.sh --build-dir DIR      another build folder
#   scripts/test.sh -- -L integration    arguments after -- go to ctest
#
# Prints the build's progress, then ctest's summary ("100% tests passed, 0 tests failed out of
# N"). Exits non-zero if the build or any test fails.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/deps.sh
source "$root/scripts/deps.sh"
deps_ensure
build_dir=""
gpu=""
sanitize=0
ctest_args=()
while [[ $# -gt 0 ]]; do
    case "$1" in
    --sanitize) sanitize=1 ;;
    --gpu) gpu="$2"; shift ;;
    --build-dir) build_dir="$2"; shift ;;
    -h | --help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; ctest_args=("$@"); break ;;
    *) echo "test.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
    shift
done

cmake_args=()
if [[ $sanitize -eq 1 ]]; then
    build_dir=${build_dir:-$root/build-asan}
    # Benchmarks are not tests: skip building them with the (slow) sanitizer instrumentation.
    cmake_args+=(-DCONVD_SANITIZE=ON -DCONVD_BUILD_BENCH=OFF)
    gpu=${gpu:-off}
fi
build_dir=${build_dir:-$root/build}
[[ -n $gpu ]] && cmake_args+=("-DCONVD_GPU=$gpu")

generator=()
if [[ ! -f $build_dir/CMakeCache.txt ]]; then
    if command -v ninja > /dev/null; then generator=(-G Ninja); else generator=(-G "Unix Makefiles"); fi
fi
jobs=$(nproc 2> /dev/null || echo 2)

arch_arg=$(deps_cuda_arch_arg "$build_dir")
[[ -n $arch_arg ]] && cmake_args+=("$arch_arg")
cmake -S "$root" -B "$build_dir" "${generator[@]}" "${cmake_args[@]}"
cmake --build "$build_dir" --parallel "$jobs"

# Sanitizer runs: fail on the first report, and keep leak checking on for the daemon's exit.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=0:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
cd "$build_dir"
ctest --output-on-failure --parallel "$jobs" "${ctest_args[@]}"
