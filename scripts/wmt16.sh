#!/usr/bin/env bash
# bash scripts/wmt16.sh [--dry-run] [--gpus=N] [ROW ...]: Wang, Wu & Huang (NeurIPS 2022)'s WMT16 En-De rows, end to end:
# prepares data/data-bin/wmt16_en_de_bpe32k unless it is there (scripts/prepare-wmt16.sh: ~1.2 GB of downloads,
# then tokenization and a 32k BPE, hours on a few cores), then trains, evaluates and tabulates every row, or the
# ROWs named (post-ln post-bn post-rbn), each the recipe configs/wang2022-wmt16-ende-ROW.yaml run by the recipe
# driver (normplug-recipe reproduce); sacreBLEU fetches the official newstest2014 references once.
# Results: runs/wang2022-wmt16/<config name>/ (checkpoints, train.log, generate output, scores) and the table,
# runs/wang2022-wmt16/results.md and results.csv.
# Time on one GPU, an estimate (no full row has run yet): 100,000 updates of 8 batches of 4,096 tokens
# (update-freq 8: the paper's 8 GPUs on one) at 1-2 s (8 x the 0.1-0.2 s of an IWSLT14 batch, a Transformer-base
# costing somewhat more a token) = 28-56 hours a row, 3 rows.
exec bash "$(dirname "$0")/wang2022.sh" wmt16-ende "$@"
