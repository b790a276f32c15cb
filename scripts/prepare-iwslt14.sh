#!/usr/bin/env bash
# Prepare IWSLT14 German-English (TED) as in fairseq's classic prepare-iwslt14.sh,
# with a sentencepiece BPE, and binarize it for De->En (SPEC §4).
#
# Usage: scripts/prepare-iwslt14.sh [options]
#   --archive PATH|URL  the IWSLT14 archive de-en.tgz (folder de-en/ inside) to use
#                       instead of downloading it (env IWSLT14_ARCHIVE)
#   --url URL           where to download it (env IWSLT14_URL; default
#                       https://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz,
#                       the mirror fairseq's script uses; the original was
#                       https://wit3.fbk.eu/archive/2014-01/texts/de/en/de-en.tgz)
#   --sha256 HEX        expected sha256 of de-en.tgz (env IWSLT14_SHA256); without
#                       one, the first good copy's checksum is recorded in
#                       WORK/archives/de-en.tgz.sha256 and later copies must match it
#   --sha256-file FILE  expected checksums in sha256sum format (env IWSLT14_SHA256_FILE)
#   --bpe-size N        joint BPE vocabulary (default 10000; 0: no BPE, words)
#   --classic-clean     drop only <url>/<talkid>/<keywords> lines from the training
#                       text, exactly like the classic script (default: drop every
#                       metadata tag line: <speaker>, <reviewer>, <translator>, <doc ...)
#   --work DIR          working folder (default data/iwslt14)
#   --dest DIR          binarized output (default data/data-bin/iwslt14.tokenized.de-en)
#   --workers N         processes (default: all cores)
#   --no-binarize       stop after BPE (text in WORK/bpe)
#   --force             redo every step
#
# Steps (each skipped when done before; see scripts/prepare_lib.sh):
#   fetch     download (or take --archive), test it with tar, check the sha256
#   extract   unpack
#   text      training text from de-en/train.tags.de-en.{de,en}: tag lines dropped,
#             <title>/<description> tags stripped; test text from the <seg id="N">
#             elements of IWSLT14.TED.dev2010, IWSLT14.TEDX.dev2012,
#             IWSLT14.TED.tst2010, tst2011, tst2012 (in that order, ’ -> ')
#   tok       Moses tokenizer (sacremoses, default escaping), -l de / -l en
#   split     drop training pairs with a side longer than 175 tokens or a length
#             ratio over 1.5; lowercase; valid = every 23rd training pair, train =
#             the rest; test = the five sets above, concatenated
#   spm       joint sentencepiece BPE (model_type=bpe) on train.de + train.en
#   bpe       apply it to train/valid/test
#   binarize  fairseq-preprocess --source-lang de --target-lang en --joined-dictionary
#
# Decode with `fairseq-generate ... --remove-bpe sentencepiece`; the output is then
# tokenized, lowercased text, scored as the papers did (SPEC §4).
set -euo pipefail
# shellcheck source=scripts/prepare_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/prepare_lib.sh"

PL_NAME=iwslt14
PL_ENV=IWSLT14
PL_DEFAULT_URL=https://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz
PL_DEST_NAME=iwslt14.tokenized.de-en
PL_BPE_SIZE=10000
ARCHIVE_NAME=de-en.tgz
TEST_SETS=(TED.dev2010 TEDX.dev2012 TED.tst2010 TED.tst2011 TED.tst2012)
CLASSIC=0

pl_script_option() {
    case $1 in
        --classic-clean) CLASSIC=1; PL_SHIFT=1 ;;
        *) return 1 ;;
    esac
}

step_text() {
    local orig=$PL_WORK/extract/de-en l s xmls classic=()
    pl_require_files "$orig" train.tags.de-en.de train.tags.de-en.en
    if [ "$CLASSIC" = 1 ]; then classic=(--classic); fi
    for l in de en; do
        xmls=()
        for s in "${TEST_SETS[@]}"; do
            pl_require_files "$orig" "IWSLT14.$s.de-en.$l.xml"
            xmls+=("$orig/IWSLT14.$s.de-en.$l.xml")
        done
        pl_helper iwslt-train "$orig/train.tags.de-en.$l" "$STEP_OUT/train.$l" "${classic[@]}"
        pl_helper iwslt-xml "$STEP_OUT/test.$l" "${xmls[@]}"
    done
    pl_check_aligned "$STEP_OUT/train.de" "$STEP_OUT/train.en"
    pl_check_aligned "$STEP_OUT/test.de" "$STEP_OUT/test.en"
}

step_tok() {
    local l
    for l in de en; do
        pl_helper tokenize --lang "$l" \
            "$PL_WORK/text/train.$l" "$STEP_OUT/train.$l" "$PL_WORK/text/test.$l" "$STEP_OUT/test.$l"
    done
}

step_split() {
    local tok=$PL_WORK/tok l
    pl_helper filter-pairs "$tok/train.de" "$tok/train.en" "$STEP_OUT/clean.de" "$STEP_OUT/clean.en" \
        --min 1 --max 175 --ratio 1.5
    for l in de en; do
        pl_helper lowercase "$STEP_OUT/clean.$l" "$STEP_OUT/clean.lc.$l" "$tok/test.$l" "$STEP_OUT/test.$l"
        pl_helper split-every 23 "$STEP_OUT/clean.lc.$l" "$STEP_OUT/train.$l" "$STEP_OUT/valid.$l"
        rm -f "$STEP_OUT/clean.$l" "$STEP_OUT/clean.lc.$l"
    done
    for s in train valid test; do pl_check_aligned "$STEP_OUT/$s.de" "$STEP_OUT/$s.en"; done
    pl_log "split: $(wc -l <"$STEP_OUT/train.de") train, $(wc -l <"$STEP_OUT/valid.de") valid, $(wc -l <"$STEP_OUT/test.de") test pairs"
}

pl_parse_args "$@"
pl_begin
pl_step fetch "$(pl_fetch_key)" pl_fetch_file "$ARCHIVE_NAME" "$PL_URL" tar
pl_step extract "" pl_extract "$PL_WORK/fetch/$ARCHIVE_NAME"
pl_step text "classic=$CLASSIC" step_text
pl_step tok "" step_tok
pl_step split "" step_split
pl_bpe_and_binarize "$PL_WORK/split" de en
pl_finish
