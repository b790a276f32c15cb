#!/usr/bin/env bash
# Prepare IWSLT15 English-Vietnamese (TED) from the Stanford NLP release (Luong and
# Manning 2015), the standard set, and binarize it for En->Vi: train =
# train.{en,vi} (133,317 pairs), valid = tst2012 (1,553), test = tst2013 (1,268).
#
# The Stanford files (https://nlp.stanford.edu/projects/nmt/data/iwslt15.en-vi/)
# are already Moses-tokenized (escaped: &apos; &quot; ...) and cased; they are
# used as they are (no filtering), lowercased only with --lowercase.
#
# Vocabulary. Xu et al. 2019 state the split sizes above, but no source reachable
# when this was written says which vocabulary or BPE they used for En-Vi:
# lancopku/AdaNorm holds only De-En scripts, and the same group's En-Vi code of
# that year (lancopku/Explicit-Sparse-Transformer, t2t_envi_est.sh) used
# tensor2tensor's translate_envi_iwslt32k, a 32k subword vocabulary that
# fairseq-preprocess cannot reproduce. The default is therefore this project's
# choice, stated as such: a joint subword-nmt BPE of 8,000 merges on
# train.en + train.vi (the same tool and --remove-bpe as the IWSLT14 recipe).
# `--bpe none` keeps the Stanford words.
#
# Usage: scripts/prepare-iwslt15-envi.sh [options]
#   --archive PATH|URL  a folder holding train.en train.vi tst2012.en tst2012.vi
#                       tst2013.en tst2013.vi, or a tar archive holding them
#                       anywhere inside (env IWSLT15_ARCHIVE)
#   --url URL           base URL of the six files (env IWSLT15_URL; default the
#                       Stanford page above), or the URL of a tar archive of them
#   --sha256 HEX        expected sha256 of a tar --archive (env IWSLT15_SHA256)
#   --sha256-file FILE  expected checksums in sha256sum format, by file name (env
#                       IWSLT15_SHA256_FILE); without one, each file's first good
#                       copy is pinned in WORK/archives/NAME.sha256 (no public
#                       source gives their sha256)
#   --bpe TYPE          subword-nmt (default), sentencepiece, or none
#   --bpe-size N        subword-nmt merges (default 8000), or sentencepiece vocabulary
#   --lowercase         lowercase both sides
#   --skip-size-check   go on when the sizes are not the published ones
#   --work DIR          working folder (default data/iwslt15)
#   --dest DIR          binarized output (default data/data-bin/iwslt15.en-vi)
#   --workers N         processes (default: all cores)
#   --no-binarize       stop before fairseq-preprocess
#   --force             redo every step
#
# Steps: fetch (download each file, or --archive; each must be UTF-8 text, not an
# HTML page; sha256), extract (unpack or copy), text (assemble train/valid/test;
# characters that fairseq or subword-nmt would read as line breaks become spaces;
# optional lowercasing), (sizes: 133,317 / 1,553 / 1,268), bpe-learn, bpe, binarize
# (fairseq-preprocess --source-lang en --target-lang vi --joined-dictionary, plus
# prepare.json). Decode with `fairseq-generate ... --remove-bpe` ('@@ ').
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
