#!/usr/bin/env bash
# IWSLT15 En-Vi (the Stanford NMT files): the steps are iwslt15_envi() in scripts/prepare.py; --help: options.
py=$(dirname "$0")/../.venv/bin/python; [ -x "$py" ] || py=python3
exec "${PYTHON:-$py}" "$(dirname "$0")/prepare.py" iwslt15-envi "$@"
