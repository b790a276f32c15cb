#!/usr/bin/env bash
# Prepare the Penn Treebank language-model corpus as Mikolov et al. released it (the
# word-level PTB of the LM papers: lowercased, numbers as N, a 10,000-word vocabulary with
# <unk>, one sentence a line), binarized for fairseq's language_modeling task.
#
# Usage: scripts/prepare-ptb.sh [options]; defaults: --archive/--url: simple-examples.tgz
# from http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz (its md5, published by
# PaddlePaddle's dataset/imikolov.py, is enforced), --work data/ptb, --dest
# data/data-bin/ptb. The text is used as released: no tokenizer, no BPE.
#
# Steps: fetch; text (./simple-examples/data/ptb.{train,valid,test}.txt, counted); sizes;
# binarize (fairseq-preprocess --only-source, the dictionary from train, prepare.json).
# Sizes enforced: 42,068 / 3,370 / 3,761 lines; 929,589 / 73,760 / 82,430 tokens, i.e.
# 887,521 / 70,390 / 78,669 words (`wc -w`) and one end of sentence a line, as
# fairseq-preprocess counts them ("N tokens") and as the usual "929k/73k/82k words" do;
# a vocabulary of 10,000 with the end of sentence (9,999 words in ptb.train.txt, <unk> one
# of them). fairseq's dictionary: its <s> <pad> </s> <unk>, the 9,998 other words and 6
# padding "madeupword"s (10,008 entries, a multiple of 8; dict.txt lists the last 10,004).
set -euo pipefail
# shellcheck source=scripts/prepare_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/prepare_lib.sh"

PL_NAME=ptb
PL_ENV=PTB
PL_DATASET=ptb
PL_DEFAULT_URL=http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz
PL_DEST_NAME=ptb
PL_BPE=  # word-level
ARCHIVE_NAME=simple-examples.tgz
PL_KNOWN_MD5[$ARCHIVE_NAME]=30177ea32e27c525793142b6bf2c8e2d
MEMBERS=(simple-examples/data/ptb.train.txt simple-examples/data/ptb.valid.txt simple-examples/data/ptb.test.txt)
# Mikolov's counts (lines, `wc -w` + lines) and vocabulary; edwardlib/observations
# observations/ptb.py: "a vocabulary of 10,000 words, including the end-of-sentence marker
# and a special symbol (<unk>)", "929,589 training words, 73,760 validation words, and
# 82,430 test words"
LINES="42068 3370 3761"
TOKENS="929589 73760 82430"
VOCABULARY=10000

pl_parse_args "$@"
pl_begin
pl_lm_corpus "$ARCHIVE_NAME" tgz "${MEMBERS[@]}" "$LINES" "$TOKENS" "$VOCABULARY" \
    '{"recipe": "Mikolov et al. simple-examples.tgz data/ptb.*.txt as released"}'
pl_finish
