#!/usr/bin/env bash
# WikiText-103 (wikitext-103-v1.zip), word level: the steps are wikitext103() in scripts/prepare.py; --help: options.
py=$(dirname "$0")/../.venv/bin/python; [ -x "$py" ] || py=python3
exec "${PYTHON:-$py}" "$(dirname "$0")/prepare.py" wikitext103 "$@"
