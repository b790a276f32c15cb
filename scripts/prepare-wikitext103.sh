#!/usr/bin/env bash
# Prepare WikiText-103 (wikitext-103-v1.zip) for fairseq's language_modeling task.
# The steps are the function wikitext103() in scripts/prepare.py; --help lists the options.
py=${PYTHON:-$(dirname "$0")/../.venv/bin/python}
[ -x "$py" ] || py=python3
exec "$py" "$(dirname "$0")/prepare.py" wikitext103 "$@"
