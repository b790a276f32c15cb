#!/usr/bin/env bash
# Prepare WMT16 English-German (the standard 4.5M-pair set) and binarize it for
# En->De: train = WMT16 training data, valid = newstest2013, test = newstest2014.
#
# Input: Google's preprocessed archive wmt16_en_de.tar.gz (made by google/seq2seq's
# bin/data/wmt16_en_de.sh; fairseq's "scaling NMT" recipe uses it). It holds, flat:
#   train.{en,de}                   raw Europarl v7 + Common Crawl + News Commentary v11
#   train.tok.clean.{en,de}         Moses-tokenized, pairs of 1..80 tokens (~4.5M)
#   train.tok.clean.bpe.32000.{en,de}  the same with Google's joint BPE, 32k merges
#   newstest20XX.{,tok.,tok.bpe.32000.}{en,de}, bpe.32000, vocab.bpe.32000
#
# Usage: scripts/prepare-wmt16.sh [options]
#   --archive PATH|URL  wmt16_en_de.tar.gz to use instead of downloading it
#                       (env WMT16_ARCHIVE). It lives on Google Drive
#                       (https://drive.google.com/uc?export=download&id=0B_bZck-ksdkpM25jRUN2X2UxMm8),
#                       which answers large downloads with a confirmation page:
#                       fetch it in a browser (or with gdown) and pass --archive.
#   --url URL           download URL (env WMT16_URL; default the Drive link above)
#   --sha256 HEX        expected sha256 (env WMT16_SHA256); without one the first
#                       good copy's checksum is pinned in WORK/archives/
#   --sha256-file FILE  expected checksums in sha256sum format (env WMT16_SHA256_FILE)
#   --bpe google|spm    google (default): binarize the archive's own BPE files
#                       (train.tok.clean.bpe.32000, newstest2013/2014.tok.bpe.32000),
#                       joint dictionary capped at 32768 as in fairseq's recipe;
#                       decode with --remove-bpe (subword-nmt "@@ ").
#                       spm: learn a joint sentencepiece BPE of --bpe-size (default
#                       32000) on train.tok.clean.{en,de}, apply it to those and to
#                       newstest2013/2014.tok; decode with --remove-bpe sentencepiece.
#                       Either way the text is cased, tokenized as Google's script did.
#   --bpe-size N        sentencepiece vocabulary for --bpe spm (default 32000)
#   --work DIR          working folder (default data/wmt16)
#   --dest DIR          binarized output (default data/data-bin/wmt16_en_de_bpe32k)
#   --workers N         processes (default: all cores)
#   --no-binarize       stop before fairseq-preprocess
#   --force             redo every step
#
# Steps: fetch (download or --archive, tar test, sha256), extract, text (pick the
# files for the chosen --bpe), [spm, bpe], binarize
# (fairseq-preprocess --source-lang en --target-lang de --joined-dictionary).
set -euo pipefail
# shellcheck source=scripts/prepare_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/prepare_lib.sh"

PL_NAME=wmt16
PL_ENV=WMT16
PL_DEFAULT_URL='https://drive.google.com/uc?export=download&id=0B_bZck-ksdkpM25jRUN2X2UxMm8'
PL_DEST_NAME=wmt16_en_de_bpe32k
PL_BPE_SIZE=32000
ARCHIVE_NAME=wmt16_en_de.tar.gz
MODE=google

pl_script_option() {
    case $1 in
        --bpe)
            [ $# -ge 2 ] || pl_die "--bpe needs google or spm"
            MODE=$2; PL_SHIFT=2 ;;
        *) return 1 ;;
    esac
}

step_text() {
    local root=$PL_WORK/extract dir suffix_train suffix_test s l
    if [ "$MODE" = google ]; then
        suffix_train=tok.clean.bpe.32000; suffix_test=tok.bpe.32000
    else
        suffix_train=tok.clean; suffix_test=tok
    fi
    dir=$(pl_find_dir "$root" "train.$suffix_train.en") \
        || pl_die "train.$suffix_train.en is not in the archive ${PL_ARCHIVE:-$PL_URL}: is it Google's wmt16_en_de.tar.gz? pass --archive PATH to it"
    pl_require_files "$dir" "train.$suffix_train.de" \
        "newstest2013.$suffix_test.en" "newstest2013.$suffix_test.de" \
        "newstest2014.$suffix_test.en" "newstest2014.$suffix_test.de"
    for l in en de; do
        pl_link "$dir/train.$suffix_train.$l" "$STEP_OUT/train.$l"
        pl_link "$dir/newstest2013.$suffix_test.$l" "$STEP_OUT/valid.$l"
        pl_link "$dir/newstest2014.$suffix_test.$l" "$STEP_OUT/test.$l"
    done
    for s in train valid test; do pl_check_aligned "$STEP_OUT/$s.en" "$STEP_OUT/$s.de"; done
    pl_log "text: $(wc -l <"$STEP_OUT/train.en") train, $(wc -l <"$STEP_OUT/valid.en") valid (newstest2013), $(wc -l <"$STEP_OUT/test.en") test (newstest2014) pairs"
}

pl_parse_args "$@"
case $MODE in
    google) PL_BPE_SIZE=0; PREPROCESS_ARGS=(--nwordssrc 32768 --nwordstgt 32768) ;;
    spm) PREPROCESS_ARGS=(); [ "$PL_BPE_SIZE" -gt 0 ] || pl_die "--bpe spm needs --bpe-size > 0" ;;
    *) pl_die "--bpe must be google or spm, got '$MODE'" ;;
esac
pl_begin
pl_step fetch "$(pl_fetch_key)" pl_fetch_file "$ARCHIVE_NAME" "$PL_URL" tar
pl_step extract "" pl_extract "$PL_WORK/fetch/$ARCHIVE_NAME"
pl_step text "bpe=$MODE" step_text
pl_bpe_and_binarize "$PL_WORK/text" en de "${PREPROCESS_ARGS[@]}"
pl_finish
