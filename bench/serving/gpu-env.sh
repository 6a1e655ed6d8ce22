# Sourced (not run) by the GPU-machine scripts of bench/serving/, from the repository root, with
# BUILD set: the same preparation as scripts/gpu-check.sh's first steps.
#
#  - BUILD/pack.tgz (scripts/pack-gpu-build.sh) is unpacked into BUILD when present;
#  - the runtime libraries the GPU machine lacks (libuv, protobuf-c: .deps/*.deb, fetched with
#    apt-get download on the build machine) are unpacked into /tmp/deps and put on
#    LD_LIBRARY_PATH;
#  - pytest, where the GPU machine's python3 lacks it, from the python3-pytest .debs among them
#    (and each of its dependencies python3 lacks), through PYTHONPATH, for the Python GPU tests;
#  - CONVD_TEST_PYTHON, the python3 on PATH, which ctest's Python tests then run on;
#  - the build machine's source path, which the build folder's files name, is made to resolve
#    here (a symbolic link to this checkout) when it does not exist;
#  - CONVD_CUDART is set, when the loader cannot find libcudart by itself, to a libcudart of the
#    CUDA toolkit or of PyTorch's pip packages, for `convctl bench --memory gpu` (which dlopens
#    it); nothing else reads that variable.
# shellcheck shell=bash

if [ -f "$BUILD/pack.tgz" ]; then
    tar xzf "$BUILD/pack.tgz" -C "$BUILD" && echo "unpacked $BUILD/pack.tgz"
fi

if compgen -G ".deps/*.deb" >/dev/null; then
    mkdir -p /tmp/deps
    for f in .deps/*.deb; do dpkg -x "$f" /tmp/deps; done
    export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    echo "runtime libraries from .deps unpacked into /tmp/deps"
else
    echo "no .deps/*.deb: relying on installed libuv and protobuf-c"
fi

if command -v python3 >/dev/null && ! python3 -c 'import pytest' 2>/dev/null &&
    [ -d /tmp/deps/usr/lib/python3/dist-packages/pytest ]; then
    # Only the modules python3 lacks: the .debs' packaging or attrs must not shadow newer ones.
    mkdir -p /tmp/deps-py
    for m in pytest _pytest py pluggy iniconfig exceptiongroup attr attrs more_itertools packaging; do
        [ -e "/tmp/deps/usr/lib/python3/dist-packages/$m" ] || continue
        python3 -c "import $m" 2>/dev/null ||
            ln -sfn "/tmp/deps/usr/lib/python3/dist-packages/$m" "/tmp/deps-py/$m"
    done
    export PYTHONPATH=/tmp/deps-py${PYTHONPATH:+:$PYTHONPATH}
    echo "pytest from .deps: $(python3 -c 'import pytest; print(pytest.__version__)' 2>&1 | tail -1)"
fi
# ctest's Python tests run on the interpreter the build machine configured (/usr/bin/python3);
# here they take the python3 on PATH, the one with CUDA torch (python/CMakeLists.txt).
if command -v python3 >/dev/null; then
    export CONVD_TEST_PYTHON=$(command -v python3)
fi
command -v python3 >/dev/null && echo "python3: $(command -v python3), $(python3 -c '
try:
    import torch; print("torch", torch.__version__)
except Exception as e:
    print("no torch:", e)' 2>&1 | tail -1), $(python3 -c 'import pytest; print("pytest", pytest.__version__)' 2>&1 | tail -1)"

gpu_env_src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
if [ -n "$gpu_env_src" ] && [ "$gpu_env_src" != "$PWD" ] && [ ! -e "$gpu_env_src" ]; then
    mkdir -p "$(dirname "$gpu_env_src")" && ln -s "$PWD" "$gpu_env_src" &&
        echo "linked $gpu_env_src -> $PWD"
fi

if [ -z "${CONVD_CUDART:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libcudart\.so'; then
    gpu_env_dirs="/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib"
    if command -v python3 >/dev/null; then
        # PyTorch's wheels bring the runtime in nvidia/cuda_runtime/lib or nvidia/cu13/lib.
        gpu_env_dirs="$gpu_env_dirs $(python3 -c '
import glob, os, sys
for p in sys.path:
    for d in ("nvidia/cu13/lib", "nvidia/cuda_runtime/lib", "nvidia/cu12/lib"):
        if os.path.isdir(os.path.join(p, d)):
            print(os.path.join(p, d))' 2>/dev/null | tr '\n' ' ')"
    fi
    for d in $gpu_env_dirs; do
        for f in "$d"/libcudart.so "$d"/libcudart.so.13 "$d"/libcudart.so.12; do
            if [ -z "${CONVD_CUDART:-}" ] && [ -e "$f" ]; then
                export CONVD_CUDART=$f
            fi
        done
    done
    echo "libcudart for convctl --memory gpu: ${CONVD_CUDART:-none found, left to the loader}"
fi
