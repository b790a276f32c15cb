#!/usr/bin/env bash
# PTB (Mikolov's simple-examples.tgz), word level: the steps are ptb() in scripts/prepare.py; --help: options.
py=$(dirname "$0")/../.venv/bin/python; [ -x "$py" ] || py=python3
exec "${PYTHON:-$py}" "$(dirname "$0")/prepare.py" ptb "$@"
