#!/usr/bin/env bash
# The GPU check (one GPU): the fused Triton norms verified against torch and float64 (VERDICT
# lines), timed against nn.LayerNorm, and bn/rbn/pn trained against stock fairseq, within
# --budget seconds (450); benchmarks/gpu_check.py says what each part does and takes its options
# (--verify, --speed, --train, --smoke, ...). Needs a python with CUDA torch (which brings triton)
# and fairseq:  PYTHON=/path/to/python benchmarks/gpu_check.sh   (default: .venv/bin/python)
# A hard limit 30 s past the budget interrupts the run, which then prints what it measured.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-.venv/bin/python}
budget=450
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    case ${args[i]} in
        --budget) budget=${args[i + 1]:-$budget} ;;
        --budget=*) budget=${args[i]#--budget=} ;;
    esac
done
exec timeout --signal=INT --kill-after=20 "$(( ${budget%.*} + 30 ))" "$PY" benchmarks/gpu_check.py "$@"
