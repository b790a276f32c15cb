#!/usr/bin/env bash
# Train and evaluate configs, then tabulate our BLEU beside the published number:
#   scripts/reproduce.sh CONFIG... [--out DIR] [--data DIR] [-- extra fairseq-train args]
#   scripts/reproduce.sh --table-only CONFIG... [--out DIR]   # tabulate only, train nothing
# e.g. scripts/reproduce.sh configs/wang2022-iwslt14-deen-*.yaml --out runs/wang2022
# Writes DIR/results.md and DIR/results.csv (default DIR: runs/reproduce), one row per
# config: published, ours, delta, sacreBLEU, the checkpoint decoded, and a status: full,
# shortened (extra args: ...), not run, failed: ..., or stale (config changed since).
# One run folder per training (configs with shares_training_with reuse that run). Extra
# fairseq-train arguments (after --) apply to every run and mark it shortened. A run
# that finished with the same flags is reused; an unfinished one resumes.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3)
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONWARNINGS=${PYTHONWARNINGS:-ignore}
[ $# -ge 1 ] || { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
exec "$PY" "$REPO/scripts/recipes.py" reproduce "$@"
