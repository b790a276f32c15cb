#!/usr/bin/env bash
#   --gpus=N    spread each row over N GPUs (of each node), update-freq divided by the processes (the effective
#               batch kept), BN statistics per GPU unless -- --bn-sync-stats; the table says so (default: one GPU,
#               as the paper)
#   --nodes=N --node-rank=R --master-addr=HOST [--master-port=P]
#               a run over N nodes: the same command on every node, each with its rank (README: More than one
#               machine); node 0 evaluates and writes the table
#   --dry-run   print each row's fairseq-train, normplug-average and fairseq-generate command lines, as
#               the recipe driver runs them on GPUs (whatever machine prints them); run nothing, write nothing
#   -- ARGS     fairseq-train arguments for every row, e.g. -- --bn-sync-stats (the table marks the rows modified)
#   -h, --help  this text
# A rerun reuses the rows that finished and resumes those that were stopped (Ctrl-C).
set -euo pipefail
# wang2022.sh PAIR [--dry-run] [ROW ...]: what iwslt14.sh and wmt16.sh run, through the driver: flags stay in configs
pair=$1 dataset=${1%-*} dry= gpus= launch=() extra=()
shift
cd "$(dirname "$0")/.."
script=scripts/$dataset.sh py=.venv/bin/python configs=()
[ -x "$py" ] || py=python3
rows=$(cd configs && ls wang2022-"$pair"-*.yaml | sed "s/^wang2022-$pair-//; s/\.yaml$//" | LC_ALL=C sort | xargs)
whole() { [[ $2 =~ ^[0-9]+$ ]] || { echo "$script: $1 must be a whole number, got '$2'" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
    arg=$1; shift
    case $arg in
        --) extra=("$@"); break ;;
        --nodes=* | --node-rank=* | --master-port=*) whole "${arg%%=*}" "${arg#*=}"; launch+=("${arg%%=*}" "${arg#*=}") ;;
        --master-addr=*) launch+=(--master-addr "${arg#*=}") ;;
        -h | --help) sed -s -n '2,/^[^#]/s/^# \{0,1\}//p' "$script" scripts/wang2022.sh; exit 0 ;;
        --gpus=*) [[ ${arg#--gpus=} =~ ^[1-9][0-9]*$ ]] ||
                      { echo "$script: --gpus must be a whole number over 0, got '${arg#--gpus=}'" >&2; exit 2; }
                  gpus=--gpus=${arg#--gpus=} ;;
        --dry-run) dry=--dry-run; export PYTHONDONTWRITEBYTECODE=1 ;;  # not even a .pyc
        -*) echo "$script: unknown option $arg (see --help)" >&2; exit 2 ;;
        *) [[ " $rows " == *" $arg "* ]] || { echo "$script: no row '$arg' (rows: $rows)" >&2; exit 2; }
           configs+=("configs/wang2022-$pair-$arg.yaml") ;;
    esac
done
[ ${#configs[@]} -gt 0 ] || for row in $rows; do configs+=("configs/wang2022-$pair-$row.yaml"); done
data=$(sed -n 's/^data: *//p' "configs/base/wang2022-$dataset.yaml")  # the folder the configs read
if [ -z "$dry" ] && [ -n "$gpus" ]; then  # more GPUs than visible: the driver's one line, before any download
    "${PYTHON:-$py}" - "${gpus#--gpus=}" <<'EOF' || exit 2
import sys
from normplug.errors import NormplugError
from normplug.recipes.commands import check_visible_gpus
try:
    check_visible_gpus(int(sys.argv[1]))
except NormplugError as err:
    sys.exit(f"normplug-recipe: error: {err}")
EOF
fi
[ -n "$dry" ] || [ -d "$data" ] || bash "scripts/prepare-$dataset.sh"
exec "${PYTHON:-$py}" -m normplug.recipes reproduce "${configs[@]}" --out "runs/wang2022-$dataset" $dry $gpus \
    ${launch[@]+"${launch[@]}"} -- ${extra[@]+"${extra[@]}"}
