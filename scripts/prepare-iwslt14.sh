#!/usr/bin/env bash
# Prepare IWSLT14 German-English as fairseq's examples/translation/prepare-iwslt14.sh does.
# The steps are the function iwslt14() in scripts/prepare.py; --help lists the options.
py=${PYTHON:-$(dirname "$0")/../.venv/bin/python}
[ -x "$py" ] || py=python3
exec "$py" "$(dirname "$0")/prepare.py" iwslt14 "$@"
