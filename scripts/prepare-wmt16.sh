#!/usr/bin/env bash
# WMT16 En-De as google/seq2seq's wmt16_en_de.sh: the steps are wmt16() in scripts/prepare.py; --help: options.
py=$(dirname "$0")/../.venv/bin/python; [ -x "$py" ] || py=python3
exec "${PYTHON:-$py}" "$(dirname "$0")/prepare.py" wmt16 "$@"
