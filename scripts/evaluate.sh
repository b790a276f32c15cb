#!/usr/bin/env bash
# Evaluate one config: scripts/evaluate.sh CONFIG [--checkpoint-dir DIR] [--data DIR]
#                                          [--checkpoint FILE] [-- extra fairseq-generate args]
# Averages the last N epoch checkpoints of the run (N from the config; normplug-average),
# decodes the test set with the recipe's beam / length settings and reports
#   * tokenized BLEU as the paper did (fairseq's scorer on the tokenized, BPE-removed
#     output; lowercased for IWSLT14, compound-split for WMT), and
#   * detokenized sacreBLEU (sacremoses detokenizes both sides) with its signature.
# Writes scores-<name>.json / .csv and generate-<name>.txt next to the checkpoints.
# Default checkpoint dir: checkpoints/<training name> (as scripts/train.sh).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3)
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONWARNINGS=${PYTHONWARNINGS:-ignore}
[ $# -ge 1 ] || { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
exec "$PY" "$REPO/scripts/recipes.py" evaluate "$@"
