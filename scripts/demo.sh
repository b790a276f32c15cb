#!/usr/bin/env bash
# scripts/demo.sh [--out DIR] [--force] [--epochs N] [--train-pairs N] [--threads N] (`make demo`)
# The whole pipeline on the synthetic corpus, on the CPU (~10 minutes on 2 cores); see scripts/demo.py.
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}; [ -x "$PY" ] || PY=$(command -v python3)
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONWARNINGS=${PYTHONWARNINGS:-ignore}
exec "$PY" "$REPO/scripts/demo.py" "$@"
