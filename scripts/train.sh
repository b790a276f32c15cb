#!/usr/bin/env bash
# Train one config: scripts/train.sh CONFIG [--data DIR] [extra fairseq-train args...]
# The config (configs/*.yaml) holds the whole recipe; extra arguments replace the flags
# the config sets (or add new ones), e.g. --save-dir DIR, --max-epoch 1, --max-update 100.
# Adds --user-dir (the plugin) and, without a GPU, --cpu. Default save dir:
# checkpoints/<name> at the repository root; the log also goes to <save dir>/train.log.
# Print the command without running it: python scripts/recipes.py argv CONFIG [-- extra]
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3)
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONWARNINGS=${PYTHONWARNINGS:-ignore}
[ $# -ge 1 ] || { sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
exec "$PY" "$REPO/scripts/recipes.py" train "$@"
