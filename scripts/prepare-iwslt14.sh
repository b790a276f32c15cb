#!/usr/bin/env bash
# IWSLT14 De-En as fairseq's prepare-iwslt14.sh: the steps are iwslt14() in scripts/prepare.py; --help: options.
py=$(bash "$(dirname "$0")/find-python.sh" iwslt14 regex sacremoses subword_nmt) || exit 1
exec "$py" "$(dirname "$0")/prepare.py" iwslt14 "$@"
