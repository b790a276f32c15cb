#!/usr/bin/env bash
# IWSLT15 En-Vi (the Stanford NMT files): the steps are iwslt15_envi() in scripts/prepare.py; --help: options.
py=$(bash "$(dirname "$0")/find-python.sh" iwslt15-envi regex sacremoses subword_nmt) || exit 1
exec "$py" "$(dirname "$0")/prepare.py" iwslt15-envi "$@"
