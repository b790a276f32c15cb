#!/usr/bin/env bash
# WMT14 En-De as Shen et al. 2020's prepare-wmt14en2de.sh: the steps are wmt14() in scripts/prepare.py; --help: options.
py=$(bash "$(dirname "$0")/find-python.sh" wmt14 regex sacremoses subword_nmt) || exit 1
exec "$py" "$(dirname "$0")/prepare.py" wmt14 "$@"
