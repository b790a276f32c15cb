#!/usr/bin/env bash
# WMT16 En-De as google/seq2seq's wmt16_en_de.sh: the steps are wmt16() in scripts/prepare.py; --help: options.
py=$(bash "$(dirname "$0")/find-python.sh" wmt16 regex sacremoses subword_nmt) || exit 1
exec "$py" "$(dirname "$0")/prepare.py" wmt16 "$@"
