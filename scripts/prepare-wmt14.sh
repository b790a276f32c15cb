#!/usr/bin/env bash
# WMT14 En-De as Shen et al. 2020's prepare-wmt14en2de.sh: the steps are wmt14() in scripts/prepare.py; --help: options.
py=$(dirname "$0")/../.venv/bin/python; [ -x "$py" ] || py=python3
exec "${PYTHON:-$py}" "$(dirname "$0")/prepare.py" wmt14 "$@"
