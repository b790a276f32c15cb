#!/usr/bin/env bash
# Prepare the Penn Treebank language-model corpus (Mikolov's simple-examples.tgz).
# The steps are the function ptb() in scripts/prepare.py; --help lists the options.
py=${PYTHON:-$(dirname "$0")/../.venv/bin/python}
[ -x "$py" ] || py=python3
exec "$py" "$(dirname "$0")/prepare.py" ptb "$@"
