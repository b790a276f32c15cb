#!/usr/bin/env bash
# Prepare IWSLT15 English-Vietnamese (TED) from the Stanford NLP release and
# binarize it for En->Vi: train = train.{en,vi} (133,317 pairs), valid =
# tst2012 (1,553), test = tst2013 (1,268).
#
# The Stanford files (https://nlp.stanford.edu/projects/nmt/data/iwslt15.en-vi/)
# are already Moses-tokenized (escaped: &apos; &quot; ...) and cased; they are
# used as they are (no filtering), lowercased only with --lowercase.
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
#                       copy is pinned in WORK/archives/NAME.sha256
#   --bpe-size N        joint sentencepiece BPE vocabulary (default 8000; 0: keep
#                       the Stanford words as they are)
#   --lowercase         lowercase both sides
#   --work DIR          working folder (default data/iwslt15)
#   --dest DIR          binarized output (default data/data-bin/iwslt15.en-vi)
#   --workers N         processes (default: all cores)
#   --no-binarize       stop before fairseq-preprocess
#   --force             redo every step
#
# Steps: fetch (download each file, or --archive; sha256), extract (unpack or
# copy), text (assemble train/valid/test, optional lowercasing), [spm, bpe],
# binarize (fairseq-preprocess --source-lang en --target-lang vi --joined-dictionary).
set -euo pipefail
# shellcheck source=scripts/prepare_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/prepare_lib.sh"

PL_NAME=iwslt15
PL_ENV=IWSLT15
PL_DEFAULT_URL=https://nlp.stanford.edu/projects/nmt/data/iwslt15.en-vi
PL_DEST_NAME=iwslt15.en-vi
PL_BPE_SIZE=8000
FILES=(train.en train.vi tst2012.en tst2012.vi tst2013.en tst2013.vi)
TARBALL=iwslt15-en-vi.tar
LOWERCASE=0

pl_script_option() {
    case $1 in
        --lowercase) LOWERCASE=1; PL_SHIFT=1 ;;
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
    local dir f
    if [ -e "$PL_WORK/fetch/$TARBALL" ]; then
        mkdir "$STEP_OUT/unpacked"
        STEP_OUT=$STEP_OUT/unpacked pl_extract "$PL_WORK/fetch/$TARBALL"
        dir=$(pl_find_dir "$STEP_OUT/unpacked" train.en) \
            || pl_die "train.en is not in $PL_ARCHIVE; pass --archive with the Stanford IWSLT15 en-vi files"
        pl_require_files "$dir" "${FILES[@]}"
        for f in "${FILES[@]}"; do mv -- "$dir/$f" "$STEP_OUT/$f"; done
        rm -rf "$STEP_OUT/unpacked"
    else
        for f in "${FILES[@]}"; do cp -L -- "$PL_WORK/fetch/$f" "$STEP_OUT/$f"; done
    fi
}

step_text() {
    local raw=$PL_WORK/extract l s n want
    for l in en vi; do
        for s in train:train valid:tst2012 test:tst2013; do
            if [ "$LOWERCASE" = 1 ]; then
                pl_helper lowercase "$raw/${s#*:}.$l" "$STEP_OUT/${s%%:*}.$l"
            else
                cp -- "$raw/${s#*:}.$l" "$STEP_OUT/${s%%:*}.$l"
            fi
        done
    done
    for s in train:133317 valid:1553 test:1268; do
        pl_check_aligned "$STEP_OUT/${s%%:*}.en" "$STEP_OUT/${s%%:*}.vi"
        n=$(wc -l <"$STEP_OUT/${s%%:*}.en"); want=${s#*:}
        [ "$n" = "$want" ] || pl_log "note: ${s%%:*} has $n pairs, the Stanford release has $want"
    done
}

pl_parse_args "$@"
if [ -n "$PL_SHA256" ] && { [ -z "$PL_ARCHIVE" ] || [ -d "$PL_ARCHIVE" ]; }; then
    pl_die "--sha256 checks a tar --archive; for the six separate files use --sha256-file FILE"
fi
pl_begin
pl_step fetch "$(pl_fetch_key)" step_fetch
pl_step extract "" step_extract
pl_step text "lowercase=$LOWERCASE" step_text
pl_bpe_and_binarize "$PL_WORK/text" en vi
pl_finish
