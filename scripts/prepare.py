"""`python scripts/prepare.py DATASET [options]` (scripts/prepare-DATASET.sh): a corpus of the papers made as the
upstream script made it, binarized for fairseq (data/README.md). One function a dataset lists its steps in order; they
are in fetch.py, corpus_formats.py (the released formats), moses.py (mosesdecoder's perl scripts) and steps.py.
`python scripts/prepare.py text [options]` (scripts/prepare-text.sh): a researcher's own raw parallel text, the steps
in own_corpus.py.
"""
import argparse
import collections
import inspect
import json
import os
import sys
import time
from pathlib import Path

import corpus_formats as formats
import own_corpus
from fetch import fetch
from moses import clean_corpus, lowercase_file
from steps import BPE, REMOVE_BPE, SPLITS, Preparation
from textfiles import (OptionParser, PrepareError, concat, count_lines, digest, iter_lines, link, whole_number,
                       write_lines)

REPO = Path(__file__).resolve().parents[1]

IWSLT14_SOURCES = {"de-en.tgz": "https://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz"}


def iwslt14(prep):
    """IWSLT14 De-En as fairseq's examples/translation/prepare-iwslt14.sh makes it, binarized for De->En. Steps:
    fetch, extract, text, tok, split (clean-corpus-n.perl -ratio 1.5 1 175, lowercase, every 23rd pair to valid),
    sizes (160,239 / 7,283 / 6,750 pairs), bpe-learn, bpe (10,000 merges), binarize."""
    work, orig, tok = prep.work, prep.work / "extract" / "de-en", prep.work / "tok"
    test_sets = ("TED.dev2010", "TEDX.dev2012", "TED.tst2010", "TED.tst2011", "TED.tst2012")  # fairseq's `cat` order

    def iwslt_text(out):
        for lang in ("de", "en"):
            tags, xmls = orig / f"train.tags.de-en.{lang}", [orig / f"IWSLT14.{s}.de-en.{lang}.xml" for s in test_sets]
            write_lines(out / f"train.{lang}", formats.iwslt_train_lines(iter_lines(tags)))
            formats.iwslt_xml_file(xmls, out / f"test.{lang}")

    def split(out):
        clean_corpus(tok / "train.de", tok / "train.en", out / "clean.de", out / "clean.en", 1, 175, ratio=1.5)
        for lang in ("de", "en"):
            lowercase_file(out / f"clean.{lang}", out / f"clean.lc.{lang}")
            lowercase_file(tok / f"test.{lang}", out / f"test.{lang}")
            formats.split_every(23, out / f"clean.lc.{lang}", out / f"train.{lang}", out / f"valid.{lang}")
            os.remove(out / f"clean.{lang}")
            os.remove(out / f"clean.lc.{lang}")

    fetched = fetch(prep, IWSLT14_SOURCES)
    prep.step("extract", formats.extract, fetched / "de-en.tgz")
    prep.step("text", iwslt_text)
    prep.step("tok", prep.tokenize, work / "text", [f"{s}.{lang}" for s in ("train", "test") for lang in ("de", "en")])
    prep.step("split", split)
    prep.check_sizes(work / "split", "de", "en", {"train": 160239, "valid": 7283, "test": 6750})
    prep.bpe_and_binarize(work / "split", "de", "en", {
        "dataset": "iwslt14.de-en", "reproduces": "fairseq examples/translation/prepare-iwslt14.sh",
        "tokenizer": "moses tokenizer.perl (mosesdecoder HEAD 75d4c672e)"})


WMT16_SOURCES = {  # google/seq2seq's downloads, each extracted into a folder of its own
    "de-en.tgz": "https://www.statmt.org/europarl/v7/de-en.tgz",
    "training-parallel-commoncrawl.tgz": "https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz",
    "training-parallel-nc-v11.tgz": "https://data.statmt.org/wmt16/translation-task/training-parallel-nc-v11.tgz",
    "dev.tgz": "https://data.statmt.org/wmt16/translation-task/dev.tgz",
}
# newstest2014.de from input-from-sgm.perl (NVIDIA/DeepLearningExamples PyTorch/Translation/GNMT verify_dataset.sh)
NEWSTEST2014_DE_MD5 = "f6c3818b477e4a25cad68b61cc883c17"


def wmt16(prep):
    """WMT16 En-De of fairseq's examples/scaling_nmt, binarized for En->De: google/seq2seq bin/data/wmt16_en_de.sh
    as it ran in 2017 (its own archive, wmt16_en_de.tar.gz on Google Drive, is gone), on Europarl v7, Common Crawl,
    News Commentary v11 and WMT16 dev.tgz. Steps: fetch, extract, text, tok, clean (clean-corpus-n.perl 1 80), sizes
    (3,000 / 3,003; train 4.4M-4.6M), bpe-learn, bpe (32,000 merges), binarize."""
    work, root, dev = prep.work, prep.work / "extract", prep.work / "extract" / "dev" / "dev"
    parts = ("europarl/europarl-v7.de-en", "commoncrawl/commoncrawl.de-en",
             "nc-v11/training-parallel-nc-v11/news-commentary-v11.de-en")  # google's `cat` order

    def wmt16_text(out):
        for lang in ("en", "de"):
            concat([root / f"{p}.{lang}" for p in parts], out / f"train.{lang}")
            link(dev / f"newstest2013.{lang}", out / f"valid.{lang}")
        formats.sgm_file(dev / "newstest2014-deen-src.de.sgm", out / "test.de")
        formats.sgm_file(dev / "newstest2014-deen-ref.en.sgm", out / "test.en")

    fetched = fetch(prep, WMT16_SOURCES)
    prep.step("extract", lambda out: [formats.extract(out / sub, fetched / name) for name, sub in
                                      zip(WMT16_SOURCES, ("europarl", "commoncrawl", "nc-v11", "dev"))])
    prep.step("text", wmt16_text)
    prep.check_figures(work / "text", [("test.de", digest(work / "text" / "test.de", "md5"), NEWSTEST2014_DE_MD5,
                                        "(md5)")])
    prep.step("tok", prep.tokenize, work / "text", [f"{s}.{lang}" for s in SPLITS for lang in ("en", "de")],
              moses="2017")
    prep.step("clean", clean_train, prep, 80)
    prep.check_sizes(work / "clean", "en", "de", {"train": (4400000, 4600000), "valid": 3000, "test": 3003})
    prep.bpe_and_binarize(work / "clean", "en", "de", {
        "dataset": "wmt16.en-de", "reproduces": "google/seq2seq bin/data/wmt16_en_de.sh",
        "tokenizer": "moses tokenizer.perl as of 2017 (before mosesdecoder 9fc964da7)"},
        ("--nwordssrc", "32768", "--nwordstgt", "32768"))


WMT14_SOURCES = {
    "training-parallel-europarl-v7.tgz": "https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz",
    "training-parallel-commoncrawl.tgz": "https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz",
    "training-parallel-nc-v12.tgz": "https://data.statmt.org/wmt17/translation-task/training-parallel-nc-v12.tgz",
    "dev.tgz": "https://data.statmt.org/wmt17/translation-task/dev.tgz",
    "test-full.tgz": "https://www.statmt.org/wmt14/test-full.tgz",
}


def wmt14(prep):
    """WMT14 En-De as Shen et al. 2020 prepared it, binarized for En->De: their release's
    trans-scripts/data-preprocessing/prepare-wmt14en2de.sh (sIncerass/powernorm@9ea6226), i.e. fairseq v0.6.0's
    prepare-wmt14en2de.sh --scaling18, on the five statmt.org archives. Steps: fetch, extract, text, tok
    (normalize-punctuation.perl, remove-non-printing-char.perl, tokenizer.perl -a), clean (clean-corpus-n.perl 1 80),
    sizes (3,000 / 3,003; train 4.4M-4.6M), bpe-learn, bpe (32,764 merges), binarize."""
    work, root = prep.work, prep.work / "extract"
    parts = ("training/europarl-v7.de-en", "commoncrawl.de-en", "training/news-commentary-v12.de-en")  # in its order
    sgm = {"en": root / "test-full" / "newstest2014-deen-src.en.sgm",
           "de": root / "test-full" / "newstest2014-deen-ref.de.sgm"}

    def wmt14_text(out):
        for k, p in enumerate(parts):
            for lang in ("en", "de"):
                link(root / f"{p}.{lang}", out / f"train.part{k}.{lang}")
        for lang in ("en", "de"):
            link(root / "dev" / f"newstest2013.{lang}", out / f"valid.{lang}")
            formats.iwslt_xml_file([sgm[lang]], out / f"test.{lang}")

    def tokenize(out):
        # each training file on its own (normalize-punctuation.perl sees whether its last line ends), then `cat`
        names = [f"train.part{k}.{lang}" for k in range(len(parts)) for lang in ("en", "de")]
        prep.tokenize(out, work / "text", names + ["valid.en", "valid.de"], aggressive=True, norm=True, rem=True)
        for lang in ("en", "de"):
            concat([out / f"train.part{k}.{lang}" for k in range(len(parts))], out / f"train.{lang}", remove=True)
        prep.tokenize(out, work / "text", ["test.en", "test.de"], aggressive=True)

    fetched = fetch(prep, WMT14_SOURCES)
    prep.step("extract", lambda out: [formats.extract(out, fetched / name) for name in WMT14_SOURCES])
    prep.step("text", wmt14_text)
    prep.step("tok", tokenize)
    prep.step("clean", clean_train, prep, 80, "en", "de")
    prep.check_sizes(work / "clean", "en", "de", {"train": (4400000, 4600000), "valid": 3000, "test": 3003})
    prep.bpe_and_binarize(work / "clean", "en", "de", {
        "dataset": "wmt14.en-de",
        "reproduces": "sIncerass/powernorm trans-scripts/data-preprocessing/prepare-wmt14en2de.sh "
                      "(fairseq v0.6.0 prepare-wmt14en2de.sh --scaling18)",
        "tokenizer": "moses normalize-punctuation.perl, remove-non-printing-char.perl, tokenizer.perl -a "
                     "(mosesdecoder HEAD 34452895f)"})


IWSLT15_ENVI_SOURCES = {f"{s}.{lang}": f"https://nlp.stanford.edu/projects/nmt/data/iwslt15.en-vi/{s}.{lang}"
                        for s in ("train", "tst2012", "tst2013") for lang in ("en", "vi")}


def iwslt15_envi(prep):
    """IWSLT15 En-Vi from the Stanford NMT release (Luong and Manning 2015), tokenized and cased as released,
    binarized for En->Vi. Steps: fetch, text (line-breaking characters other than \\n become spaces; --lowercase),
    sizes (133,317 / 1,553 / 1,268 pairs), bpe-learn, bpe (8,000 merges), binarize."""
    def envi_text(out):
        for split, name in (("train", "train"), ("valid", "tst2012"), ("test", "tst2013")):
            for lang in ("en", "vi"):
                if n := formats.sanitize_breaks((fetched / f"{name}.{lang}").resolve(), out / f"{split}.{lang}"):
                    prep.log(f"{name}.{lang}: {n} lines held line-breaking characters other than \\n (now spaces)")
                if prep.lowercased:
                    lowercase_file(out / f"{split}.{lang}", out / "lc")
                    os.replace(out / "lc", out / f"{split}.{lang}")

    fetched = fetch(prep, IWSLT15_ENVI_SOURCES)
    prep.step("text", envi_text, params=f"lowercase={prep.lowercased}")
    prep.check_sizes(prep.work / "text", "en", "vi", {"train": 133317, "valid": 1553, "test": 1268})
    prep.bpe_and_binarize(prep.work / "text", "en", "vi", {
        "dataset": "iwslt15.en-vi", "reproduces": "Stanford NMT iwslt15.en-vi files as released",
        "bpe_note": "the default BPE is our choice: no source states the En-Vi vocabulary of Xu et al. 2019"})


def language_model_corpus(prep, sources, members, lines, tokens, vocabulary, info):
    """Steps fetch, text (the three MEMBERS of the one archive of ``sources``, and their counts), the published
    sizes, binarize (fairseq-preprocess --only-source, as fairseq's examples/language_model)."""
    def lm_text(out):
        archive = (fetched / next(iter(sources))).resolve()  # errors name the file given
        formats.extract_members(archive, list(zip(members, SPLITS)), out)
        stats = formats.lm_stats([(s, out / s, f"{m} in {archive}") for m, s in zip(members, SPLITS)])
        (out / "stats.json").write_text(json.dumps(stats))

    def manifest(out):
        return {**info, "bpe": "none", "remove_bpe": None, "sizes": {s: st[f"{s}.lines"] for s in SPLITS},
                "tokens": {s: st[f"{s}.tokens"] for s in SPLITS}, "vocabulary": st["vocabulary"],
                "dictionary_size": 4 + count_lines(out / "dict.txt")}

    fetched = fetch(prep, sources)
    folder = prep.step("text", lm_text)
    st = json.loads((folder / "stats.json").read_text())  # tokens: the words and one end of sentence a line
    vocab = ("train", st["vocabulary"], vocabulary, "words in its vocabulary (with the end of sentence)")
    prep.check_figures(folder, [(s, st[f"{s}.{unit}"], want[k], unit) for k, s in enumerate(SPLITS)
                                for unit, want in (("lines", lines), ("tokens", tokens))] + [vocab])
    prep.binarize(folder, ["--only-source"], manifest)


PTB_SOURCES = {"simple-examples.tgz": "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz"}


def ptb(prep):
    """The Penn Treebank language-model corpus as Mikolov et al. released it, binarized as it is. Sizes: 42,068 /
    3,370 / 3,761 lines; 929,589 / 73,760 / 82,430 tokens (edwardlib/observations ptb.py); 10,000 words with the end
    of sentence."""
    language_model_corpus(prep, PTB_SOURCES, [f"simple-examples/data/ptb.{s}.txt" for s in SPLITS],
                          (42068, 3370, 3761), (929589, 73760, 82430), 10000,
                          {"dataset": "ptb", "reproduces": "Mikolov et al. simple-examples.tgz data/ptb.*.txt"})


WIKITEXT103_SOURCES = {"wikitext-103-v1.zip": "https://wikitext.smerity.com/wikitext-103-v1.zip"}  # author's mirror


def wikitext103(prep):
    """WikiText-103 (Merity et al. 2016) as released, binarized as fairseq's examples/language_model. Sizes:
    1,801,350 / 3,760 / 4,358 lines (torchtext); 103,227,021 / 217,646 / 245,569 tokens (urvashik/knnlm); 267,735
    words (transfo-xl-wt103)."""
    language_model_corpus(prep, WIKITEXT103_SOURCES, [f"wikitext-103/wiki.{s}.tokens" for s in SPLITS],
                          (1801350, 3760, 4358), (103227021, 217646, 245569), 267735,
                          {"dataset": "wikitext-103", "reproduces": "fairseq examples/language_model"})


def clean_train(out, prep, max_len, src="de", tgt="en"):
    """clean-corpus-n.perl 1 MAX_LEN on WORK/tok's train (SRC, TGT in the upstream order), valid and test as is."""
    tok = prep.work / "tok"
    clean_corpus(tok / f"train.{src}", tok / f"train.{tgt}", out / f"train.{src}", out / f"train.{tgt}", 1, max_len)
    for name in (f"{s}.{lang}" for s in ("valid", "test") for lang in (src, tgt)):
        link(tok / name, out / name)


# scripts/prepare-NAME.sh: its steps, sources, data/data-bin folder, --bpe-size (None: word level), always lowercased
Dataset = collections.namedtuple("Dataset", "prepare sources dest bpe_size lowercased")
DATASETS = {
    "iwslt14": Dataset(iwslt14, IWSLT14_SOURCES, "iwslt14.tokenized.de-en", 10000, True),
    "iwslt15-envi": Dataset(iwslt15_envi, IWSLT15_ENVI_SOURCES, "iwslt15.en-vi", 8000, False),
    "wmt14": Dataset(wmt14, WMT14_SOURCES, "wmt14_en_de_joined_dict", 32764, False),
    "wmt16": Dataset(wmt16, WMT16_SOURCES, "wmt16_en_de_bpe32k", 32000, False),
    "ptb": Dataset(ptb, PTB_SOURCES, "ptb", None, False),
    "wikitext103": Dataset(wikitext103, WIKITEXT103_SOURCES, "wikitext-103", None, False),
}


def parse_options(name, d, argv):
    """The options of scripts/prepare-NAME.sh."""
    sources = "\n  ".join(d.sources.values())
    archive = ("a copy of " if len(d.sources) == 1 else "a folder holding ") + ", ".join(d.sources)
    ap = OptionParser(prog=f"scripts/prepare-{name}.sh", allow_abbrev=False,
                 description=f"{inspect.cleandoc(d.prepare.__doc__)}\n\nSources:\n  {sources}",
                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add = ap.add_argument
    add("--archive", type=Path, help=f"{archive}, instead of the download (offline)")
    add("--work", type=Path, default=REPO / "data" / name.split("-")[0], help="working folder (default: %(default)s)")
    add("--dest", type=Path, default=REPO / "data" / "data-bin" / d.dest,
        help="fairseq-preprocess output (default: %(default)s)")
    if d.bpe_size is not None:
        add("--bpe", default=BPE, choices=list(REMOVE_BPE), help="subword units (default: %(default)s)")
        add("--bpe-size", type=whole_number, default=d.bpe_size, help="subword-nmt merges (default: %(default)s)")
    if name == "iwslt15-envi":
        add("--lowercase", action="store_true", help="lowercase both sides")
    add("--skip-size-check", action="store_true", help="go on when the sizes differ from the published ones")
    add("--workers", type=whole_number, default=os.cpu_count() or 1,
        help="processes for the text steps and fairseq-preprocess")
    add("--no-binarize", action="store_true", help="stop before fairseq-preprocess")
    add("--force", action="store_true", help="redo every step")
    o = ap.parse_args(argv)
    o.archive, o.work, o.dest = (p and p.resolve() for p in (o.archive, o.work, o.dest))
    o.command = " ".join([f"scripts/prepare-{name}.sh", *argv])
    return o


def dataset(name, argv):
    """scripts/prepare-NAME.sh ARGV."""
    d = DATASETS[name]
    o = parse_options(name, d, argv)
    prep = Preparation(name, o, o.dest, d.lowercased)
    prep.log(f"work folder {prep.work}, output {prep.dest}")
    d.prepare(prep)
    prep.log(f"all steps done in {time.time() - prep.t0:.0f}s")


def main(argv):
    if argv[:1] == ["text"]:
        name, prepare = "text", lambda: own_corpus.text(own_corpus.parse_options(argv[1:]))
    elif not argv or argv[0] not in DATASETS:
        print(f"ERROR: the dataset must be text or one of {', '.join(DATASETS)}, got {argv[0] if argv else 'none'}",
              file=sys.stderr)
        return 2
    else:
        name, prepare = argv[0], lambda: dataset(argv[0], argv[1:])
    try:
        prepare()
    except PrepareError as e:
        print(f"ERROR: [{name}] {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"ERROR: [{name}] {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
