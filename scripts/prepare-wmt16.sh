#!/usr/bin/env bash
# Prepare WMT16 English-German as google/seq2seq's wmt16_en_de.sh does (fairseq's scaling_nmt set).
# The steps are the function wmt16() in scripts/prepare.py; --help lists the options.
py=${PYTHON:-$(dirname "$0")/../.venv/bin/python}
[ -x "$py" ] || py=python3
exec "$py" "$(dirname "$0")/prepare.py" wmt16 "$@"
