#!/usr/bin/env bash
# bash scripts/iwslt14.sh [--dry-run] [--gpus=N] [ROW ...]: Wang, Wu & Huang (NeurIPS 2022)'s IWSLT14 De-En rows, end to
# end: prepares data/data-bin/iwslt14.tokenized.de-en unless it is there (scripts/prepare-iwslt14.sh downloads
# de-en.tgz), then trains, evaluates and tabulates every row, or the ROWs named (post-ln post-bn post-bn-teststats
# post-rbn pre-ln pre-bn pre-bn-teststats pre-rbn pre-rbn-mean pre-rbn-var), each the recipe
# configs/wang2022-iwslt14-deen-ROW.yaml run by the recipe driver (normplug-recipe reproduce).
# Results: runs/wang2022-iwslt14/<config name>/ (checkpoints, train.log, generate output, scores) and the
# table, runs/wang2022-iwslt14/results.md and results.csv.
# Time on one GPU, an estimate (no full row has run yet): 60 epochs of ~1,100 updates of 4,096 tokens =
# ~66,000 updates at 0.1-0.2 s (benchmarks/README.md: ~0.1 s for `bn` on an H200 in fp16; the recipes train
# in fp32) = 2-4 hours a row; 8 trainings for the 10 rows (the -teststats rows decode the BN runs) = 16-32 h.
exec bash "$(dirname "$0")/wang2022.sh" iwslt14-deen "$@"
