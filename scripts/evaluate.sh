#!/usr/bin/env bash
# Evaluate one config: scripts/evaluate.sh CONFIG [--checkpoint-dir DIR] [--data DIR]
#                                          [--checkpoint FILE] [-- extra fairseq-generate args]
# Decodes the checkpoint the config names (evaluate: checkpoint: best, or the average of
# the last N epoch or update checkpoints, made with normplug-average) with the recipe's
# beam / length / batch settings, and reports
#   * tokenized BLEU as the paper did (fairseq's scorer on the tokenized, BPE-removed
#     output; lowercased for IWSLT14, compound-split for WMT), and
#   * sacreBLEU of the sacremoses-detokenized output, against the official references of
#     a sacrebleu test set where the config names one (WMT: wmt14/full, fetched once
#     into ~/.sacrebleu), else against the detokenized references of the binarized test
#     set (IWSLT14: lowercased), with its signature.
# Writes scores-<name>.json / .csv and generate-<name>.txt next to the checkpoints.
# Default checkpoint dir: checkpoints/<training name> (as scripts/train.sh).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3)
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONWARNINGS=${PYTHONWARNINGS:-ignore}
[ $# -ge 1 ] || { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
exec "$PY" "$REPO/scripts/recipes.py" evaluate "$@"
