#!/usr/bin/env bash
# WikiText-103 (wikitext-103-v1.zip), word level: the steps are wikitext103() in scripts/prepare.py; --help: options.
py=$(bash "$(dirname "$0")/find-python.sh" wikitext103 regex) || exit 1
exec "$py" "$(dirname "$0")/prepare.py" wikitext103 "$@"
