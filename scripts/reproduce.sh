#!/usr/bin/env bash
# Train and evaluate configs, then tabulate our BLEU beside the published number:
#   scripts/reproduce.sh CONFIG... [--out DIR] [--data DIR] [-- extra fairseq-train args]
# e.g. scripts/reproduce.sh configs/wang2022-iwslt14-deen-*.yaml --out runs/wang2022
# Writes DIR/results.md and DIR/results.csv (default DIR: runs/reproduce), one run
# folder per training (configs with shares_training_with reuse that run). Extra
# fairseq-train arguments (after --) apply to every run; such runs are marked
# "shortened" in the recipe column. A run already finished in DIR is resumed/reused.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3)
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONWARNINGS=${PYTHONWARNINGS:-ignore}
[ $# -ge 1 ] || { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
exec "$PY" "$REPO/scripts/recipes.py" reproduce "$@"
