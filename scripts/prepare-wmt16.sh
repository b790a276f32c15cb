#!/usr/bin/env bash
# Prepare WMT16 English-German, the standard 4.5M-pair set, binarized for En->De: the set
# google/seq2seq's bin/data/wmt16_en_de.sh made in 2017 (its archive on Google Drive, used
# by fairseq's examples/scaling_nmt and the papers, is gone: fairseq #4192, #4454), rebuilt
# from the raw corpora step for step as that script (data/README.md):
#   train  Europarl v7 + Common Crawl + News Commentary v11, in that order, tokenized,
#          clean-corpus-n.perl 1..80 (ratio 9)
#   valid  newstest2013 (dev.tgz, plain text); test newstest2014 (dev.tgz's
#          newstest2014-deen-{src.de,ref.en}.sgm, input-from-sgm.perl); both tokenized
#   tokenizer.perl as mosesdecoder was in 2017, before 9fc964da7 (2018-11-07, "split final
#   dots unconditionally"); a joint subword-nmt BPE of 32,000 merges; cased
#
# Usage: scripts/prepare-wmt16.sh [options]; defaults: the release URLs (URLS here), --bpe-size
# 32000, --work data/wmt16, --dest data/data-bin/wmt16_en_de_bpe32k. Its own readings:
#   --archive DIR       a folder holding the four upstream files under their names
#   --archive FILE      Google's own wmt16_en_de.tar.gz, if you kept it: its BPE files are
#                       binarized as they are
#   --url URL           a mirror holding the four files; --sha256: of an --archive FILE
#
# Sources: statmt.org's de-en.tgz (Europarl v7), training-parallel-commoncrawl.tgz
# (918,311,367 bytes, sha256 c7a74e2e...), training-parallel-nc-v11.tgz (75,178,032 bytes,
# cfe8ab04...; both as tensorflow/datasets lists them, enforced) and dev.tgz; no public
# checksum of de-en.tgz or dev.tgz (the first good copy is pinned). Our newstest2014.de must
# have the md5 NVIDIA/DeepLearningExamples publishes (GNMT scripts/verify_dataset.sh).
# Sizes: 3,000 / 3,003 for valid / test; train "about 4.5M" (no exact count is published:
# checked as 4.4M-4.6M).
#
# Steps: fetch, extract, text, tok, clean, sizes, bpe-learn, bpe, binarize
# (fairseq-preprocess --joined-dictionary --nwordssrc 32768 --nwordstgt 32768, as
# examples/scaling_nmt). Google's archive: fetch, extract, text, sizes, binarize.
# Decode with `fairseq-generate ... --remove-bpe`.
set -euo pipefail
# shellcheck source=scripts/prepare_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/prepare_lib.sh"

PL_NAME=wmt16
PL_ENV=WMT16
PL_DATASET=wmt16.en-de
PL_DEFAULT_URL=
PL_DEST_NAME=wmt16_en_de_bpe32k
PL_BPE=subword-nmt
PL_BPE_SIZE=32000
PL_LOWERCASED=0
declare -A URLS=(
    [de-en.tgz]=https://www.statmt.org/europarl/v7/de-en.tgz
    [training-parallel-commoncrawl.tgz]=https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz
    [training-parallel-nc-v11.tgz]=https://data.statmt.org/wmt16/translation-task/training-parallel-nc-v11.tgz
    [dev.tgz]=https://data.statmt.org/wmt16/translation-task/dev.tgz
)
SOURCES=(de-en.tgz training-parallel-commoncrawl.tgz training-parallel-nc-v11.tgz dev.tgz)
# tensorflow/datasets, tensorflow_datasets/url_checksums/wmt16_translate.txt
PL_KNOWN_SHA256[training-parallel-commoncrawl.tgz]=c7a74e2ea01ac6c920123108627e35278d4ccb5701e15428ffa34de86fa3a9e5
PL_KNOWN_BYTES[training-parallel-commoncrawl.tgz]=918311367
PL_KNOWN_SHA256[training-parallel-nc-v11.tgz]=cfe8ab047e05043476e498ee765c98e939c7b7d6d294e856344c84476b619d6a
PL_KNOWN_BYTES[training-parallel-nc-v11.tgz]=75178032
# NVIDIA/DeepLearningExamples PyTorch/Translation/GNMT/scripts/verify_dataset.sh:
# md5 of newstest2014.de as input-from-sgm.perl writes it
NEWSTEST2014_DE_MD5=f6c3818b477e4a25cad68b61cc883c17
SIZES=(train=4400000-4600000 valid=3000 test=3003)
GOOGLE_ARCHIVE=wmt16_en_de.tar.gz
# train corpora inside their archives, in google/seq2seq's `cat` order
TRAIN_PARTS=(europarl/europarl-v7.de-en commoncrawl/commoncrawl.de-en
             nc-v11/training-parallel-nc-v11/news-commentary-v11.de-en)

step_fetch() {
    local f url
    if [ "$MODE" = google ]; then
        pl_fetch_file "$GOOGLE_ARCHIVE" "$PL_URL" tgz
        return
    fi
    for f in "${SOURCES[@]}"; do
        if [ -n "$PL_URL" ]; then url=${PL_URL%/}/$f; else url=${URLS[$f]}; fi
        pl_fetch_file "$f" "$url" tgz
    done
}

step_extract() {
    if [ "$MODE" = google ]; then
        pl_extract "$PL_WORK/fetch/$GOOGLE_ARCHIVE"
        return
    fi
    pl_extract "$PL_WORK/fetch/de-en.tgz" europarl
    pl_extract "$PL_WORK/fetch/training-parallel-commoncrawl.tgz" commoncrawl
    pl_extract "$PL_WORK/fetch/training-parallel-nc-v11.tgz" nc-v11
    pl_extract "$PL_WORK/fetch/dev.tgz" dev
}

step_text_google() {
    local root=$PL_WORK/extract dir sfx_train sfx_test l s
    if [ "$PL_BPE" = subword-nmt ]; then
        sfx_train=tok.clean.bpe.32000; sfx_test=tok.bpe.32000
    else
        sfx_train=tok.clean; sfx_test=tok
    fi
    dir=$(pl_find_dir "$root" "train.$sfx_train.en") \
        || pl_die "train.$sfx_train.en is not in the archive $PL_ARCHIVE: is it Google's wmt16_en_de.tar.gz? (a folder of the raw corpora is passed as --archive DIR)"
    pl_require_files "$dir" "train.$sfx_train.de" \
        "newstest2013.$sfx_test.en" "newstest2013.$sfx_test.de" \
        "newstest2014.$sfx_test.en" "newstest2014.$sfx_test.de"
    for l in en de; do
        pl_link "$dir/train.$sfx_train.$l" "$STEP_OUT/train.$l"
        pl_link "$dir/newstest2013.$sfx_test.$l" "$STEP_OUT/valid.$l"
        pl_link "$dir/newstest2014.$sfx_test.$l" "$STEP_OUT/test.$l"
    done
    if [ -f "$dir/bpe.32000" ]; then cp -- "$dir/bpe.32000" "$STEP_OUT/code"; fi
    for s in train valid test; do pl_check_aligned "$STEP_OUT/$s.en" "$STEP_OUT/$s.de"; done
}

step_text() {
    local root=$PL_WORK/extract dev p l s
    for p in "${TRAIN_PARTS[@]}"; do pl_require_files "$root" "$p.en" "$p.de"; done
    dev=$(pl_find_dir "$root/dev" newstest2014-deen-src.de.sgm) \
        || pl_die "newstest2014-deen-src.de.sgm is not in dev.tgz: is it WMT16's dev.tgz?"
    pl_require_files "$dev" newstest2014-deen-ref.en.sgm newstest2013.en newstest2013.de
    for l in en de; do
        (cd "$root" && cat "${TRAIN_PARTS[0]}.$l" "${TRAIN_PARTS[1]}.$l" "${TRAIN_PARTS[2]}.$l") >"$STEP_OUT/train.$l"
        pl_link "$dev/newstest2013.$l" "$STEP_OUT/valid.$l"
    done
    pl_helper sgm-text "$dev/newstest2014-deen-src.de.sgm" "$STEP_OUT/test.de"
    pl_helper sgm-text "$dev/newstest2014-deen-ref.en.sgm" "$STEP_OUT/test.en"
    for s in train valid test; do pl_check_aligned "$STEP_OUT/$s.en" "$STEP_OUT/$s.de"; done
}

# Like the sizes, checked on every run: is our newstest2014.de the standard one?
check_newstest2014() {
    local md5
    md5=$(md5sum <"$PL_WORK/text/test.de" | cut -d' ' -f1)
    if [ "$md5" = "$NEWSTEST2014_DE_MD5" ]; then
        pl_log "newstest2014.de has the standard md5 ($md5)"
    elif [ "$PL_SKIP_SIZE_CHECK" = 1 ]; then
        pl_log "newstest2014.de has md5 $md5, the standard one $NEWSTEST2014_DE_MD5; going on (--skip-size-check)"
    else
        pl_die "newstest2014.de (from dev.tgz's newstest2014-deen-src.de.sgm) has md5 $md5, the standard one $NEWSTEST2014_DE_MD5 (NVIDIA/DeepLearningExamples GNMT verify_dataset.sh): dev.tgz is another version; pass --skip-size-check to accept it"
    fi
}

step_tok() {
    local s l
    for l in en de; do
        local args=()
        for s in train valid test; do args+=("$PL_WORK/text/$s.$l" "$STEP_OUT/$s.$l"); done
        pl_helper tokenize --lang "$l" --moses 2017 "${args[@]}"
    done
}

step_clean() {
    local tok=$PL_WORK/tok
    pl_helper clean-corpus "$tok/train.de" "$tok/train.en" "$STEP_OUT/train.de" "$STEP_OUT/train.en" \
        --min 1 --max 80
    pl_link "$tok/valid.en" "$STEP_OUT/valid.en"; pl_link "$tok/valid.de" "$STEP_OUT/valid.de"
    pl_link "$tok/test.en" "$STEP_OUT/test.en"; pl_link "$tok/test.de" "$STEP_OUT/test.de"
}

pl_parse_args "$@"
MODE=raw  # google: Google's preprocessed archive (an --archive FILE, or its URL)
if { [ -n "$PL_ARCHIVE" ] && [ ! -d "$PL_ARCHIVE" ]; } || [ "$(basename "${PL_URL:-x}")" = "$GOOGLE_ARCHIVE" ]; then
    MODE=google
fi
if [ "$MODE" = raw ] && [ -n "$PL_SHA256" ]; then
    pl_die "--sha256 checks an --archive FILE; for the four upstream files use --sha256-file FILE"
fi
if [ "$MODE" = google ] && [ "$PL_BPE" = subword-nmt ] && [ "$PL_BPE_SIZE" != 32000 ]; then
    pl_die "Google's archive holds a BPE of 32000 merges, not --bpe-size $PL_BPE_SIZE; learn another from the raw corpora (--archive DIR or the default download)"
fi
if [ "$PL_BPE" = none ]; then pl_die "--bpe none: WMT16 is used with a subword vocabulary (subword-nmt)"; fi
PREPROCESS_ARGS=(--nwordssrc 32768 --nwordstgt 32768)
[ "$PL_BPE" = subword-nmt ] || PREPROCESS_ARGS=()
EXTRA='{"recipe": "google/seq2seq bin/data/wmt16_en_de.sh", "tokenizer": "moses tokenizer.perl as of 2017 (before mosesdecoder 9fc964da7)", "from": "'$MODE'"}'

pl_begin
pl_step fetch "$(pl_fetch_key) mode=$MODE" step_fetch
pl_step extract "" step_extract
if [ "$MODE" = google ]; then
    pl_step text "bpe=$PL_BPE" step_text_google
    pl_check_sizes "$PL_WORK/text" en "${SIZES[@]}"
    # with subword-nmt, the archive's text is BPE'd already (its bpe.32000)
    if [ "$PL_BPE" = subword-nmt ]; then PL_BPE_APPLIED=1; fi
    pl_bpe_and_binarize "$PL_WORK/text" en de "$EXTRA" "${PREPROCESS_ARGS[@]}"
else
    pl_step text "" step_text
    check_newstest2014
    pl_step tok "" step_tok
    pl_step clean "" step_clean
    pl_check_sizes "$PL_WORK/clean" en "${SIZES[@]}"
    pl_bpe_and_binarize "$PL_WORK/clean" en de "$EXTRA" "${PREPROCESS_ARGS[@]}"
fi
pl_finish
