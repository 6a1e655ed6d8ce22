#!/usr/bin/env bash
# Makes sure the build's prerequisites are present; sourced by demo.sh and test.sh so that each of
# them works on a fresh Debian machine. Missing packages are installed with apt-get when running
# as root (or with sudo when it is available without a password); otherwise the script prints the
# exact apt-get line and fails.
# python3-numpy, -pytest, -torch, -torchvision and -venv: the Python package's tests
# (python/tests), which the test command runs against a real daemon.
deps_packages=(cmake ninja-build gcc g++ make pkg-config libuv1-dev libprotobuf-c-dev
    protobuf-c-compiler libcmocka-dev libsystemd-dev python3 python3-numpy python3-pytest
    python3-torch python3-torchvision python3-venv)

deps_missing() {
    local missing=()
    command -v cmake > /dev/null || missing+=(cmake)
    command -v ninja > /dev/null || command -v make > /dev/null || missing+=(ninja-build)
    command -v gcc > /dev/null || missing+=(gcc)
    command -v g++ > /dev/null || missing+=(g++)
    command -v pkg-config > /dev/null || missing+=(pkg-config)
    command -v protoc-c > /dev/null || missing+=(protobuf-c-compiler)
    if command -v pkg-config > /dev/null; then
        pkg-config --exists libuv || missing+=(libuv1-dev)
        pkg-config --exists libprotobuf-c || missing+=(libprotobuf-c-dev)
        pkg-config --exists cmocka || missing+=(libcmocka-dev)
    else
        missing+=(libuv1-dev libprotobuf-c-dev libcmocka-dev)
    fi
    if [[ -x /usr/bin/python3 ]]; then
        local mod pkg
        for mod in numpy:python3-numpy pytest:python3-pytest torch:python3-torch \
            torchvision:python3-torchvision ensurepip:python3-venv; do
            pkg=${mod#*:}
            /usr/bin/python3 -c "import ${mod%%:*}" 2> /dev/null || missing+=("$pkg")
        done
    else
        missing+=(python3 python3-numpy python3-pytest python3-torch python3-torchvision
            python3-venv)
    fi
    echo "${missing[@]}"
}

deps_ensure() {
    local missing
    missing=$(deps_missing)
    [[ -z $missing ]] && return 0
    echo "deps: missing: $missing"
    local sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        if command -v sudo > /dev/null && sudo -n true 2> /dev/null; then
            sudo=(sudo -n)
        else
            echo "deps: run as root: apt-get install -y ${deps_packages[*]}" >&2
            return 1
        fi
    fi
    if ! command -v apt-get > /dev/null; then
        echo "deps: no apt-get here; install the equivalents of: ${deps_packages[*]}" >&2
        return 1
    fi
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q &&
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
            --no-install-recommends "${deps_packages[@]}"
    missing=$(deps_missing)
    if [[ -n $missing ]]; then
        echo "deps: still missing after apt-get: $missing" >&2
        return 1
    fi
}

# The CUDA architectures the README's commands build, to stay fast: the machine's own GPU when
# nvidia-smi lists one ("native"), else sm_90 alone (a compile check; nothing here runs it). A
# plain cmake configure builds every generation from Ampere on (CONVD_CUDA_ARCH). Prints the
# cmake argument; nothing when the caller's build folder is already configured.
deps_cuda_arch_arg() {
    local build_dir=$1
    [[ -f $build_dir/CMakeCache.txt ]] && return 0
    if command -v nvidia-smi > /dev/null 2>&1 && nvidia-smi -L 2> /dev/null | grep -q '^GPU '; then
        echo "-DCONVD_CUDA_ARCH=native"
    else
        echo "-DCONVD_CUDA_ARCH=90"
    fi
}
