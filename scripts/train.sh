#!/usr/bin/env bash
# scripts/train.sh CONFIG [--data DIR] [--gpus N [--bn-sync-stats]] [fairseq-train args...]
# Train one config: its flags, the extra arguments over them, on the CPU or one GPU.
# The driver is scripts/recipes.py (`python scripts/recipes.py train -h`).
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}; [ -x "$PY" ] || PY=$(command -v python3)
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONWARNINGS=${PYTHONWARNINGS:-ignore}
exec "$PY" "$REPO/scripts/recipes.py" train "$@"
