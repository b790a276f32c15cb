#!/usr/bin/env bash
# Prepare IWSLT14 German-English (TED) exactly as fairseq's classic recipe,
# facebookresearch/fairseq examples/translation/prepare-iwslt14.sh, and binarize it
# for De->En (the papers' data). tests/test_prepare.py checks the tokenized and BPE text
# byte for byte against that script's own output (tests/fixtures/iwslt14-golden/).
#
# Usage: scripts/prepare-iwslt14.sh [options]
#   --archive PATH|URL  the IWSLT14 archive de-en.tgz (folder de-en/ inside) to use
#                       instead of downloading it (env IWSLT14_ARCHIVE)
#   --url URL           where to download it (env IWSLT14_URL; default
#                       https://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz,
#                       the mirror fairseq's script uses; the original was
#                       https://wit3.fbk.eu/archive/2014-01/texts/de/en/de-en.tgz)
#   --sha256 HEX        expected sha256 of de-en.tgz (env IWSLT14_SHA256). No public
#                       source publishes one: without it, the first good copy's
#                       checksum is recorded in WORK/archives/de-en.tgz.sha256 and
#                       later copies must match it
#   --sha256-file FILE  expected checksums in sha256sum format (env IWSLT14_SHA256_FILE)
#   --bpe TYPE          subword-nmt (default, as fairseq's script), sentencepiece, none
#   --bpe-size N        subword-nmt merges (default 10000, as fairseq's script), or
#                       the sentencepiece vocabulary size
#   --skip-size-check   go on when train/valid/test are not the published
#                       160,239 / 7,283 / 6,750 pairs (a deliberate change, a test)
#   --work DIR          working folder (default data/iwslt14)
#   --dest DIR          binarized output (default data/data-bin/iwslt14.tokenized.de-en)
#   --workers N         processes (default: all cores)
#   --no-binarize       stop after BPE (text in WORK/bpe)
#   --force             redo every step
#   (--classic-clean is accepted and ignored: the classic cleaning is the only one.)
#
# Steps (each skipped when done before; see scripts/prepare_lib.sh), each the
# lines of fairseq's script named in brackets:
#   fetch      download (or take --archive); it must be a gzip'd tar that `tar -t`
#              reads to the end; check the sha256                        [wget]
#   extract    unpack                                                     [tar zxvf]
#   text       train: de-en/train.tags.de-en.{de,en} without the lines holding
#              <url>, <talkid> or <keywords>, the <title>/<description> tags
#              removed (every other line stays: <speaker>, <reviewer ...>, ...);
#              test: the '<seg id' lines of IWSLT14.TED.dev2010, TEDX.dev2012,
#              TED.tst2010, tst2011, tst2012 (that order), tags and the spaces
#              next to them removed, ’ -> '              [grep -v / sed, grep / sed]
#   tok        Moses tokenizer.perl -l de / -l en (mosesdecoder HEAD, as the
#              script clones it; ported in scripts/prepare_text.py) [tokenizer.perl]
#   split      clean-corpus-n.perl -ratio 1.5 1 175 on train; lowercase.perl;
#              valid = pairs 23, 46, 69, ... of train, train = the rest; test =
#              the five sets concatenated            [clean, lc, awk NR%23, cat]
#   (sizes)    train/valid/test against 160,239 / 7,283 / 6,750 pairs
#   bpe-learn  subword-nmt learn-bpe -s 10000 on train.de then train.en [learn_bpe.py]
#   bpe        subword-nmt apply-bpe to train/valid/test in both languages [apply_bpe.py]
#   binarize   fairseq-preprocess --source-lang de --target-lang en
#              --joined-dictionary, plus prepare.json (what was made: BPE type
#              and size, sizes, source checksums) and the BPE codes
#
# Decode with `fairseq-generate ... --remove-bpe` ('@@ '; prepare.json's remove_bpe);
# the output is then tokenized, lowercased text, scored as the papers did.
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
