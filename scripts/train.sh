#!/usr/bin/env bash
# Train one config: scripts/train.sh CONFIG [--data DIR] [extra fairseq-train args...]
# The config (configs/*.yaml) holds the whole recipe, its stopping rule included (max
# epochs, max updates or patience); extra arguments replace the flags the config sets
# (or add new ones), e.g. --save-dir DIR, --max-epoch 1, --max-update 100. Adds
# --user-dir (the plugin) and, without a GPU, --cpu. Refuses data whose prepare.json
# names another BPE than the config removes. Default save dir: checkpoints/<name> at the
# repository root; the log goes to <save dir>/train.log, the flags and exit status to
# <save dir>/normplug-run.json (scripts/reproduce.sh reads it).
# Print the command without running it: python scripts/recipes.py argv CONFIG [-- extra]
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3)
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONWARNINGS=${PYTHONWARNINGS:-ignore}
[ $# -ge 1 ] || { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
exec "$PY" "$REPO/scripts/recipes.py" train "$@"
