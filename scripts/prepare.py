"""`python scripts/prepare.py DATASET [options]` (what scripts/prepare-DATASET.sh runs): a corpus of the papers, made
as the upstream script made it and binarized for fairseq. One function a dataset holds its steps in order;
prepare_steps.py runs them, prepare_text.py and prepare_corpus.py do the text. data/README.md describes the data.
"""
import collections
import inspect
import os
import shutil
import sys
import time

import prepare_corpus as corpus
import prepare_text as text
from prepare_steps import SPLITS, Prep, PrepareError, parse_options
from prepare_text import clean_corpus, lowercase_file


def iwslt14(prep):
    """IWSLT14 De-En as fairseq's examples/translation/prepare-iwslt14.sh makes it, binarized for De->En. Source:
    https://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz. Steps: fetch, extract, text, tok, split
    (clean-corpus-n.perl -ratio 1.5 1 175, lowercase, every 23rd pair to valid), sizes (160,239 / 7,283 / 6,750
    pairs), bpe-learn, bpe (10,000 merges), binarize."""
    work, orig, tok = prep.work, prep.work / "extract" / "de-en", prep.work / "tok"
    test_sets = ("TED.dev2010", "TEDX.dev2012", "TED.tst2010", "TED.tst2011", "TED.tst2012")  # fairseq's `cat` order

    def iwslt_text(out):
        for lang in ("de", "en"):
            tags, xmls = orig / f"train.tags.de-en.{lang}", [orig / f"IWSLT14.{s}.de-en.{lang}.xml" for s in test_sets]
            prep.require(tags, *xmls)
            text.write_lines(out / f"train.{lang}", corpus.iwslt_train_lines(text.iter_lines(tags)))
            corpus.iwslt_xml_file(xmls, out / f"test.{lang}")
        aligned(out, ("train", "test"), "de", "en")

    def split(out):
        clean_corpus(tok / "train.de", tok / "train.en", out / "clean.de", out / "clean.en", 1, 175, ratio=1.5)
        for lang in ("de", "en"):
            lowercase_file(out / f"clean.{lang}", out / f"clean.lc.{lang}")
            lowercase_file(tok / f"test.{lang}", out / f"test.{lang}")
            corpus.split_every(23, out / f"clean.lc.{lang}", out / f"train.{lang}", out / f"valid.{lang}")
            os.remove(out / f"clean.{lang}")
            os.remove(out / f"clean.lc.{lang}")
        aligned(out, SPLITS, "de", "en")

    fetch = prep.fetch([("de-en.tgz", prep.o.url or "https://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz",
                         "gzip")])
    prep.step("extract", prep.extract, fetch / "de-en.tgz")
    prep.step("text", iwslt_text)
    prep.step("tok", prep.tokenize, work / "text", [f"{s}.{lang}" for s in ("train", "test") for lang in ("de", "en")])
    prep.step("split", split)
    prep.check_sizes(work / "split", "de", {"train": 160239, "valid": 7283, "test": 6750})
    prep.bpe_and_binarize(work / "split", "de", "en", {
        "dataset": "iwslt14.de-en", "recipe": "fairseq examples/translation/prepare-iwslt14.sh",
        "tokenizer": "moses tokenizer.perl (mosesdecoder HEAD 75d4c672e)"})


WMT16_SOURCES = {  # name: (URL, the folder it is extracted into)
    "de-en.tgz": ("https://www.statmt.org/europarl/v7/de-en.tgz", "europarl"),
    "training-parallel-commoncrawl.tgz": ("https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz",
                                          "commoncrawl"),
    "training-parallel-nc-v11.tgz": ("https://data.statmt.org/wmt16/translation-task/training-parallel-nc-v11.tgz",
                                     "nc-v11"),
    "dev.tgz": ("https://data.statmt.org/wmt16/translation-task/dev.tgz", "dev"),
}
# NVIDIA/DeepLearningExamples PyTorch/Translation/GNMT/scripts/verify_dataset.sh: the md5 of newstest2014.de as
# input-from-sgm.perl writes it
NEWSTEST2014_DE_MD5 = "f6c3818b477e4a25cad68b61cc883c17"


def wmt16(prep):
    """WMT16 En-De of fairseq's examples/scaling_nmt, binarized for En->De, rebuilt from the raw corpora as
    google/seq2seq bin/data/wmt16_en_de.sh made it in 2017: Europarl v7, Common Crawl, News Commentary v11 and WMT16
    dev.tgz from statmt.org (--archive DIR: a folder of the four); --archive FILE: Google's own wmt16_en_de.tar.gz,
    whose BPE text is binarized as it is. Steps: fetch, extract, text, tok, clean (clean-corpus-n.perl 1 80), sizes
    (3,000 / 3,003; train 4.4M-4.6M), bpe-learn, bpe (32,000 merges), binarize."""
    o, work = prep.o, prep.work
    google = bool(o.archive and not o.archive.is_dir()) or o.url.endswith("/wmt16_en_de.tar.gz")
    if google and o.bpe_size != 32000:
        raise PrepareError(f"Google's archive holds a BPE of 32000 merges, not --bpe-size {o.bpe_size}; learn another "
                           "from the raw corpora (--archive DIR or the default download)")
    if o.bpe == "none":
        raise PrepareError("--bpe none: WMT16 is used with a subword vocabulary (subword-nmt)")
    root, sizes = work / "extract", {"train": (4400000, 4600000), "valid": 3000, "test": 3003}
    info = {"dataset": "wmt16.en-de", "recipe": "google/seq2seq bin/data/wmt16_en_de.sh",
            "tokenizer": "moses tokenizer.perl as of 2017 (before mosesdecoder 9fc964da7)",
            "from": "google" if google else "raw"}
    args = ("--nwordssrc", "32768", "--nwordstgt", "32768")
    parts = ("europarl/europarl-v7.de-en", "commoncrawl/commoncrawl.de-en",
             "nc-v11/training-parallel-nc-v11/news-commentary-v11.de-en")  # google's `cat` order

    def google_text(out):
        d = find_dir(root, "train.tok.clean.bpe.32000.en", f"{o.archive or o.url}: is it Google's wmt16_en_de.tar.gz? "
                     "(a folder of the raw corpora is passed as --archive DIR)")
        for split, name in (("train", "train.tok.clean"), ("valid", "newstest2013.tok"), ("test", "newstest2014.tok")):
            for lang in ("en", "de"):
                prep.require(d / f"{name}.bpe.32000.{lang}")
                link(d / f"{name}.bpe.32000.{lang}", out / f"{split}.{lang}")
        if (d / "bpe.32000").exists():
            shutil.copy(d / "bpe.32000", out / "code")
        aligned(out, SPLITS, "en", "de")

    def raw_text(out):
        dev = find_dir(root / "dev", "newstest2014-deen-src.de.sgm", "dev.tgz: is it WMT16's dev.tgz?")
        prep.require(*[root / f"{p}.{lang}" for p in parts for lang in ("en", "de")],
                     *[dev / f"newstest2014-deen-{f}.sgm" for f in ("src.de", "ref.en")],
                     dev / "newstest2013.en", dev / "newstest2013.de")
        for lang in ("en", "de"):
            concat([root / f"{p}.{lang}" for p in parts], out / f"train.{lang}")
            link(dev / f"newstest2013.{lang}", out / f"valid.{lang}")
        corpus.sgm_file(dev / "newstest2014-deen-src.de.sgm", out / "test.de")
        corpus.sgm_file(dev / "newstest2014-deen-ref.en.sgm", out / "test.en")
        aligned(out, SPLITS, "en", "de")

    if google:
        fetch = prep.fetch([("wmt16_en_de.tar.gz", o.url, "gzip")])
        prep.step("extract", prep.extract, fetch / "wmt16_en_de.tar.gz")
        prep.step("text", google_text)
        prep.check_sizes(work / "text", "en", sizes)
        return prep.bpe_and_binarize(work / "text", "en", "de", info, args, bpe_done=True)
    fetch = prep.fetch([(name, o.url and f"{o.url.rstrip('/')}/{name}" or url, "gzip")
                        for name, (url, _) in WMT16_SOURCES.items()])
    prep.step("extract", lambda out: [prep.extract(out, fetch / name, sub) for name, (_, sub) in WMT16_SOURCES.items()])
    prep.step("text", raw_text)
    prep.check_checksum(work / "text" / "test.de", "md5", NEWSTEST2014_DE_MD5,
                        "NVIDIA/DeepLearningExamples GNMT verify_dataset.sh")
    prep.step("tok", prep.tokenize, work / "text", [f"{s}.{lang}" for s in SPLITS for lang in ("en", "de")],
              moses="2017")
    prep.step("clean", clean_train, prep, 80)
    prep.check_sizes(work / "clean", "en", sizes)
    prep.bpe_and_binarize(work / "clean", "en", "de", info, args)


WMT14_URLS = {
    "training-parallel-europarl-v7.tgz": "https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz",
    "training-parallel-commoncrawl.tgz": "https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz",
    "training-parallel-nc-v12.tgz": "https://data.statmt.org/wmt17/translation-task/training-parallel-nc-v12.tgz",
    "dev.tgz": "https://data.statmt.org/wmt17/translation-task/dev.tgz",
    "test-full.tgz": "https://www.statmt.org/wmt14/test-full.tgz",
}


def wmt14(prep):
    """WMT14 En-De as Shen et al. 2020 prepared it, binarized for En->De: their release's
    trans-scripts/data-preprocessing/prepare-wmt14en2de.sh (sIncerass/powernorm@9ea6226), i.e. fairseq v0.6.0's
    prepare-wmt14en2de.sh --scaling18, on the five statmt.org archives (--archive DIR or --url: a folder of them).
    Steps: fetch, extract, text, tok (normalize-punctuation.perl, remove-non-printing-char.perl, tokenizer.perl -a),
    clean (clean-corpus-n.perl 1 80), sizes (3,000 / 3,003; train 4.4M-4.6M), bpe-learn, bpe (32,764 merges),
    binarize."""
    o, work = prep.o, prep.work
    if o.archive and not o.archive.is_dir():
        raise PrepareError(f"--archive must be a folder holding the five upstream files ({' '.join(WMT14_URLS)}), "
                           f"got the file {o.archive}")
    if o.bpe == "none":
        raise PrepareError("--bpe none: WMT14 is used with a subword vocabulary (subword-nmt)")
    root, tok = work / "extract", work / "tok"
    parts = ("training/europarl-v7.de-en", "commoncrawl.de-en", "training/news-commentary-v12.de-en")  # in its order
    sgm = {"en": root / "test-full" / "newstest2014-deen-src.en.sgm",
           "de": root / "test-full" / "newstest2014-deen-ref.de.sgm"}

    def wmt14_text(out):
        prep.require(*[root / f"{p}.{lang}" for p in parts for lang in ("en", "de")], *sgm.values(),
                     root / "dev" / "newstest2013.en", root / "dev" / "newstest2013.de")
        for k, p in enumerate(parts):
            for lang in ("en", "de"):
                link(root / f"{p}.{lang}", out / f"train.part{k}.{lang}")
        for lang in ("en", "de"):
            link(root / "dev" / f"newstest2013.{lang}", out / f"valid.{lang}")
            corpus.iwslt_xml_file([sgm[lang]], out / f"test.{lang}")
        aligned(out, [f"train.part{k}" for k in range(len(parts))] + ["valid", "test"], "en", "de")

    def tokenize(out):
        # each training file on its own (normalize-punctuation.perl sees whether its last line ends), then `cat`
        names = [f"train.part{k}.{lang}" for k in range(len(parts)) for lang in ("en", "de")]
        prep.tokenize(out, work / "text", names + ["valid.en", "valid.de"], aggressive=True, norm=True, rem=True)
        for lang in ("en", "de"):
            concat([out / f"train.part{k}.{lang}" for k in range(len(parts))], out / f"train.{lang}", remove=True)
        prep.tokenize(out, work / "text", ["test.en", "test.de"], aggressive=True)
        aligned(out, ("train",), "en", "de")

    fetch = prep.fetch([(name, o.url and f"{o.url.rstrip('/')}/{name}" or url, "gzip")
                        for name, url in WMT14_URLS.items()])
    prep.step("extract", lambda out: [prep.extract(out, fetch / name) for name in WMT14_URLS])
    prep.step("text", wmt14_text)
    prep.step("tok", tokenize)
    prep.step("clean", clean_train, prep, 80, "en", "de")
    prep.check_sizes(work / "clean", "en", {"train": (4400000, 4600000), "valid": 3000, "test": 3003})
    prep.bpe_and_binarize(work / "clean", "en", "de", {
        "dataset": "wmt14.en-de",
        "recipe": "sIncerass/powernorm trans-scripts/data-preprocessing/prepare-wmt14en2de.sh "
                  "(fairseq v0.6.0 prepare-wmt14en2de.sh --scaling18)",
        "tokenizer": "moses normalize-punctuation.perl, remove-non-printing-char.perl, tokenizer.perl -a "
                     "(mosesdecoder HEAD 34452895f)"})


def iwslt15_envi(prep):
    """IWSLT15 En-Vi from the Stanford NMT release (Luong and Manning 2015), tokenized and cased as released,
    binarized for En->Vi. Source: the six files under https://nlp.stanford.edu/projects/nmt/data/iwslt15.en-vi;
    --archive: a folder or a tar of them. Steps: fetch, [extract,] text (line-breaking characters other than \\n become
    spaces; --lowercase), sizes (133,317 / 1,553 / 1,268 pairs), bpe-learn, bpe (8,000 merges), binarize."""
    o, work = prep.o, prep.work
    files = [f"{s}.{lang}" for s in ("train", "tst2012", "tst2013") for lang in ("en", "vi")]
    tarball = bool(o.archive and not o.archive.is_dir()) or o.url.endswith((".tgz", ".tar", ".tar.gz", ".tar.xz"))
    url = o.url or "https://nlp.stanford.edu/projects/nmt/data/iwslt15.en-vi"

    def envi_text(out):
        d = find_dir(work / "extract", "train.en", f"{o.archive or o.url}") if tarball else work / "fetch"
        for split, name in (("train", "train"), ("valid", "tst2012"), ("test", "tst2013")):
            for lang in ("en", "vi"):
                prep.require(d / f"{name}.{lang}")
                why = corpus.check_kind(d / f"{name}.{lang}", "text")
                if why:
                    raise PrepareError(f"{name}.{lang} in {o.archive or o.url} {why}")
                if n := corpus.sanitize_breaks(d / f"{name}.{lang}", out / f"{split}.{lang}"):
                    prep.log(f"{name}.{lang}: {n} lines held line-breaking characters other than \\n (now spaces)")
                if prep.lowercased:
                    lowercase_file(out / f"{split}.{lang}", out / "lc")
                    os.replace(out / "lc", out / f"{split}.{lang}")
        aligned(out, SPLITS, "en", "vi")

    if tarball:
        fetch = prep.fetch([("iwslt15-en-vi.tar", o.url, "tar")])
        prep.step("extract", prep.extract, fetch / "iwslt15-en-vi.tar")
    else:
        prep.fetch([(f, f"{url.rstrip('/')}/{f}", "text") for f in files])
    prep.step("text", envi_text, params=f"lowercase={prep.lowercased}")
    prep.check_sizes(work / "text", "en", {"train": 133317, "valid": 1553, "test": 1268})
    prep.bpe_and_binarize(work / "text", "en", "vi", {
        "dataset": "iwslt15.en-vi", "recipe": "Stanford NMT iwslt15.en-vi files as released",
        "bpe_note": "the default BPE is this project's choice: no source states the En-Vi vocabulary of Xu et al. "
                    "2019"})


def language_model_corpus(prep, dataset, archive, url, kind, members, lines, tokens, vocabulary, recipe):
    """Steps fetch, text (the three MEMBERS of the archive, UTF-8 text, and their counts), the published sizes,
    binarize (fairseq-preprocess --only-source, as fairseq's examples/language_model)."""
    def lm_text(out):
        source = (prep.work / "fetch" / archive).resolve()  # errors name the file given
        corpus.extract_members(source, list(zip(members, SPLITS)), out)
        for member, split in zip(members, SPLITS):
            if why := corpus.check_kind(out / split, "text"):
                raise PrepareError(f"{member} in {source} {why}")
        corpus.write_stats(out / "stats", corpus.lm_stats([(s, out / s) for s in SPLITS]))

    def manifest(out):
        return {"dataset": dataset, "bpe": "none", "remove_bpe": None, "sizes": {s: st[f"{s}.lines"] for s in SPLITS},
                "tokens": {s: st[f"{s}.tokens"] for s in SPLITS}, "vocabulary": st["vocabulary"],
                "dictionary_size": 4 + text.count_lines(out / "dict.txt"), "recipe": recipe}

    prep.fetch([(archive, prep.o.url or url, kind)])
    folder = prep.step("text", lm_text)
    st = corpus.read_stats(folder / "stats")  # tokens: the words and one end of sentence a line, as published
    prep.check_figures(folder, [(s, st[f"{s}.{unit}"], want[k], unit) for k, s in enumerate(SPLITS)
                                for unit, want in (("lines", lines), ("tokens", tokens))]
                       + [("train", st["vocabulary"], vocabulary, "words in its vocabulary (with the end of "
                                                                   "sentence)")])
    prep.binarize(folder, ["--only-source"], manifest)


def ptb(prep):
    """The Penn Treebank language-model corpus as Mikolov et al. released it, binarized as it is. Source:
    http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz. Sizes: 42,068 / 3,370 / 3,761 lines; 929,589 /
    73,760 / 82,430 tokens (edwardlib/observations ptb.py); 10,000 words with the end of sentence."""
    language_model_corpus(prep, "ptb", "simple-examples.tgz",
                          "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz", "gzip",
                          [f"simple-examples/data/ptb.{s}.txt" for s in SPLITS], (42068, 3370, 3761),
                          (929589, 73760, 82430), 10000,
                          "Mikolov et al. simple-examples.tgz data/ptb.*.txt as released")


def wikitext103(prep):
    """WikiText-103 (Merity et al. 2016) as released, binarized as fairseq's examples/language_model. Source:
    https://wikitext.smerity.com/wikitext-103-v1.zip, its author's mirror. Sizes: 1,801,350 / 3,760 / 4,358 lines
    (torchtext); 103,227,021 / 217,646 / 245,569 tokens (urvashik/knnlm); 267,735 words (transfo-xl-wt103)."""
    language_model_corpus(prep, "wikitext-103", "wikitext-103-v1.zip",
                          "https://wikitext.smerity.com/wikitext-103-v1.zip", "zip",
                          [f"wikitext-103/wiki.{s}.tokens" for s in SPLITS], (1801350, 3760, 4358),
                          (103227021, 217646, 245569), 267735,
                          "fairseq examples/language_model (wikitext-103-v1.zip as released)")


def clean_train(out, prep, max_len, src="de", tgt="en"):
    """clean-corpus-n.perl 1 MAX_LEN on WORK/tok's train (SRC, TGT in the upstream script's order); valid and test
    as they are."""
    tok = prep.work / "tok"
    clean_corpus(tok / f"train.{src}", tok / f"train.{tgt}", out / f"train.{src}", out / f"train.{tgt}", 1, max_len)
    for name in (f"{s}.{lang}" for s in ("valid", "test") for lang in (src, tgt)):
        link(tok / name, out / name)


def aligned(folder, splits, src, tgt):
    for split in splits:
        text.check_aligned(folder / f"{split}.{src}", folder / f"{split}.{tgt}")


def concat(paths, out, remove=False):
    """`cat PATHS > OUT`."""
    with open(out, "wb") as f:
        for p in paths:
            with open(p, "rb") as part:
                shutil.copyfileobj(part, f, 1 << 20)
            if remove:
                os.remove(p)


def link(src, dst):
    """A hard link where the file system allows one (WMT's text is GBs), else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy(src, dst)


def find_dir(root, name, where):
    """The folder under ROOT that holds NAME (archives may or may not wrap their files in one)."""
    found = sorted(root.rglob(name))
    if not found:
        raise PrepareError(f"{name} is not in {where}")
    return found[0].parent


# scripts/prepare-NAME.sh: its recipe, output folder under data/data-bin, default --bpe-size (None: a word-level
# corpus), whether its text is lowercased by default, and its own switches
Dataset = collections.namedtuple("Dataset", "recipe dest bpe_size lowercased flags", defaults=(False, {}))
DATASETS = {
    "iwslt14": Dataset(iwslt14, "iwslt14.tokenized.de-en", 10000, lowercased=True),
    "iwslt15-envi": Dataset(iwslt15_envi, "iwslt15.en-vi", 8000, flags={"--lowercase": "lowercase both sides"}),
    "wmt14": Dataset(wmt14, "wmt14_en_de_joined_dict", 32764),
    "wmt16": Dataset(wmt16, "wmt16_en_de_bpe32k", 32000),
    "ptb": Dataset(ptb, "ptb", None),
    "wikitext103": Dataset(wikitext103, "wikitext-103", None),
}


def main(argv):
    if not argv or argv[0] not in DATASETS:
        print(f"ERROR: the dataset must be one of {', '.join(DATASETS)}, got {argv[0] if argv else 'none'}",
              file=sys.stderr)
        return 2
    name, d = argv[0], DATASETS[argv[0]]
    try:
        o = parse_options(name, argv[1:], inspect.cleandoc(d.recipe.__doc__), d.bpe_size, d.flags)
        prep = Prep(name, o, d.dest, d.lowercased)
        prep.log(f"work folder {prep.work}, output {prep.dest}")
        d.recipe(prep)
        prep.log(f"all steps done in {time.time() - prep.t0:.0f}s")
    except PrepareError as e:
        print(f"ERROR: [{name}] {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"ERROR: [{name}] {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
