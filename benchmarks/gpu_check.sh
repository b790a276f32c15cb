#!/usr/bin/env bash
# The GPU check (one GPU, estimated 7-9 minutes): the norm benchmark in float32 and float16, then
# --fp16 and float32 updates of every translation and language-model architecture against
# fairseq's stock model of the same shape; one table (benchmarks/gpu_check.py, whose options it
# takes). Needs a python with CUDA torch and fairseq:
# PYTHON=/path/to/python benchmarks/gpu_check.sh   (default: .venv/bin/python)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-.venv/bin/python}
exec "$PY" benchmarks/gpu_check.py "$@"
