#!/usr/bin/env bash
# Prepare WikiText-103 (Merity et al. 2016, word level: wikitext-103-v1.zip), binarized as
# fairseq's examples/language_model/README.md does (fairseq-preprocess --only-source, the
# dictionary from wiki.train.tokens; its prepare-wikitext-103.sh only downloads and unzips).
#
# Usage: scripts/prepare-wikitext103.sh [options]; defaults: --archive/--url:
# wikitext-103-v1.zip from https://wikitext.smerity.com/wikitext-103-v1.zip, the mirror kept
# by the dataset's author (fairseq's S3 address, s3.amazonaws.com/research.metamind.io/
# wikitext/, has answered 403 since 2024: pytorch/text#2255; the mirror: ooples/AiDotNet#1284,
# IST-DASLab/Quartet#11); its size and sha256 are enforced (190,229,076 bytes, 242ba0f2...,
# huggingface/datasets datasets/wikitext/dataset_infos.json); --work data/wikitext103,
# --dest data/data-bin/wikitext-103. The text is used as released (` = Title = ` lines,
# blank lines, `@-@` and `@,@` inside words and numbers, <unk> for rare words).
#
# Steps: fetch; text (wikitext-103/wiki.{train,valid,test}.tokens, counted); sizes; binarize.
# Sizes enforced: 1,801,350 / 3,760 / 4,358 lines (torchtext's WikiText103 NUM_LINES);
# 103,227,021 / 217,646 / 245,569 tokens, the published figures, which count the words and
# one end of sentence a line, blank lines included, as fairseq-preprocess does (the training
# set's 103,227,021 is fairseq's binarized token count: urvashik/knnlm README); i.e.
# 101,425,671 / 213,886 / 241,211 words; a vocabulary of 267,735 with the end of sentence
# (267,734 words in wiki.train.tokens: Transformer-XL's vocabulary, <eos> then those words,
# is 267,735, the transfo-xl-wt103 config). fairseq's dictionary: 267,744 entries (its 4
# specials, the 267,733 words other than <unk>, 7 padding "madeupword"s).
set -euo pipefail
# shellcheck source=scripts/prepare_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/prepare_lib.sh"

PL_NAME=wikitext103
PL_ENV=WT103
PL_DATASET=wikitext-103
PL_DEFAULT_URL=https://wikitext.smerity.com/wikitext-103-v1.zip
PL_DEST_NAME=wikitext-103
PL_BPE=  # word-level
ARCHIVE_NAME=wikitext-103-v1.zip
PL_KNOWN_SHA256[$ARCHIVE_NAME]=242ba0f20b329cfdf1ccc61e9e9e5b59becf189db7f7a81cd2a0e2fc31539590
PL_KNOWN_BYTES[$ARCHIVE_NAME]=190229076
MEMBERS=(wikitext-103/wiki.train.tokens wikitext-103/wiki.valid.tokens wikitext-103/wiki.test.tokens)
LINES="1801350 3760 4358"
TOKENS="103227021 217646 245569"
VOCABULARY=267735

pl_parse_args "$@"
pl_begin
pl_lm_corpus "$ARCHIVE_NAME" zip "${MEMBERS[@]}" "$LINES" "$TOKENS" "$VOCABULARY" \
    '{"recipe": "fairseq examples/language_model (wikitext-103-v1.zip as released)"}'
pl_finish
