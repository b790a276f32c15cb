#!/usr/bin/env bash
# Prepare IWSLT14 German-English (TED) as fairseq's classic recipe does
# (facebookresearch/fairseq examples/translation/prepare-iwslt14.sh), binarized for De->En.
# tests/test_prepare.py checks our text byte for byte against that script's own output
# (tests/fixtures/iwslt14-golden/); data/README.md describes the data.
#
# Usage: scripts/prepare-iwslt14.sh [options]; defaults: --archive/--url: de-en.tgz from
# https://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz (fairseq's mirror of
# wit3.fbk.eu; no public sha256: the first good copy's is pinned), --bpe subword-nmt
# --bpe-size 10000, --work data/iwslt14, --dest data/data-bin/iwslt14.tokenized.de-en,
# sizes 160,239 / 7,283 / 6,750 pairs. (--classic-clean is accepted and ignored.)
#
# Steps, each the lines of fairseq's script in brackets (skipped when done before):
#   fetch, extract  de-en.tgz, read by `tar -t` to the end, sha256         [wget, tar zxvf]
#   text       train.tags.de-en.*: lines with <url>, <talkid>, <keywords> dropped, the
#              <title>/<description> tags removed; test: the '<seg id' lines of TED.dev2010,
#              TEDX.dev2012, TED.tst2010-2012, tags removed, ’ -> '    [grep -v / sed, grep / sed]
#   tok        Moses tokenizer.perl -l de|en (ported in prepare_text.py) [tokenizer.perl]
#   split      clean-corpus-n.perl -ratio 1.5 1 175, lowercase.perl; valid = pairs 23, 46, ...
#              of train, train = the rest; test = the five sets     [clean, lc, awk NR%23, cat]
#   bpe-learn, bpe  subword-nmt learn-bpe on train.de then train.en, apply-bpe [learn/apply_bpe.py]
#   binarize   fairseq-preprocess --joined-dictionary, prepare.json, the BPE codes
# Decode with `fairseq-generate ... --remove-bpe` (tokenized, lowercased text).
set -euo pipefail
# shellcheck source=scripts/prepare_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/prepare_lib.sh"

PL_NAME=iwslt14
PL_ENV=IWSLT14
PL_DATASET=iwslt14.de-en
PL_DEFAULT_URL=https://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz
PL_DEST_NAME=iwslt14.tokenized.de-en
PL_BPE=subword-nmt
PL_BPE_SIZE=10000
PL_LOWERCASED=1
ARCHIVE_NAME=de-en.tgz
# fairseq's `cat` order for test.$l
TEST_SETS=(TED.dev2010 TEDX.dev2012 TED.tst2010 TED.tst2011 TED.tst2012)
# The published sizes of fairseq's recipe: the "| [de] ...: N sents" lines of
# fairseq-preprocess on its output (also the sizes of the Hugging Face copy
# bbaaaa/iwslt14-de-en-preprocess, made with that script).
SIZES=(train=160239 valid=7283 test=6750)

pl_script_option() {
    case $1 in
        --classic-clean) PL_SHIFT=1 ;;
        *) return 1 ;;
    esac
}

step_text() {
    local orig=$PL_WORK/extract/de-en l s xmls
    pl_require_files "$orig" train.tags.de-en.de train.tags.de-en.en
    for l in de en; do
        xmls=()
        for s in "${TEST_SETS[@]}"; do
            pl_require_files "$orig" "IWSLT14.$s.de-en.$l.xml"
            xmls+=("$orig/IWSLT14.$s.de-en.$l.xml")
        done
        pl_helper iwslt-train "$orig/train.tags.de-en.$l" "$STEP_OUT/train.$l"
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
    local tok=$PL_WORK/tok l s
    pl_helper clean-corpus "$tok/train.de" "$tok/train.en" "$STEP_OUT/clean.de" "$STEP_OUT/clean.en" \
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
pl_step fetch "$(pl_fetch_key)" pl_fetch_file "$ARCHIVE_NAME" "$PL_URL" tgz
pl_step extract "" pl_extract "$PL_WORK/fetch/$ARCHIVE_NAME"
pl_step text "" step_text
pl_step tok "" step_tok
pl_step split "" step_split
pl_check_sizes "$PL_WORK/split" de "${SIZES[@]}"
pl_bpe_and_binarize "$PL_WORK/split" de en \
    '{"recipe": "fairseq examples/translation/prepare-iwslt14.sh", "tokenizer": "moses tokenizer.perl (mosesdecoder HEAD 75d4c672e)"}'
pl_finish
