"""scripts/prepare-ptb.sh and scripts/prepare-wikitext103.sh (the language-model corpora,
scripts/prepare.py's language_model_corpus).

The tests build small archives in the real layouts: a .tgz with Mikolov's
./simple-examples/data/ptb.{train,valid,test}.txt (and other members beside them), a
.zip with wikitext-103/wiki.{train,valid,test}.tokens in WikiText's format (" = Title = "
lines, blank lines, "@-@" and "@,@"). Counts are checked against figures worked out by
hand here and against fairseq-preprocess's own "N sents, M tokens" lines; the binarized
output is loaded with fairseq's Dictionary and indexed dataset.
"""
import hashlib
import json
import os
import re
import zipfile
from pathlib import Path

import pytest

import corpus_formats as formats
from conftest import lines, make_tgz, markers, needs_fairseq, sha
from textfiles import PrepareError

# --- PTB: Mikolov's layout and line format (a space before and after every line's words) ---

PTB_TRAIN = [" the cat sat on the mat ", " a dog <unk> N years ago ", " the dog sat on N mats ",
             " stock prices fell <unk> N N ", " the market sat "]
PTB_VALID = [" the dog sat on the mat ", " a cat fell "]
PTB_TEST = [" the <unk> sat ", " prices fell N years ", " a zebra sat "]  # zebra: not in train
# by hand: lines; words + one end of sentence a line; train's 16 distinct words + the end of sentence
PTB_COUNTS = {"train.lines": 5, "train.tokens": 27 + 5, "valid.lines": 2, "valid.tokens": 9 + 2,
              "test.lines": 3, "test.tokens": 10 + 3, "vocabulary": 17}
PTB_MEMBERS = ("train", "valid", "test")


def ptb_files(train=PTB_TRAIN, valid=PTB_VALID, test=PTB_TEST, drop=None):
    files = {"./simple-examples/README": "Simple examples of RNNLM usage\n",
             "./simple-examples/data/ptb.char.train.txt": "t h e _ c a t\n",
             "./simple-examples/models/swb.ngram.model": b"\x00\x01binary model",
             "./simple-examples/1-num/test.sh": "#!/bin/sh\n"}
    for split, text in (("train", train), ("valid", valid), ("test", test)):
        files[f"./simple-examples/data/ptb.{split}.txt"] = "".join(x + "\n" for x in text)
    files.pop(f"./simple-examples/data/ptb.{drop}.txt", None)
    return files


def make_ptb_archive(path, **kwargs):
    return make_tgz(path, ptb_files(**kwargs))


# --- WikiText-103: the zip's layout and WikiText's format ------------------------------

def wikitext_article(title, k):
    """An article as WikiText writes it: a blank line, ' = Title = ', blank, paragraphs and
    ' = = Section = = ' headings separated by blank lines; words and numbers split by
    '@-@' / '@,@' / '@.@'; <unk> for rare words."""
    return [" ", f" = {title} = ", " ",
            f" {title} is a tactical role @-@ playing video game released in 20{k:02d} . ",
            " ", " = = Gameplay = = ", " ",
            f" The game sold 1 @,@ {k}00 copies in its first week , a <unk> of 2 @.@ {k} % . ",
            f" Senjō no Valkyria {k} : <unk> Chronicles ( Japanese : 戦場のヴァルキュリア{k} ) . "]


WT_TRAIN = [x for k, t in enumerate(("Valkyria Chronicles III", "Tower Building", "Homarus gammarus"))
            for x in wikitext_article(t, k)]
WT_VALID = wikitext_article("Robert Boulter", 7)
WT_TEST = wikitext_article("Tower Building", 1)[:5]


def make_wikitext_zip(path, drop=None, stored=False, train=WT_TRAIN):
    """wikitext-103-v1.zip's layout: a wikitext-103/ folder entry and the three .tokens."""
    kind = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(zipfile.ZipInfo("wikitext-103/", date_time=(2016, 9, 26, 0, 0, 0)), b"")
        for split, text in (("train", train), ("valid", WT_VALID), ("test", WT_TEST)):
            if split != drop:
                info = zipfile.ZipInfo(f"wikitext-103/wiki.{split}.tokens", date_time=(2016, 9, 26, 0, 0, 0))
                z.writestr(info, "".join(x + "\n" for x in text).encode("utf-8"), compress_type=kind)
    return path


def wikitext_counts():
    """By hand: every article line holds the words below, blank lines none."""
    words = lambda text: sum(len(x.split()) for x in text)
    train_types = {w for x in WT_TRAIN for w in x.split()}
    return {"train.lines": len(WT_TRAIN), "train.tokens": words(WT_TRAIN) + len(WT_TRAIN),
            "valid.lines": len(WT_VALID), "valid.tokens": words(WT_VALID) + len(WT_VALID),
            "test.lines": len(WT_TEST), "test.tokens": words(WT_TEST) + len(WT_TEST),
            "vocabulary": len(train_types) + 1}


# --- the readers (corpus_formats.py) ------------------------------------------------------

def test_lm_stats_counts_lines_tokens_and_vocabulary_as_fairseq_reads_text(tmp_path):
    (tmp_path / "train").write_bytes("a  b\ta\n \n\nc\u00a0d\r\nlast b".encode("utf-8"))
    (tmp_path / "valid").write_bytes(b"x y\rz\n")  # a lone \r ends a line for fairseq (universal newlines)
    stats = formats.lm_stats([("train", tmp_path / "train", "t"), ("valid", tmp_path / "valid", "v")])
    # train: 5 lines ("a b a", "", "", "c d", "last b"), 7 words; types a b c d last
    assert stats == {"train.lines": 5, "train.tokens": 7 + 5, "valid.lines": 2, "valid.tokens": 3 + 2,
                     "vocabulary": 5 + 1}


def test_extract_members_from_tar_and_zip(tmp_path):
    tgz = make_ptb_archive(tmp_path / "ptb.tgz")
    zipped = make_wikitext_zip(tmp_path / "wt.zip")
    for archive, member, want in ((tgz, "simple-examples/data/ptb.valid.txt", PTB_VALID),
                                  (zipped, "wikitext-103/wiki.test.tokens", WT_TEST)):
        out = tmp_path / archive.stem
        out.mkdir()
        formats.extract_members(archive, [(member, "valid")], out)
        assert lines(out / "valid") == want and os.listdir(out) == ["valid"]
    with pytest.raises(PrepareError, match=r"ptb.tgz holds no simple-examples/data/ptb.train.tx\b"):
        formats.extract_members(tgz, [("simple-examples/data/ptb.train.tx", "x")], tmp_path)


# --- the scripts: options, sizes, bad archives ---------------------------------------------

def test_lm_corpora_take_no_subword_options(tmp_path, prepare):
    for dataset in ("ptb", "wikitext103"):
        r = prepare(dataset, "--bpe", "none", "--work", tmp_path / "w")
        assert r.returncode != 0 and len(r.errors) == 1, r.stderr
        assert "--bpe" in r.errors[0] and "--archive --work" in r.errors[0]  # the options it takes
        assert not (tmp_path / "w").exists()


def test_ptb_sizes_enforced_with_both_figures(tmp_path, prepare, unpublished):
    archive = make_ptb_archive(tmp_path / "ptb-small.tgz")
    work = tmp_path / "work"
    r = prepare("ptb", "--archive", archive, "--work", work, "--dest", tmp_path / "bin", "--no-binarize")
    err = r.errors
    assert r.returncode != 0 and len(err) == 1, r.stderr
    for figure in ("train has 5 lines, published 42068", "train has 32 tokens, published 929589",
                   "valid has 2 lines, published 3370", "valid has 11 tokens, published 73760",
                   "test has 3 lines, published 3761", "test has 13 tokens, published 82430",
                   "train has 17 words in its vocabulary (with the end of sentence), published 10000",
                   "--skip-size-check"):
        assert figure in err[0], figure
    assert markers(work) == ["fetch", "text"] and not (tmp_path / "bin").exists()  # nothing binarized
    # the text is each member as released, and its counts
    for split, want in zip(PTB_MEMBERS, (PTB_TRAIN, PTB_VALID, PTB_TEST)):
        assert lines(work / "text" / split) == want
    assert json.loads((work / "text" / "stats.json").read_text()) == PTB_COUNTS


@pytest.mark.slow
def test_ptb_published_sizes_pass(tmp_path, prepare, unpublished):
    """A corpus of exactly the published sizes passes: tokens count one end of sentence a
    line, the vocabulary counts the end of sentence (887,521 words, 9,999 types in train)."""
    vocab = [f"w{i}" for i in range(9998)] + ["<unk>"]
    words = iter(range(10**7))

    def corpus(n_lines, n_words):
        base, extra = divmod(n_words, n_lines)
        return [" " + " ".join(vocab[next(words) % len(vocab)] for _ in range(base + (i < extra))) + " "
                for i in range(n_lines)]

    archive = make_ptb_archive(tmp_path / "ptb-full.tgz", train=corpus(42068, 887521), valid=corpus(3370, 70390),
                               test=corpus(3761, 78669))
    r = prepare("ptb", "--archive", archive, "--work", tmp_path / "work", "--no-binarize")
    assert r.returncode == 0, r.stderr
    assert ("as published: train 42068 lines, train 929589 tokens, valid 3370 lines, "
            "valid 73760 tokens, test 3761 lines, test 82430 tokens, "
            "train 10000 words in its vocabulary (with the end of sentence)") in r.stderr


def ptb_bad_cases(tmp_path):
    good = make_ptb_archive(tmp_path / "good.tgz").read_bytes()
    return {  # name: (content, what the one ERROR line says)
        "truncated.tgz": (good[: len(good) // 2], "cannot read"),
        "page.tgz": (b"<!DOCTYPE html><html><head><title>403 Forbidden</title></head></html>\n", "cannot read"),
        "zipped.tgz": (make_wikitext_zip(tmp_path / "z.zip").read_bytes(), "holds no simple-examples/data/ptb.train.txt"),
        "latin1.tgz": (make_tgz(tmp_path / "l1.tgz", {**ptb_files(), "./simple-examples/data/ptb.test.txt":
                                                       " caf\xe9 \n".encode("latin-1")}).read_bytes(),
                       "simple-examples/data/ptb.test.txt in"),
    }


def wikitext_bad_cases(tmp_path):
    good = make_wikitext_zip(tmp_path / "good.zip", stored=True).read_bytes()
    flipped = bytearray(good)
    flipped[good.index("Valkyria".encode())] ^= 0x20  # 'V' -> 'v' inside a stored member
    return {
        "truncated.zip": (good[:-100], "cannot read"),
        "crc.zip": (bytes(flipped), "Bad CRC-32 for file 'wikitext-103/wiki.train.tokens'"),
        "no-test.zip": (make_wikitext_zip(tmp_path / "nt.zip", drop="test").read_bytes(),
                        "holds no wikitext-103/wiki.test.tokens"),
    }


@pytest.mark.parametrize("dataset,cases", [("ptb", ptb_bad_cases), ("wikitext103", wikitext_bad_cases)])
def test_lm_bad_archives(tmp_path, prepare, unpublished, dataset, cases):
    """Each stops with one ERROR line naming the file and what is wrong, and leaves no text
    and nothing binarized."""
    for name, (content, says) in cases(tmp_path).items():
        folder = tmp_path / name.replace(".", "-")
        folder.mkdir()
        bad, work = folder / name, folder / "work"
        bad.write_bytes(content)
        r = prepare(dataset, "--archive", bad, "--work", work, "--dest", folder / "bin", "--skip-size-check",
                    "--no-binarize")
        assert r.returncode != 0 and len(r.errors) == 1 and str(bad) in r.errors[0], (name, r.stderr)
        assert says in r.errors[0], (name, r.errors[0])
        assert markers(work) == ["fetch"], name


def test_lm_published_checksums_enforced(tmp_path, prepare):
    """Under any name, an --archive copy must have the published size and checksum: PTB's md5 (PaddlePaddle),
    WikiText-103's size (Hugging Face)."""
    ptb = make_ptb_archive(tmp_path / "ptb.tgz")
    wikitext = make_wikitext_zip(tmp_path / "wt.zip")
    for dataset, archive, says in (("ptb", ptb, f"has md5 {hashlib.md5(ptb.read_bytes()).hexdigest()}, not the "
                                                "published 30177ea32e27c525793142b6bf2c8e2d"),
                                   ("wikitext103", wikitext, f"has {wikitext.stat().st_size} bytes, not the "
                                                             "published 190229076")):
        r = prepare(dataset, "--archive", archive, "--work", tmp_path / dataset, "--no-binarize")
        assert r.returncode != 0 and len(r.errors) == 1, r.stderr
        assert f"{archive} {says}" in r.errors[0], r.errors[0]
        assert markers(tmp_path / dataset) == []


# --- the whole run: binarized, loaded with fairseq, re-run, resumed -------------------------

def fairseq_summaries(dest):
    """fairseq-preprocess's "[None] PATH: N sents, M tokens" lines: split -> (N, M)."""
    log = (Path(dest) / "preprocess.log").read_text()
    return {m[1]: (int(m[2]), int(m[3])) for m in re.finditer(r"/text/(\w+): (\d+) sents, (\d+) tokens", log)}


def check_binarized(dest, text, counts, dataset):
    """dest loads in fairseq: the dictionary of the training words (fairseq's specials,
    padding to a multiple of 8), one sentence a line, each the line's words and </s>."""
    from fairseq.data import Dictionary, data_utils

    d = Dictionary.load(str(dest / "dict.txt"))
    train_types = {w for x in lines(text / "train") for w in x.split()}
    n_words = len(train_types - {"<unk>"}) + 4  # <s> <pad> </s> <unk>
    assert len(d) == n_words + (-n_words) % 8 and len(d) % 8 == 0
    assert d.index("<unk>") == d.unk()
    info = json.loads((dest / "prepare.json").read_text())
    assert info["dictionary_size"] == len(d) and info["vocabulary"] == counts["vocabulary"]
    assert info["dataset"] == dataset and info["bpe"] == "none" and info["remove_bpe"] is None
    for split in PTB_MEMBERS:
        assert info["sizes"][split] == counts[f"{split}.lines"] and info["tokens"][split] == counts[f"{split}.tokens"]
        ds = data_utils.load_indexed_dataset(str(dest / split), d)
        text_lines = lines(text / split)
        assert len(ds) == len(text_lines) and int(ds.sizes.sum()) == counts[f"{split}.tokens"]
        for ids, line in zip(ds, text_lines):
            assert ids[-1] == d.eos()
            assert [d[i] for i in ids[:-1]] == [w if w in train_types else "<unk>" for w in line.split()]
    # fairseq's own counts are ours
    assert fairseq_summaries(dest) == {s: (counts[f"{s}.lines"], counts[f"{s}.tokens"]) for s in PTB_MEMBERS}
    return info


@pytest.mark.slow
@needs_fairseq
def test_ptb_binarized_then_rerun_is_a_no_op(tmp_path, prepare, unpublished):
    archive = make_ptb_archive(tmp_path / "ptb-small.tgz")
    work, dest = tmp_path / "work", tmp_path / "bin"
    args = ("--archive", archive, "--work", work, "--dest", dest, "--skip-size-check")
    r = prepare("ptb", *args)
    assert r.returncode == 0, r.stderr
    info = check_binarized(dest, work / "text", PTB_COUNTS, "ptb")
    assert info["dictionary_size"] == 24  # 4 specials, the 15 words other than <unk>, 5 padding
    assert info["sources"] == {"ptb-small.tgz": sha(archive)}
    assert info["size_check"].startswith("skipped: train has 5 lines, published 42068")
    assert "prepare-ptb.sh" in info["script"] and info["date"].endswith("Z")
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        ["dict.txt", "prepare.json", "preprocess.log"] + [f"{s}.{e}" for s in PTB_MEMBERS for e in ("bin", "idx")])
    assert markers(work, dest) == ["binarize", "fetch", "text"]
    before = {p.name: p.stat().st_mtime_ns for p in list(dest.iterdir()) + list(work.iterdir())}

    r = prepare("ptb", *args)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("done before, skipping") == 3 and "running" not in r.stderr, r.stderr
    assert {p.name: p.stat().st_mtime_ns for p in list(dest.iterdir()) + list(work.iterdir())} == before


@pytest.mark.slow
@needs_fairseq
def test_wikitext103_binarized(tmp_path, prepare, unpublished):
    archive = make_wikitext_zip(tmp_path / "wt103-small.zip")
    work, dest = tmp_path / "work", tmp_path / "bin"
    r = prepare("wikitext103", "--archive", archive, "--work", work, "--dest", dest, "--skip-size-check")
    assert r.returncode == 0, r.stderr
    counts = wikitext_counts()
    assert json.loads((work / "text" / "stats.json").read_text()) == counts
    for split, want in zip(PTB_MEMBERS, (WT_TRAIN, WT_VALID, WT_TEST)):
        assert lines(work / "text" / split) == want  # as released: titles, blank lines, @-@
    info = check_binarized(dest, work / "text", counts, "wikitext-103")
    assert info["sources"] == {"wt103-small.zip": sha(archive)}
    assert "1801350" in info["size_check"] and "103227021" in info["size_check"] and "267735" in info["size_check"]
