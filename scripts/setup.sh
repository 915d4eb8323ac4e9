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
  .venv/bin/python -m pip install --quiet -e ".[hf,dev,serve]"
  # llama.cpp backend (exactspec.models.llamacpp), built from source once (about 12 minutes on 2 cores;
  # pip caches the wheel). A native build (-march=native) segfaults on its first decode on our CPUs.
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=ON" .venv/bin/python -m pip install --quiet -e ".[llamacpp]"
  touch "$stamp"
fi
