#!/usr/bin/env bash
#   --dry-run   print each row's fairseq-train, normplug-average and fairseq-generate command lines, as
#               the recipe driver would run them on this machine; run nothing, write nothing
#   -h, --help  this text
# A rerun reuses the rows that finished and resumes those that were stopped (Ctrl-C).
set -euo pipefail
# scripts/wang2022.sh PAIR [--dry-run] [ROW ...]: what scripts/iwslt14.sh (PAIR iwslt14-deen) and
# scripts/wmt16.sh (wmt16-ende) run, through the driver, so that every flag stays in its config.
pair=$1 dataset=${1%-*}
shift
cd "$(dirname "$0")/.."
script=scripts/$dataset.sh py=.venv/bin/python
[ -x "$py" ] || py=python3
rows=$(cd configs && ls wang2022-"$pair"-*.yaml | sed "s/^wang2022-$pair-//; s/\.yaml$//" | LC_ALL=C sort | paste -sd' ')
dry= chosen=()
for arg in "$@"; do
    case $arg in
        -h | --help) sed -s -n '2,/^[^#]/s/^# \{0,1\}//p' "$script" scripts/wang2022.sh; exit 0 ;;
        --dry-run) dry=--dry-run; export PYTHONDONTWRITEBYTECODE=1 ;;  # not even a .pyc
        -*) echo "$script: unknown option $arg (see --help)" >&2; exit 2 ;;
        *) [[ " $rows " == *" $arg "* ]] || { echo "$script: no row '$arg' (rows: $rows)" >&2; exit 2; }
           chosen+=("$arg") ;;
    esac
done
configs=()
for row in ${chosen[@]:-$rows}; do configs+=("configs/wang2022-$pair-$row.yaml"); done
data=$(sed -n 's/^data: *//p' "configs/base/wang2022-$dataset.yaml")  # the folder the configs read
if [ -z "$dry" ] && [ ! -d "$data" ]; then
    bash "scripts/prepare-$dataset.sh"
fi
exec "${PYTHON:-$py}" -m normplug.recipes reproduce "${configs[@]}" --out "runs/wang2022-$dataset" $dry
