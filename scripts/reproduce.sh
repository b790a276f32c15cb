#!/usr/bin/env bash
# scripts/reproduce.sh [--table-only] CONFIG... [--out DIR] [--data DIR] [--gpus N [--bn-sync-stats]] [-- fairseq-train args]
# Train and evaluate configs; OUT/results.md and results.csv, one row per config.
# The driver is scripts/recipes.py (`python scripts/recipes.py reproduce -h`).
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}; [ -x "$PY" ] || PY=$(command -v python3)
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONWARNINGS=${PYTHONWARNINGS:-ignore}
exec "$PY" "$REPO/scripts/recipes.py" reproduce "$@"
