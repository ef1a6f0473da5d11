#!/usr/bin/env bash
# Horovod 0.28.1 for strategy=horovod, built from source against the venv's torch: bash 10-horovod.sh VENV
#
# The recipe. PyPI has only horovod's sdist, and it does not build against torch >= 2.1 as-is: its CMake
# files hard-code C++14 while torch's headers need C++17 (2.1-2.13) or C++20 (2.14). We change no horovod
# source. Instead a CMake toolchain file of ours (scripts/horovod/toolchain.cmake, handed over through the
# CMAKE_TOOLCHAIN_FILE environment variable, since horovod's setup.py passes no CMake flags) makes CMake
# spell "C++14" as the standard torch needs. The build uses the venv's torch (--no-build-isolation), the
# gloo controller and gloo CPU operations, no MPI, no TensorFlow/MXNet. A CUDA torch makes horovod's CMake
# want nvcc, so we point it at the CUDA toolkit; NCCL GPU operations are added when a GPU is visible (or
# HYDRA_DIST_HOROVOD_NCCL=1), using the NCCL that torch's pip packages ship.
#
# The wheel is built once into a cache outside the repository, keyed by horovod, python, torch and build
# flavour, and reused on later runs and by other checkouts. The sdist is cached beside it, so a machine
# without network can build from a copied cache (HYDRA_DIST_CACHE). HYDRA_DIST_HOROVOD=0 skips this step.
set -euo pipefail
venv=${1:?usage: 10-horovod.sh VENV}
py="$venv/bin/python"
here=$(cd "$(dirname "$0")/../horovod" && pwd)
version=0.28.1
say() { echo "setup: horovod: $*"; }
die() { echo "setup: horovod: $*" >&2; echo "setup: horovod: (HYDRA_DIST_HOROVOD=0 skips horovod; strategy=horovod then says how to install it)" >&2; exit 1; }
pip() { "$py" -m pip --disable-pip-version-check "$@"; }

[ "${HYDRA_DIST_HOROVOD:-1}" = 0 ] && { say "skipped (HYDRA_DIST_HOROVOD=0)"; exit 0; }
# Done before, for these torch and horovod versions (read from package metadata: no torch import, ~0.1 s)?
stamp="$venv/.hydra-dist-horovod"
installed=$("$py" -c "from importlib.metadata import version as v; print(v('torch'), v('horovod'))" 2>/dev/null || true)
[ -n "$installed" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$installed" ] && exit 0
if [ -n "$installed" ] && "$py" -c "import horovod.torch" 2>/dev/null; then
    echo "$installed" >"$stamp"  # installed some other way, and it loads against this torch
    exit 0
fi

for tool in g++ cmake make; do
    command -v "$tool" >/dev/null || die "cannot build horovod: '$tool' is not installed (Debian: apt-get install g++ cmake make)"
done

torch_facts=$("$py" -c "import sys, torch; print(torch.__version__, torch.version.cuda or 'none', f'cp{sys.version_info[0]}{sys.version_info[1]}', torch.utils.cmake_prefix_path)") \
    || die "torch is not importable in $venv; run scripts/setup.sh first"
read -r torch_version torch_cuda py_tag torch_cmake <<<"$torch_facts"
# The C++ standard the installed torch headers insist on (ATen.h says it in an #error line).
aten_h="$(dirname "$(dirname "$torch_cmake")")/include/ATen/ATen.h"
if grep -q "__cplusplus < 202002L" "$aten_h" 2>/dev/null; then cxx_std=20; else cxx_std=17; fi

env_vars=(HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_MPI=1
          HOROVOD_WITH_GLOO=1 HOROVOD_CPU_OPERATIONS=gloo "CMAKE_TOOLCHAIN_FILE=$here/toolchain.cmake"
          "HYDRA_DIST_CXX_STD=$cxx_std" "MAKEFLAGS=-j$(nproc)")
flavour=gloo
nccl=0  # NCCL GPU operations: decided here, asked below by this flag (the flavour names more than that)
if [ "$torch_cuda" != none ]; then
    cuda_home=${CUDA_HOME:-}
    if [ -z "$cuda_home" ]; then
        # A toolkit folder first: nvcc on PATH may be a wrapper script outside the toolkit.
        nvcc=$(ls -d /usr/local/cuda*/bin/nvcc 2>/dev/null | sort -V | tail -1 || true)
        nvcc=${nvcc:-$(command -v nvcc || true)}
        [ -n "$nvcc" ] && cuda_home=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
    fi
    [ -n "$cuda_home" ] && [ -x "$cuda_home/bin/nvcc" ] \
        || die "torch $torch_version is a CUDA build, and horovod's CMake then needs the CUDA toolkit (nvcc); none found. Set CUDA_HOME, or use a CPU torch"
    # Horovod's few CUDA kernels are compiled for one architecture: the visible GPU's, else 80 (the kernels
    # then go unused: without NCCL, training stays on the CPU). HOROVOD_BUILD_CUDA_CC_LIST overrides.
    gpu_cc=$("$py" -c "import torch; print('%d%d' % torch.cuda.get_device_capability() if torch.cuda.is_available() else '')")
    gpu_visible=$([ -n "$gpu_cc" ] && echo 1 || echo 0)
    cc_list=${HOROVOD_BUILD_CUDA_CC_LIST:-${gpu_cc:-80}}
    env_vars+=("CUDA_HOME=$cuda_home" "HOROVOD_CUDA_HOME=$cuda_home" "HOROVOD_BUILD_CUDA_CC_LIST=$cc_list")
    flavour=cuda
    if [ "${HYDRA_DIST_HOROVOD_NCCL:-$gpu_visible}" = 1 ]; then
        nccl_pkg=$("$py" -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])" 2>/dev/null) \
            || die "NCCL operations asked for, but torch's nvidia-nccl package is not in $venv"
        nccl=1
        flavour=cuda-nccl-cc${cc_list//,/-}  # the GPU kernels are compiled for these architectures only
    fi
fi

cache=${HYDRA_DIST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hydra-dist}
wheel_dir="$cache/wheels/horovod-$version-torch$torch_version-$py_tag-$flavour"
wheel=$(ls "$wheel_dir"/horovod-$version-*.whl 2>/dev/null | head -1 || true)

if [ -z "$wheel" ]; then
    mkdir -p "$cache/sdist" "$wheel_dir"
    sdist="$cache/sdist/horovod-$version.tar.gz"
    if [ ! -f "$sdist" ]; then
        say "downloading the horovod $version sdist into $cache/sdist"
        pip download --quiet --no-deps --no-binary :all: --no-build-isolation "horovod==$version" -d "$cache/sdist" \
            || die "could not download horovod-$version.tar.gz (no network? copy it into $cache/sdist)"
    fi
    if [ "$nccl" = 1 ]; then
        # Horovod's FindNCCL wants include/ and lib/libnccl.so; torch's nvidia-nccl package has only libnccl.so.2.
        nccl_home="$cache/nccl-$torch_version"
        mkdir -p "$nccl_home/lib"
        ln -sfn "$nccl_pkg/include" "$nccl_home/include"
        ln -sf "$nccl_pkg/lib/libnccl.so.2" "$nccl_home/lib/libnccl.so"
        env_vars+=(HOROVOD_GPU_OPERATIONS=NCCL "HOROVOD_NCCL_HOME=$nccl_home" HOROVOD_NCCL_LINK=SHARED)
    fi
    say "building horovod $version for torch $torch_version ($flavour, C++$cxx_std) into $wheel_dir"
    say "this compiles C++ once (3 to 12 minutes on 2 cores, depending on their load); later setups reuse the wheel"
    pip install --quiet wheel setuptools packaging psutil pyyaml cloudpickle cffi 2>&1 | grep -v "^WARNING: Location" || true
    build_log="$wheel_dir/build.log"
    tmp=$(mktemp -d "$wheel_dir/.build.XXXXXX")
    start=$(date +%s)
    if ! env "${env_vars[@]}" "$py" -m pip wheel --no-deps --no-build-isolation --no-cache-dir -v -w "$tmp" "$sdist" >"$build_log" 2>&1; then
        rm -rf "$tmp"
        grep -E "error|Error" "$build_log" | tail -15 >&2 || true
        die "the horovod build failed after $(( $(date +%s) - start )) s; full log: $build_log"
    fi
    mv "$tmp"/horovod-*.whl "$wheel_dir"/ && rm -rf "$tmp"
    wheel=$(ls "$wheel_dir"/horovod-$version-*.whl | head -1)
    say "built $(basename "$wheel") in $(( $(date +%s) - start )) s (log: $build_log)"
else
    say "installing the cached wheel $wheel"
fi

pip install --quiet "$wheel" 2>&1 | grep -v "^WARNING: Location" || true
"$py" -c "import horovod.torch as hvd; print('setup: horovod: ready:', 'gloo' if hvd.gloo_built() else 'NO gloo', '+ nccl' if hvd.nccl_built() else '(no nccl)')" \
    || die "horovod is installed but does not load against torch $torch_version; delete $wheel_dir and run setup again"
"$py" -c "from importlib.metadata import version as v; print(v('torch'), v('horovod'))" >"$stamp"
