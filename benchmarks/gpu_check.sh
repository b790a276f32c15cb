#!/usr/bin/env bash
# The GPU check (one GPU): the norm benchmark in float32 and float16, torch and Triton
# implementations, then --fp16 and float32 updates of every translation and language-model
# architecture (--norm-impl torch and triton) against fairseq's stock model of the same shape;
# one table (benchmarks/gpu_check.py, whose options it takes: --impls, --families, --kinds,
# --skip-norms split it). Needs a python with CUDA torch (which brings triton) and fairseq:
# PYTHON=/path/to/python benchmarks/gpu_check.sh   (default: .venv/bin/python)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-.venv/bin/python}
exec "$PY" benchmarks/gpu_check.py "$@"
