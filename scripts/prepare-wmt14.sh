#!/usr/bin/env bash
# Prepare WMT14 English-German as Shen et al. 2020's release (prepare-wmt14en2de.sh) does.
# The steps are the function wmt14() in scripts/prepare.py; --help lists the options.
py=${PYTHON:-$(dirname "$0")/../.venv/bin/python}
[ -x "$py" ] || py=python3
exec "$py" "$(dirname "$0")/prepare.py" wmt14 "$@"
