#!/usr/bin/env bash
# Creates .venv (if missing) and installs exactspec with what the CLI's default path and the tests need.
#
#   bash scripts/setup.sh              # what `make run` and `make serve` use: no llama.cpp
#   bash scripts/setup.sh --llamacpp   # and llama-cpp-python, compiled for this CPU (`make test`, CI)
#
# The default path (`--backend auto` on the built-in pair) runs ONNX Runtime; llama.cpp is a backend by
# choice (`--backend llamacpp`) and the bench's peer, and exactspec says how to install it when one of them
# needs it. torch is pinned to the CPU build (==2.13.0): an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
with_llamacpp=0
for arg in "$@"; do
  case "$arg" in
    --llamacpp) with_llamacpp=1 ;;
    *) echo "usage: bash scripts/setup.sh [--llamacpp]" >&2; exit 2 ;;
  esac
done
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# One stamp per part: a setup redoes a part when the stamp is missing or older than pyproject.toml or this
# script, so `make test` after `make run` adds llama.cpp and reinstalls nothing else.
stale() { [ ! -f "$1" ] || [ pyproject.toml -nt "$1" ] || [ "$0" -nt "$1" ]; }
base_stamp=.venv/.exactspec-setup
llamacpp_stamp=.venv/.exactspec-setup-llamacpp
need_base=0
need_llamacpp=0
if stale "$base_stamp"; then need_base=1; fi
if [ "$with_llamacpp" = 1 ] && stale "$llamacpp_stamp"; then need_llamacpp=1; fi
# pip upgrades itself before the compile starts beside the installs: an upgrade during the compile swaps
# the build hooks the compiling pip runs (its build then fails with KeyError _PYPROJECT_HOOKS_BUILD_BACKEND).
if [ "$need_base" = 1 ] || [ "$need_llamacpp" = 1 ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
fi
build=""
# A setup that stops early (a failed install, Ctrl-C) stops the compile running beside it too.
trap 'if [ -n "$build" ]; then kill "$build" 2>/dev/null || true; fi' EXIT
if [ "$need_llamacpp" = 1 ]; then
  # llama.cpp backend (exactspec/models/llamacpp/), built from source once per machine and set of flags.
  # A native build (-march=native) segfaults on its first decode on some of our CPUs, and an AVX-512
  # build dies of SIGILL on a CPU without avx512f: the flags follow /proc/cpuinfo. LLAVA_BUILD=OFF
  # leaves out llama-cpp-python's multimodal library (mtmd), which exactspec never loads: on a 2-core
  # Zen 3 the compile took 4 min 50 s without it against 5 min 53 s with it (docs/install.md).
  simd="-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
  if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then simd="-DGGML_AVX512=ON"; fi
  flags="-DGGML_NATIVE=OFF $simd -DLLAVA_BUILD=OFF"
  # pip's own wheel cache ignores CMAKE_ARGS (a wheel built for AVX-512 would be reused on an AVX2 CPU and
  # die of SIGILL), so the built wheel is kept in a folder named after its flags.
  wheels="${XDG_CACHE_HOME:-$HOME/.cache}/exactspec/wheels/llama-cpp-python-0.3.36-$(echo "$flags" | sha1sum | cut -c1-12)"
  if ! ls "$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    # The compile is CPU-bound and the installs below mostly fetch and unpack, so the compile runs
    # beside them rather than after them.
    mkdir -p "$(dirname "$wheels")"
    log="$wheels.log"
    echo "building llama-cpp-python 0.3.36 ($flags) beside the other installs: a long compile, once per" \
      "machine (log: $log)" >&2
    rm -rf "$wheels.partial"
    CMAKE_ARGS="$flags" .venv/bin/python -m pip wheel --no-cache-dir --no-deps -w "$wheels.partial" \
      "llama-cpp-python==0.3.36" >"$log" 2>&1 &
    build=$!
    started=$SECONDS
  fi
fi
if [ "$need_base" = 1 ]; then
  .venv/bin/python -m pip install --quiet "torch==2.13.0"
  .venv/bin/python -m pip install --quiet -e ".[hf,dev,serve,ray,onnx,structured]"
  touch "$base_stamp"
fi
if [ "$need_llamacpp" = 1 ]; then
  if [ -n "$build" ]; then
    echo "waiting for the llama-cpp-python compile ($((SECONDS - started)) s so far)" >&2
    status=0
    wait "$build" || status=$?
    build=""
    if [ "$status" -ne 0 ]; then
      tail -n 30 "$log" >&2
      echo "setup: the llama-cpp-python build failed (the last lines of $log above; the whole log" \
        "is there). A C++ compiler and Python headers are needed: apt-get install build-essential" \
        "python3-dev" >&2
      exit 1
    fi
    echo "llama-cpp-python compiled in $((SECONDS - started)) s" >&2
    mv "$wheels.partial" "$wheels"
  fi
  .venv/bin/python -m pip install --quiet --force-reinstall --no-deps --no-index --find-links "$wheels" \
    "llama-cpp-python==0.3.36"
  .venv/bin/python -m pip install --quiet -e ".[llamacpp]"
  touch "$llamacpp_stamp"
fi
# exactspec's own CPU kernels (exactspec/kernels: C, compiled once per machine, compiler and source text, in
# seconds; an unchanged library is found in the cache at once): built here so a missing compiler is said
# at setup, with the fix, rather than at the first command.
.venv/bin/python -m exactspec.kernels.build >/dev/null
