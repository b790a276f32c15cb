#!/usr/bin/env bash
# Your own parallel corpus (raw text) -> SentencePiece pieces -> fairseq-preprocess: scripts/own_corpus.py; --help.
py=$(bash "$(dirname "$0")/find-python.sh" text normplug sentencepiece fairseq) || exit 1
exec "$py" "$(dirname "$0")/prepare.py" text "$@"
