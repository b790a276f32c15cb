#!/usr/bin/env bash
# scripts/evaluate.sh CONFIG [--checkpoint-dir DIR] [--checkpoint FILE] [--data DIR] [-- fairseq-generate / fairseq-eval-lm args]
# Score the config's checkpoint: translation: decode, tokenized BLEU and sacreBLEU; language
# model: test perplexity with fairseq-eval-lm, two ways. Writes scores-NAME.json.
# The driver is scripts/recipes.py (`python scripts/recipes.py evaluate -h`).
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}; [ -x "$PY" ] || PY=$(command -v python3)
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONWARNINGS=${PYTHONWARNINGS:-ignore}
exec "$PY" "$REPO/scripts/recipes.py" evaluate "$@"
