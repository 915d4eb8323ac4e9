#!/usr/bin/env bash
# Creates .venv (if missing) and installs exactspec with what the tests and the CLI need.
# torch is pinned to the CPU build (==2.13.0): an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.exactspec-setup
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ "$0" -nt "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet "torch==2.13.0"
  .venv/bin/python -m pip install --quiet -e ".[hf,dev,serve,ray,onnx]"
  # llama.cpp backend (exactspec.models.llamacpp), built from source once (12 to 40 minutes on 2 cores;
  # pip caches the wheel). A native build (-march=native) segfaults on its first decode on some of our
  # CPUs, and an AVX-512 build dies of SIGILL on a CPU without avx512f: the flags follow /proc/cpuinfo.
  simd="-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
  if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then simd="-DGGML_AVX512=ON"; fi
  flags="-DGGML_NATIVE=OFF $simd"
  # pip's own wheel cache ignores CMAKE_ARGS (a wheel built for AVX-512 would be reused on an AVX2 CPU and
  # die of SIGILL), so the built wheel is kept in a folder named after its flags.
  wheels="${XDG_CACHE_HOME:-$HOME/.cache}/exactspec/wheels/llama-cpp-python-0.3.36-$(echo "$flags" | sha1sum | cut -c1-12)"
  if ! ls "$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    echo "building llama-cpp-python 0.3.36 ($flags): a long compile, once per machine" >&2
    CMAKE_ARGS="$flags" .venv/bin/python -m pip wheel --quiet --no-cache-dir --no-deps -w "$wheels.partial" \
      "llama-cpp-python==0.3.36"
    mv "$wheels.partial" "$wheels"
  fi
  .venv/bin/python -m pip install --quiet --force-reinstall --no-deps --no-index --find-links "$wheels" \
    "llama-cpp-python==0.3.36"
  .venv/bin/python -m pip install --quiet -e ".[llamacpp]"
  touch "$stamp"
fi
