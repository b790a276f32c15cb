#!/usr/bin/env bash
# Prepare IWSLT15 English-Vietnamese (TED) from the Stanford NLP release (Luong and Manning
# 2015), binarized for En->Vi: train = train.{en,vi}, valid = tst2012, test = tst2013
# (133,317 / 1,553 / 1,268 pairs), Moses-tokenized and cased as released, used as they are.
# The default BPE (joint subword-nmt, 8,000 merges) is our choice: no source states the
# En-Vi vocabulary of Xu et al. 2019 (data/README.md).
#
# Usage: scripts/prepare-iwslt15-envi.sh [options]; defaults: --url
# https://nlp.stanford.edu/projects/nmt/data/iwslt15.en-vi (the six files, or the URL of a
# tar of them); --archive: a folder holding train.en train.vi tst2012.en tst2012.vi
# tst2013.en tst2013.vi, or a tar archive holding them; --sha256: of a tar --archive (no
# public sha256 of the files: each first good copy is pinned); --bpe-size 8000; --work
# data/iwslt15; --dest data/data-bin/iwslt15.en-vi. Its own option:
#   --lowercase         lowercase both sides
#
# Steps: fetch (each file UTF-8 text, sha256), extract, text (characters that fairseq or
# subword-nmt would read as line breaks become spaces; --lowercase), sizes, bpe-learn,
# bpe, binarize. Decode with `fairseq-generate ... --remove-bpe`.
set -euo pipefail
# shellcheck source=scripts/prepare_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/prepare_lib.sh"

PL_NAME=iwslt15
PL_ENV=IWSLT15
PL_DATASET=iwslt15.en-vi
PL_DEFAULT_URL=https://nlp.stanford.edu/projects/nmt/data/iwslt15.en-vi
PL_DEST_NAME=iwslt15.en-vi
PL_BPE=subword-nmt
PL_BPE_SIZE=8000
PL_LOWERCASED=0
FILES=(train.en train.vi tst2012.en tst2012.vi tst2013.en tst2013.vi)
TARBALL=iwslt15-en-vi.tar
# The Stanford release's line counts (also those Xu et al. 2019 report)
SIZES=(train=133317 valid=1553 test=1268)

pl_script_option() {
    case $1 in
        --lowercase) PL_LOWERCASED=1; PL_SHIFT=1 ;;
        *) return 1 ;;
    esac
}

step_fetch() {
    local f
    if [ -n "$PL_ARCHIVE" ] && [ ! -d "$PL_ARCHIVE" ]; then
        pl_fetch_file "$TARBALL" "" tar
    elif [ -z "$PL_ARCHIVE" ] && [[ $PL_URL =~ \.(tgz|tar|tar\.gz|tar\.xz|tar\.bz2)$ ]]; then
        pl_fetch_file "$TARBALL" "$PL_URL" tar  # a URL of a tar archive
    else
        for f in "${FILES[@]}"; do pl_fetch_file "$f" "${PL_URL%/}/$f" text; done
    fi
}

step_extract() {
    local dir f why
    if [ -e "$PL_WORK/fetch/$TARBALL" ]; then
        pl_extract "$PL_WORK/fetch/$TARBALL" unpacked
        dir=$(pl_find_dir "$STEP_OUT/unpacked" train.en) \
            || pl_die "train.en is not in $PL_ARCHIVE; pass --archive with the Stanford IWSLT15 en-vi files"
        pl_require_files "$dir" "${FILES[@]}"
        for f in "${FILES[@]}"; do
            why=$(pl_helper check-kind "$dir/$f" text) || pl_die "$f in $PL_ARCHIVE $why"
            mv -- "$dir/$f" "$STEP_OUT/$f"
        done
        rm -rf "$STEP_OUT/unpacked"
    else
        for f in "${FILES[@]}"; do cp -L -- "$PL_WORK/fetch/$f" "$STEP_OUT/$f"; done
    fi
}

step_text() {
    local raw=$PL_WORK/extract l s args=()
    for l in en vi; do
        for s in train:train valid:tst2012 test:tst2013; do
            args+=("$raw/${s#*:}.$l" "$STEP_OUT/${s%%:*}.$l")
        done
    done
    pl_helper sanitize-breaks "${args[@]}"
    if [ "$PL_LOWERCASED" = 1 ]; then
        for s in train valid test; do
            for l in en vi; do
                pl_helper lowercase "$STEP_OUT/$s.$l" "$STEP_OUT/$s.$l.lc"
                mv -- "$STEP_OUT/$s.$l.lc" "$STEP_OUT/$s.$l"
            done
        done
    fi
    for s in train valid test; do pl_check_aligned "$STEP_OUT/$s.en" "$STEP_OUT/$s.vi"; done
}

pl_parse_args "$@"
if [ -n "$PL_SHA256" ] && { [ -z "$PL_ARCHIVE" ] || [ -d "$PL_ARCHIVE" ]; }; then
    pl_die "--sha256 checks a tar --archive; for the six separate files use --sha256-file FILE"
fi
pl_begin
pl_step fetch "$(pl_fetch_key)" step_fetch
pl_step extract "" step_extract
pl_step text "lowercase=$PL_LOWERCASED" step_text
pl_check_sizes "$PL_WORK/text" en "${SIZES[@]}"
pl_bpe_and_binarize "$PL_WORK/text" en vi \
    '{"recipe": "Stanford NMT iwslt15.en-vi files as released", "bpe_note": "the default BPE is this project'"'"'s choice: no source states the En-Vi vocabulary of Xu et al. 2019"}'
pl_finish
