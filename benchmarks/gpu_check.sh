#!/usr/bin/env bash
# The GPU check (one GPU, within 8 minutes): the norm benchmark in float32 and float16, then
# 300 --fp16 updates of every transformer_iwslt_de_en_* architecture against fairseq's stock
# model; one table (benchmarks/gpu_check.py). Needs a python with CUDA torch and fairseq:
# PYTHON=/path/to/python benchmarks/gpu_check.sh   (default: .venv/bin/python)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-.venv/bin/python}
exec "$PY" benchmarks/gpu_check.py "$@"
