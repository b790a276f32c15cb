#!/usr/bin/env bash
# Prepare WMT14 English-German as Shen et al. (PowerNorm, ICML 2020) prepared it, and
# binarize it for En->De: their release's trans-scripts/data-preprocessing/
# prepare-wmt14en2de.sh (sIncerass/powernorm@9ea6226), which is fairseq v0.6.0's
# examples/translation/prepare-wmt14en2de.sh run with --scaling18 (the data of Ott et al.
# 2018, "Scaling NMT"; fairseq PR #203: "final dataset is ~4.5M"). Step for step:
#   train  Europarl v7 + Common Crawl + News Commentary v12 (WMT17's), each file on its
#          own through Moses normalize-punctuation.perl L | remove-non-printing-char.perl |
#          tokenizer.perl -threads 8 -a -l L (-a: aggressive hyphen splitting, a-b ->
#          a @-@ b), appended in that order; then clean-corpus-n.perl 1 80 (its default
#          length ratio 9)
#   valid  newstest2013 (dev.tgz, plain text), through the same three scripts
#   test   newstest2014, the full 3,003-sentence set (test-full.tgz's
#          newstest2014-deen-src.en.sgm / -ref.de.sgm): the '<seg id' lines, tags and the
#          spaces next to them removed, ’ -> ' (grep | sed), then tokenizer.perl -a
#   BPE    a joint subword-nmt BPE of 32,764 merges learned on train.en then train.de,
#          applied to all three; cased text, no cleaning after BPE
# The Moses scripts are mosesdecoder HEAD's, as the release clones it (ported in
# scripts/prepare_text.py; tests/fixtures/wmt14-golden/ holds the release script's own
# output, which ours must match byte for byte). When the authors ran it is not known: a
# run before mosesdecoder f6d7adde1 (2019-11-25) wrote the quotes ‘ and ‚ as " instead
# of ' (normalize-punctuation.perl), one before 4da86c360 (2019-11-05) split 'Rs.' in
# English, and one before 9fc964da7 (2018-11-07) kept some sentence-final dots attached.
#
# Usage: scripts/prepare-wmt14.sh [options]
#   --archive DIR       a folder holding the five upstream files under their names
#                       (training-parallel-europarl-v7.tgz, training-parallel-commoncrawl.tgz,
#                       training-parallel-nc-v12.tgz, dev.tgz, test-full.tgz) instead of
#                       downloading (env WMT14_ARCHIVE)
#   --url URL           a mirror holding the five files under their names (env
#                       WMT14_URL); default: their release URLs (below)
#   --sha256-file FILE  expected checksums in sha256sum format, by file name
#   --bpe-size N        subword-nmt merges (default 32764, as released)
#   --skip-size-check   go on when the sizes differ from the published ones (below)
#   --work DIR          working folder (default data/wmt14)
#   --dest DIR          binarized output (default data/data-bin/wmt14_en_de_joined_dict,
#                       the release's name)
#   --workers N         processes (default: all cores)
#   --no-binarize       stop before fairseq-preprocess
#   --force             redo every step
#
# Sources (the release's URLs, over https) and what is known of them; the sizes and
# checksums below are tensorflow/datasets' (tensorflow_datasets/url_checksums/
# wmt14_translate.txt and wmt17_translate.txt), enforced here:
#   https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz    657,632,379 bytes
#   https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz    918,311,367 bytes
#   https://data.statmt.org/wmt17/translation-task/training-parallel-nc-v12.tgz
#                                                                     168,591,139 bytes
#   https://data.statmt.org/wmt17/translation-task/dev.tgz            newstest2013
#   https://www.statmt.org/wmt14/test-full.tgz                        newstest2014
# No public source found here gives a checksum of WMT17's dev.tgz or of test-full.tgz:
# the first good copy of each is pinned in WORK/archives/NAME.sha256 (pass
# --sha256-file to pin yours).
#
# Published sizes: newstest2013 3,000 and newstest2014 (full) 3,003 pairs (also the
# sizes of sacrebleu's wmt13 and wmt14/full test sets); train "~4.5M" pairs (fairseq PR
# #203, which made this recipe). No source found here gives the exact train count (the
# raw corpora hold about 4.59M pairs before cleaning), so train is checked against
# 4,400,000..4,600,000 only.
#
# Steps: fetch, extract (all five into one folder, as the release's orig/), text (the
# corpora linked; the test sets from .sgm), tok, clean, (sizes), bpe-learn, bpe,
# binarize (fairseq-preprocess --source-lang en --target-lang de --joined-dictionary,
# as the release's README, plus prepare.json).
# Decode with `fairseq-generate ... --remove-bpe` ('@@ ').
set -euo pipefail
# shellcheck source=scripts/prepare_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/prepare_lib.sh"

PL_NAME=wmt14
PL_ENV=WMT14
PL_DATASET=wmt14.en-de
PL_DEFAULT_URL=
PL_DEST_NAME=wmt14_en_de_joined_dict
PL_BPE=subword-nmt
PL_BPE_SIZE=32764
PL_LOWERCASED=0
declare -A URLS=(
    [training-parallel-europarl-v7.tgz]=https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz
    [training-parallel-commoncrawl.tgz]=https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz
    [training-parallel-nc-v12.tgz]=https://data.statmt.org/wmt17/translation-task/training-parallel-nc-v12.tgz
    [dev.tgz]=https://data.statmt.org/wmt17/translation-task/dev.tgz
    [test-full.tgz]=https://www.statmt.org/wmt14/test-full.tgz
)
SOURCES=(training-parallel-europarl-v7.tgz training-parallel-commoncrawl.tgz training-parallel-nc-v12.tgz
         dev.tgz test-full.tgz)
# tensorflow/datasets, tensorflow_datasets/url_checksums/wmt14_translate.txt, wmt17_translate.txt
PL_KNOWN_SHA256[training-parallel-europarl-v7.tgz]=0224c7c710c8a063dfd893b0cc0830202d61f4c75c17eb8e31836103d27d96e7
PL_KNOWN_BYTES[training-parallel-europarl-v7.tgz]=657632379
PL_KNOWN_SHA256[training-parallel-commoncrawl.tgz]=c7a74e2ea01ac6c920123108627e35278d4ccb5701e15428ffa34de86fa3a9e5
PL_KNOWN_BYTES[training-parallel-commoncrawl.tgz]=918311367
PL_KNOWN_SHA256[training-parallel-nc-v12.tgz]=2b45f30ef1d550d302fd17dd3a5cbe19134ccc4c2cf50c2dae534aee600101a2
PL_KNOWN_BYTES[training-parallel-nc-v12.tgz]=168591139
SIZES=(train=4400000-4600000 valid=3000 test=3003)
# the release's CORPORA, in its order (paths inside the extracted archives)
TRAIN_PARTS=(training/europarl-v7.de-en commoncrawl.de-en training/news-commentary-v12.de-en)

step_fetch() {
    local f url
    for f in "${SOURCES[@]}"; do
        if [ -n "$PL_URL" ]; then url=${PL_URL%/}/$f; else url=${URLS[$f]}; fi
        pl_fetch_file "$f" "$url" tgz
    done
}

step_extract() {
    local f
    for f in "${SOURCES[@]}"; do pl_extract "$PL_WORK/fetch/$f"; done
}

step_text() {
    local root=$PL_WORK/extract p k=0 l
    for p in "${TRAIN_PARTS[@]}"; do
        pl_require_files "$root" "$p.en" "$p.de"
        pl_check_aligned "$root/$p.en" "$root/$p.de"
        for l in en de; do pl_link "$root/$p.$l" "$STEP_OUT/train.part$k.$l"; done
        k=$((k + 1))
    done
    pl_require_files "$root" dev/newstest2013.en dev/newstest2013.de \
        test-full/newstest2014-deen-src.en.sgm test-full/newstest2014-deen-ref.de.sgm
    for l in en de; do pl_link "$root/dev/newstest2013.$l" "$STEP_OUT/valid.$l"; done
    pl_check_aligned "$STEP_OUT/valid.en" "$STEP_OUT/valid.de"
    pl_helper iwslt-xml "$STEP_OUT/test.en" "$root/test-full/newstest2014-deen-src.en.sgm"
    pl_helper iwslt-xml "$STEP_OUT/test.de" "$root/test-full/newstest2014-deen-ref.de.sgm"
    pl_check_aligned "$STEP_OUT/test.en" "$STEP_OUT/test.de"
}

step_tok() {
    local text=$PL_WORK/text k l args
    for l in en de; do
        args=()
        for k in "${!TRAIN_PARTS[@]}"; do args+=("$text/train.part$k.$l" "$STEP_OUT/train.part$k.$l"); done
        pl_helper tokenize --lang "$l" -a --normalize-punctuation --remove-non-printing \
            "${args[@]}" "$text/valid.$l" "$STEP_OUT/valid.$l"
        for k in "${!TRAIN_PARTS[@]}"; do cat "$STEP_OUT/train.part$k.$l"; done >"$STEP_OUT/train.$l"
        for k in "${!TRAIN_PARTS[@]}"; do rm -f "$STEP_OUT/train.part$k.$l"; done
        pl_helper tokenize --lang "$l" -a "$text/test.$l" "$STEP_OUT/test.$l"
    done
    pl_check_aligned "$STEP_OUT/train.en" "$STEP_OUT/train.de"
}

step_clean() {
    local tok=$PL_WORK/tok s l
    pl_helper clean-corpus "$tok/train.en" "$tok/train.de" "$STEP_OUT/train.en" "$STEP_OUT/train.de" \
        --min 1 --max 80
    for s in valid test; do
        for l in en de; do pl_link "$tok/$s.$l" "$STEP_OUT/$s.$l"; done
    done
}

pl_parse_args "$@"
if [ -n "$PL_ARCHIVE" ] && [ ! -d "$PL_ARCHIVE" ]; then
    pl_die "--archive must be a folder holding the five upstream files (${SOURCES[*]}), got the file $PL_ARCHIVE"
fi
if [ -n "$PL_SHA256" ]; then
    pl_die "--sha256 checks one archive; for the five upstream files use --sha256-file FILE"
fi
if [ "$PL_BPE" = none ]; then pl_die "--bpe none: WMT14 is used with a subword vocabulary (subword-nmt)"; fi
EXTRA='{"recipe": "sIncerass/powernorm trans-scripts/data-preprocessing/prepare-wmt14en2de.sh (fairseq v0.6.0 prepare-wmt14en2de.sh --scaling18)", "tokenizer": "moses normalize-punctuation.perl, remove-non-printing-char.perl, tokenizer.perl -a (mosesdecoder HEAD 34452895f)"}'

pl_begin
pl_step fetch "$(pl_fetch_key)" step_fetch
pl_step extract "" step_extract
pl_step text "" step_text
pl_step tok "" step_tok
pl_step clean "" step_clean
pl_check_sizes "$PL_WORK/clean" en "${SIZES[@]}"
pl_bpe_and_binarize "$PL_WORK/clean" en de "$EXTRA"
pl_finish
