# shellcheck shell=bash
# dettrial's dependencies on a Debian 12 machine: sourced by scripts/test and scripts/mnist.
# Everything here is idempotent: what is already installed is left alone.

DETTRIAL_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DETTRIAL_CACHE=${DETTRIAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dettrial}
DETTRIAL_VENV=${DETTRIAL_VENV:-$DETTRIAL_CACHE/venv}
# The Python torch whose LibTorch dettrial is also built against (a 2.x, CUDA- and NCCL-built wheel).
DETTRIAL_PIP_TORCH=${DETTRIAL_PIP_TORCH:-torch}

dettrial_log() { printf '==> %s\n' "$*" >&2; }

dettrial_as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    dettrial_log "need root to run: $*"; return 1; fi
}

# Installs the Debian packages that are missing.
dettrial_apt() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  dettrial_log "installing Debian packages: ${missing[*]}"
  dettrial_as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive dettrial_as_root apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# What building and training the examples needs: the build tools, Debian's LibTorch 1.13 (with
# Gloo's headers, for data-parallel runs), yaml-cpp, range-v3, nlohmann/json, zlib, the real dataset
# (Fashion-MNIST), libjpeg-turbo, libspng and libwebp (the image decoders), libcurl (MLflow tracking), and OpenBLAS, which takes over libblas.so.3 from the reference BLAS that Debian's
# LibTorch would otherwise compute with (10x slower).
dettrial_example_deps() {
  dettrial_apt build-essential cmake ninja-build zlib1g-dev \
    libtorch-dev libgloo-dev libyaml-cpp-dev librange-v3-dev nlohmann-json3-dev dataset-fashion-mnist libopenblas0-pthread \
    libturbojpeg0-dev libjpeg62-turbo-dev libspng-dev libwebp-dev libcurl4-openssl-dev
}

# What the test suite adds: doctest, git and Python's venv (the Conan and PyPI checks), Debian's
# Python torch (the parity peer of its LibTorch) and PIL (the image decoders' reference), Open MPI's mpirun (one of the launchers the
# distributed tests use), Chromium (the report pages render in it) and Slurm with munge (a
# two-node cluster on this host for the Slurm tests), Universal Ctags (the function-length check) and
# clang-format 19 (the format check).
dettrial_test_deps() {
  dettrial_example_deps
  dettrial_apt git ccache python3 python3-venv doctest-dev python3-torch python3-numpy python3-pil python3-psutil openmpi-bin chromium slurm-wlm munge universal-ctags clang-format-19
}

# Runs a command as one named phase of a script and says how long it took ("==> build debian: 312 s").
dettrial_phase() {
  local name=$1 start=$SECONDS status=0
  shift
  "$@" || status=$?
  dettrial_log "$name: $((SECONDS - start)) s$([ "$status" -eq 0 ] || echo " (failed, exit status $status)")"
  return "$status"
}

# A venv with PyPI's tensorboard, whose event-file reader the tests check dettrial's files with,
# and its profile plugin (torch-tb-profiler), whose parser reads the profiler's traces; prints its
# python. (Without torch: neither needs it.)
dettrial_tensorboard_python() {
  local venv="$DETTRIAL_CACHE/tensorboard-venv"
  if ! "$venv/bin/python" -c 'import tensorboard, torch_tb_profiler' 2>/dev/null; then
    dettrial_log "installing tensorboard and its profile plugin from PyPI into $venv"
    python3 -m venv "$venv" >&2 || return 1
    "$venv/bin/python" -m pip install -q tensorboard torch-tb-profiler >&2 || return 1
  fi
  echo "$venv/bin/python"
}

# A venv with PyPI's torch; prints nothing, sets DETTRIAL_PIP_TORCH_PREFIX to its CMake prefix.
dettrial_pip_torch() {
  if [ ! -x "$DETTRIAL_VENV/bin/python" ]; then
    dettrial_log "creating $DETTRIAL_VENV"
    mkdir -p "$(dirname "$DETTRIAL_VENV")"
    python3 -m venv "$DETTRIAL_VENV"
  fi
  if ! "$DETTRIAL_VENV/bin/python" -c 'import torch' 2>/dev/null; then
    dettrial_log "installing $DETTRIAL_PIP_TORCH from PyPI into $DETTRIAL_VENV (a few GB)"
    "$DETTRIAL_VENV/bin/python" -m pip install -q --upgrade pip
    "$DETTRIAL_VENV/bin/python" -m pip install -q "$DETTRIAL_PIP_TORCH" numpy
  fi
  DETTRIAL_PIP_TORCH_PREFIX=$("$DETTRIAL_VENV/bin/python" -c 'import torch; print(torch.utils.cmake_prefix_path)')
  DETTRIAL_PIP_TORCH_VERSION=$("$DETTRIAL_VENV/bin/python" -c 'import torch; print(torch.__version__)')
  export DETTRIAL_PIP_TORCH_PREFIX DETTRIAL_PIP_TORCH_VERSION
}

# Keras 3 (PyPI's keras) in the venv of PyPI's torch, whose torch backend the suite compares
# Keras-style validation with. Prints that venv's python.
dettrial_keras_python() {
  if ! KERAS_BACKEND=torch "$DETTRIAL_VENV/bin/python" -c 'import keras' 2>/dev/null; then
    dettrial_log "installing keras from PyPI into $DETTRIAL_VENV"
    "$DETTRIAL_VENV/bin/python" -m pip install -q keras >&2 || return 1
  fi
  echo "$DETTRIAL_VENV/bin/python"
}

# Installs PyPI's packages "$@" into the venv of PyPI's torch, that torch pinned (a package that
# asks for another release would otherwise move it).
dettrial_pip_beside_torch() {
  local torch_version
  torch_version=$("$DETTRIAL_VENV/bin/python" -c 'import torch; print(torch.__version__)') || return 1
  dettrial_log "installing $* from PyPI into $DETTRIAL_VENV (beside torch $torch_version)"
  "$DETTRIAL_VENV/bin/python" -m pip install -q "$@" "torch==${torch_version%%+*}" >&2
}

# PyPI's torchvision (and PIL) in the venv of PyPI's torch, without moving that torch: the image
# tests' and bench/image's reference. Prints that venv's python; fails when no torchvision release
# accepts the installed torch.
dettrial_torchvision_python() {
  if ! "$DETTRIAL_VENV/bin/python" -c 'import torchvision' 2>/dev/null; then
    dettrial_pip_beside_torch torchvision pillow || return 1
  fi
  echo "$DETTRIAL_VENV/bin/python"
}

# PyPI's transformers and safetensors in the venv of PyPI's torch, without moving that torch: the
# safetensors files and Hugging Face models dettrial reads and writes are checked against their
# own readers and writers. Prints that venv's python.
dettrial_transformers_python() {
  if ! "$DETTRIAL_VENV/bin/python" -c 'import transformers, safetensors' 2>/dev/null; then
    dettrial_pip_beside_torch transformers safetensors || return 1
  fi
  echo "$DETTRIAL_VENV/bin/python"
}

# A venv with Determined (PyPI's `determined`) that sees the torch of $DETTRIAL_VENV through a .pth
# file, for the determined: tests and bench/run's end-to-end comparison with Determined's own
# Trainer. Installs PyPI's torch first when it is missing. Prints its python.
dettrial_determined_python() {
  local venv="$DETTRIAL_CACHE/determined-venv"
  dettrial_pip_torch >&2 || return 1
  if ! "$venv/bin/python" -c 'import determined, torch' 2>/dev/null; then
    dettrial_log "installing determined from PyPI into $venv"
    python3 -m venv "$venv" || return 1
    "$DETTRIAL_VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])' \
      >"$("$venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')/dettrial-torch.pth"
    "$venv/bin/python" -m pip install -q "determined>=0.38,<0.39" >&2 || return 1  # the release the determined: tests are written against
  fi
  echo "$venv/bin/python"
}

# A venv with PyPI's mlflow, whose server the MLflow tests track runs in (read back over its REST
# API); prints its python.
dettrial_mlflow_python() {
  local venv="$DETTRIAL_CACHE/mlflow-venv"
  if ! "$venv/bin/python" -c 'import mlflow' 2>/dev/null; then
    dettrial_log "installing mlflow from PyPI into $venv"
    python3 -m venv "$venv" >&2 || return 1
    "$venv/bin/python" -m pip install -q mlflow >&2 || return 1
  fi
  echo "$venv/bin/python"
}

# ccache, where installed, keeps compiled objects under the cache folder: a rebuild of unchanged
# sources (CI on a clean clone, a second scripts/test) compiles nothing again. The base folder makes
# the paths inside this checkout relative in ccache's key, so a clone at another path (CI's) hits
# what this one compiled; the sloppiness lets it cache translation units that use CMake's
# precompiled headers. 16 GB: two LibTorch builds, each with precompiled headers of 700-800 MB, and
# the objects of the last few commits (ccache's default, 5 GB, holds little more than one commit of both).
# The tests' own builds (the consumer projects, Conan's test_package) inherit
# these. What ccache cannot keep, the compile-fail cases' outputs (it caches no failed compilation)
# and the headers' syntax checks (no object), is kept beside it the same way
# (tools/compile_check_cache.py). Returns non-zero without ccache.
dettrial_ccache_env() {
  export DETTRIAL_COMPILE_CHECK_CACHE=${DETTRIAL_COMPILE_CHECK_CACHE:-$DETTRIAL_CACHE/compile-checks}
  command -v ccache >/dev/null || return 1
  export CCACHE_DIR=${CCACHE_DIR:-$DETTRIAL_CACHE/ccache} CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-16G}
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$DETTRIAL_ROOT}
  export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
}

# Configures build/<name> against the LibTorch at <prefix> ("" = the system's), with the tests and
# examples on, and builds the given targets (all when none are given). DETTRIAL_BUILD_KEEP_GOING=1
# builds every target it can past a failed one (the status still says the build failed).
dettrial_build() {
  local name=$1 prefix=$2
  shift 2
  local dir="$DETTRIAL_ROOT/build/$name"
  local args=(-S "$DETTRIAL_ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release
              -DDETTRIAL_BUILD_TESTS=ON -DDETTRIAL_BUILD_EXAMPLES=ON -DDETTRIAL_BUILD_BENCH=ON ${DETTRIAL_CMAKE_ARGS:-})
  [ -n "$prefix" ] && args+=("-DCMAKE_PREFIX_PATH=$prefix" "-DTorch_DIR=$prefix/Torch")
  # The Release flags, when a script wants others than CMake's (-O3 -DNDEBUG): scripts/test's.
  [ -n "${DETTRIAL_RELEASE_FLAGS:-}" ] && args+=("-DCMAKE_CXX_FLAGS_RELEASE=$DETTRIAL_RELEASE_FLAGS")
  dettrial_ccache_env && args+=("-DCMAKE_CXX_COMPILER_LAUNCHER=$DETTRIAL_ROOT/scripts/lib/ccache-launcher")
  mkdir -p "$DETTRIAL_ROOT/build"
  dettrial_log "configuring $name"
  cmake "${args[@]}" >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log" >&2; return 1; }
  local targets=()
  for t in "$@"; do targets+=(--target "$t"); done
  local jobs=${DETTRIAL_BUILD_JOBS:-2}
  dettrial_log "building $name ${*:-(everything)} ($jobs jobs)"
  local keep_going=()
  [ "${DETTRIAL_BUILD_KEEP_GOING:-0}" = 1 ] && keep_going=(-- -k 0)
  cmake --build "$dir" -j "$jobs" "${targets[@]}" "${keep_going[@]}"
}

# Conan 2 in a venv; prints its conan.
dettrial_conan() {
  local venv="$DETTRIAL_CACHE/conan-venv"
  if [ ! -x "$venv/bin/conan" ]; then
    dettrial_log "installing conan from PyPI into $venv"
    python3 -m venv "$venv" >&2 || return 1
    "$venv/bin/python" -m pip install -q conan >&2 || return 1
  fi
  echo "$venv/bin/conan"
}

# `conan create` of the recipe with Debian's LibTorch, yaml-cpp, range-v3 and zlib declared as
# platform requirements (Conan's central remote is not needed).
dettrial_conan_create() {
  local conan
  conan=$(dettrial_conan) || return 1
  local profile="$DETTRIAL_ROOT/packaging/conan/profiles/debian12"
  local launcher=()
  # The launcher names Conan's build folder (a random name each run) by a stable link, so the test
  # package's compile hits ccache as the builds' do.
  dettrial_ccache_env &&
    launcher=(-c "tools.cmake.cmaketoolchain:extra_variables={'CMAKE_CXX_COMPILER_LAUNCHER': '$DETTRIAL_ROOT/scripts/lib/ccache-launcher'}")
  dettrial_log "conan create (test_package trains a tiny trial)"
  CONAN_HOME="$DETTRIAL_ROOT/build/conan-home" "$conan" create "$DETTRIAL_ROOT" \
    -pr:h "$profile" -pr:b "$profile" "${launcher[@]}"
}
