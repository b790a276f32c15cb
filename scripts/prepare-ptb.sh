#!/usr/bin/env bash
# PTB (Mikolov's simple-examples.tgz), word level: the steps are ptb() in scripts/prepare.py; --help: options.
py=$(bash "$(dirname "$0")/find-python.sh" ptb regex) || exit 1
exec "$py" "$(dirname "$0")/prepare.py" ptb "$@"
