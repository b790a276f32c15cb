#!/usr/bin/env bash
# Your own parallel corpus (raw text) -> SentencePiece pieces -> fairseq-preprocess: text() in scripts/prepare.py; --help.
py=$(dirname "$0")/../.venv/bin/python; [ -x "$py" ] || py=python3
exec "${PYTHON:-$py}" "$(dirname "$0")/prepare.py" text "$@"
