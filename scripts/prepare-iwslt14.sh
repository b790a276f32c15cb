#!/usr/bin/env bash
# IWSLT14 De-En as fairseq's prepare-iwslt14.sh: the steps are iwslt14() in scripts/prepare.py; --help: options.
py=$(dirname "$0")/../.venv/bin/python; [ -x "$py" ] || py=python3
exec "${PYTHON:-$py}" "$(dirname "$0")/prepare.py" iwslt14 "$@"
