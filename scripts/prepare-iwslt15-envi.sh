#!/usr/bin/env bash
# Prepare IWSLT15 English-Vietnamese from the Stanford NMT release.
# The steps are the function iwslt15_envi() in scripts/prepare.py; --help lists the options.
py=${PYTHON:-$(dirname "$0")/../.venv/bin/python}
[ -x "$py" ] || py=python3
exec "$py" "$(dirname "$0")/prepare.py" iwslt15-envi "$@"
