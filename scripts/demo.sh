#!/usr/bin/env bash
# The README's main command (`make demo` runs it after set-up): the whole pipeline on a
# seeded synthetic corpus, on the CPU, in about 10 minutes on 2 cores:
#   synthetic corpus -> fairseq-preprocess -> train LN, BN, RBN (Post-Norm, small,
#   configs/demo/) -> sacreBLEU on the test set -> normplug-tid on the BN/RBN epoch
#   checkpoints (valid split) -> table "norm | BLEU | mean TID | var TID".
# Usage: scripts/demo.sh [--out DIR] [--force] [--epochs N] [--train-pairs N] [--threads N]
# Everything is written under --out (default demo-out/, git-ignored); a second run
# reuses the corpus and finished trainings.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3)
export PYTHONWARNINGS=${PYTHONWARNINGS:-ignore}
exec "$PY" "$REPO/scripts/demo.py" "$@"
