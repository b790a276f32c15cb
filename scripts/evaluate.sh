#!/usr/bin/env bash
# scripts/evaluate.sh CONFIG [--checkpoint-dir DIR] [--checkpoint FILE] [--data DIR] [-- fairseq-generate args]
# Decode the config's checkpoint, score it (tokenized BLEU, sacreBLEU): scores-NAME.json.
# The driver is scripts/recipes.py (`python scripts/recipes.py evaluate -h`).
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}; [ -x "$PY" ] || PY=$(command -v python3)
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONWARNINGS=${PYTHONWARNINGS:-ignore}
exec "$PY" "$REPO/scripts/recipes.py" evaluate "$@"
