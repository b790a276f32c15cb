"""A researcher's own corpus: scripts/prepare-text.sh on raw text the tests write (capitals, punctuation, digits,
umlauts and accents, an empty line, an over-long pair), its refusals, then `normplug-recipe reproduce
configs/text/rbn.yaml --data DIR` (a tiny model, 20 updates), the table's sacreBLEU and chrF, and a raw sentence
translated by fairseq-interactive --bpe sentencepiece, by the hub and by the README's "From Python" code. The filter and the scores are checked against
the sentencepiece and sacrebleu packages called here, the kept pairs against the rule written out in the test."""
import gzip
import json
import os
import random
import re
import subprocess
import sys

import pytest

import own_corpus
import prepare as prepare_script
import raw_text
from moses import length_rule
from conftest import REPO, TINY_MODEL, USER_DIR, needs_fairseq, run_cli
from test_lm_cli import lm_train_args

# source word -> target word: a toy German -> English lexicon with umlauts, ß and accents on both sides
LEXICON = {"der": "the", "bär": "bear", "straße": "street", "über": "over", "mädchen": "girl", "schön": "nice",
           "häuser": "houses", "grün": "green", "öl": "oil", "tür": "door", "café": "café", "zoë": "zoë",
           "läuft": "runs", "sieht": "sees", "und": "and", "mit": "with", "naïve": "naïve", "fährt": "drives"}
RAW_SENTENCE = "Der Bär läuft über die Straße, 3 Mal!"  # what the translation tests give the model


def raw_pair(rng):
    """A source sentence and its translation as raw text: capitalised, a comma and a final mark attached, a number."""
    words = [rng.choice(list(LEXICON)) for _ in range(rng.randint(2, 9))]
    number = str(rng.choice([3, 17, 2024, 1.5]))
    cut = rng.randint(1, len(words))
    mark = rng.choice(".!?")
    src = " ".join(words[:cut]) + ", " + " ".join(words[cut:] + [number])
    tgt = " ".join(LEXICON[w] for w in words[:cut]) + ", " + " ".join([LEXICON[w] for w in words[cut:]] + [number])
    return (src.strip(", ") + mark).capitalize(), (tgt.strip(", ") + mark).capitalize()


EMPTY, LONG, UNBALANCED = 3, 10, 20  # the training pairs the filter must drop


def write_raw_corpus(folder, sizes=(("train", 300), ("valid", 20), ("test", 20)), seed=0):
    """RAW/{train,valid,test}.{de,en}; train holds an empty pair, an over-long one and one of very unequal sides."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in sizes:
        pairs = [raw_pair(rng) for _ in range(n)]
        if split == "train":
            pairs[EMPTY] = ("", "")
            pairs[LONG] = (" ".join(["Straße"] * 300) + ".", " ".join(["street"] * 300) + ".")
            pairs[UNBALANCED] = ("Ja.", "Yes, the bear runs over the street and the girl sees the green door.")
        for k, lang in ((0, "de"), (1, "en")):
            (folder / f"{split}.{lang}").write_text("".join(p[k] + "\n" for p in pairs), encoding="utf-8")
    return folder


# --- refusals: one line, nothing written ------------------------------------------------------------------------

@pytest.fixture
def text_run(tmp_path, capsys):
    """text_run(*ARGS): scripts/prepare.py text -s de -t en --workers 1 ARGS on RAW/ (written once), in this
    process -> (exit status, its ERROR lines); DEST is tmp_path/bin unless given."""
    raw = write_raw_corpus(tmp_path / "raw", sizes=(("train", 60), ("valid", 5), ("test", 5)))

    def run(*args, dest=None):
        args = [a.replace("RAW", str(raw)) for a in map(str, args)]
        capsys.readouterr()
        code = prepare_script.main(["text", "-s", "de", "-t", "en", "--workers", "1", "--destdir",
                                    str(dest or tmp_path / "bin"), *args])
        return code, [x for x in capsys.readouterr().err.splitlines() if x.startswith("ERROR")]
    run.raw = raw
    return run


def refused(result, *needles):
    code, errors = result
    assert code == 1 and len(errors) == 1, errors
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
    return errors[0]


def nothing_written(tmp_path):
    return sorted(p.name for p in tmp_path.iterdir() if p.name != "raw") == []


SPLITS = ("--trainpref", "RAW/train", "--validpref", "RAW/valid", "--testpref", "RAW/test")


def test_refuses_unaligned_files_naming_both_counts(text_run, tmp_path):
    (text_run.raw / "train.en").write_text("".join(f"line {i}\n" for i in range(59)), encoding="utf-8")
    refused(text_run(*SPLITS, "--vocab-size", "60"), "train files are not line-aligned", "train.de has 60 lines",
            "train.en has 59")
    assert nothing_written(tmp_path)


def test_refuses_an_empty_or_missing_file(text_run, tmp_path):
    (text_run.raw / "test.en").write_bytes(b"")
    refused(text_run(*SPLITS), f"{text_run.raw / 'test.en'} is empty")
    refused(text_run("--trainpref", "RAW/nothere", "--testpref", "RAW/test"), "neither", "nothere.de nor",
            "nothere.de.gz")
    assert nothing_written(tmp_path)


def test_refuses_invalid_utf8_naming_file_and_line(text_run, tmp_path):
    lines = (text_run.raw / "valid.en").read_bytes().split(b"\n")
    lines[3] = b"caf\xe9 latin-1"
    (text_run.raw / "valid.en").write_bytes(b"\n".join(lines))
    refused(text_run(*SPLITS), f"{text_run.raw / 'valid.en'}, line 4: not UTF-8")
    # in a .gz too, and a character cut at the end of the file
    (text_run.raw / "valid.en").unlink()
    (text_run.raw / "valid.en.gz").write_bytes(gzip.compress(b"fine\nstill fine\n\xc3"))
    (text_run.raw / "valid.de").write_text("a\nb\nc\n", encoding="utf-8")
    refused(text_run(*SPLITS), "valid.en.gz, line 3: not UTF-8")
    assert nothing_written(tmp_path)


def test_refuses_a_vocabulary_the_corpus_cannot_fill_with_the_size_that_works(text_run, tmp_path):
    error = refused(text_run(*SPLITS, "--vocab-size", "5000"), "cannot fill 5000 unigram pieces",
                    "the largest that works is")
    largest = int(re.search(r"the largest that works is (\d+)", error)[1])
    error = refused(text_run(*SPLITS, "--vocab-size", "8"), "--vocab-size 8 is smaller than",
                    "the smallest that works is")
    smallest = int(re.search(r"the smallest that works is (\d+)", error)[1])
    assert nothing_written(tmp_path)
    # the sizes it names do train (sentencepiece itself, on the same text)
    sentences = raw_text.sample_pairs(text_run.raw / "train.de", text_run.raw / "train.en", 10 ** 6, 1)
    for size in (smallest, largest):
        own_corpus.train_model(tmp_path / f"spm{size}", sentences, size, "unigram", 1.0, 1)
    with pytest.raises(prepare_script.PrepareError, match="the largest that works"):
        own_corpus.train_model(tmp_path / "spm-over", sentences, largest + 1, "unigram", 1.0, 1)


def test_refuses_an_existing_destination_without_force(text_run, tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "mine.txt").write_text("keep me")
    refused(text_run(*SPLITS), f"{tmp_path / 'bin'} exists: pass --force")
    assert [p.name for p in (tmp_path / "bin").iterdir()] == ["mine.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "raw"]


def test_refuses_a_destination_that_holds_the_inputs_or_is_a_file(text_run, tmp_path):
    """--force replaces DESTDIR: never the folder of the corpus it reads."""
    before = sorted(p.name for p in text_run.raw.iterdir())
    refused(text_run(*SPLITS, "--force", dest=text_run.raw), f"--destdir {text_run.raw} holds the input")
    refused(text_run(*SPLITS, "--force", dest=tmp_path), f"--destdir {tmp_path} holds the input")
    assert sorted(p.name for p in text_run.raw.iterdir()) == before
    (tmp_path / "afile").write_text("keep me")
    refused(text_run(*SPLITS, "--force", dest=tmp_path / "afile"), "is a file")
    assert (tmp_path / "afile").read_text() == "keep me"


def test_refuses_bad_options_in_one_line(text_run, tmp_path):
    refused(text_run(*SPLITS, "--model-type", "char"), "--model-type", "'char'", "unigram", "bpe")
    refused(text_run(*SPLITS, "--ratio", "0.5"), "--ratio", "at least 1")
    refused(text_run(*SPLITS, "--character-coverage", "1.5"), "--character-coverage", "'1.5'", "(0, 1]")
    refused(text_run(*SPLITS, "--min-len", "10", "--max-len", "5"), "--min-len 10 is over --max-len 5")
    refused(text_run("--trainpref", "RAW/train", "--testpref", "RAW/test", "--valid-size", "31"),
            "--valid-size 31", "60 training pairs")
    assert nothing_written(tmp_path)


def test_refuses_a_test_line_longer_than_the_model_takes(text_run, tmp_path):
    """fairseq-generate would fail after training ("Size of sample #2 is invalid"): refused before, naming the split,
    line, side and its pieces."""
    lines = (text_run.raw / "test.de").read_text(encoding="utf-8").splitlines()
    lines[2] = " ".join(["Straße"] * 1100) + "."
    (text_run.raw / "test.de").write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    error = refused(text_run(*SPLITS, "--vocab-size", "70"), "test line 3 (de) is ",
                    "the model takes at most 1023 + </s>", str(text_run.raw / "test.de"))
    assert int(re.search(r"is (\d+) pieces", error)[1]) >= 1100
    assert nothing_written(tmp_path)


def test_refuses_blank_valid_and_test_lines(text_run, tmp_path):
    lines = (text_run.raw / "valid.en").read_text(encoding="utf-8").splitlines()
    lines[1] = " \t "
    (text_run.raw / "valid.en").write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    refused(text_run(*SPLITS), "valid line 2 (en) is blank", str(text_run.raw / "valid.en"))
    (text_run.raw / "test.de").write_text("\n" + "Ja.\n" * 4, encoding="utf-8")
    refused(text_run("--trainpref", "RAW/train", "--testpref", "RAW/test"), "test line 1 (de) is blank")
    assert nothing_written(tmp_path)


def test_force_replaces_only_a_folder_prepare_text_made(text_run, tmp_path):
    """The user's notes are never deleted: --force needs the prepare.json of prepare-text.sh in the folder."""
    notes = tmp_path / "bin" / "notes.txt"
    notes.parent.mkdir()
    notes.write_text("keep me")
    refused(text_run(*SPLITS, "--force"), f"{tmp_path / 'bin'} has no prepare.json", "--force replaces only")
    (tmp_path / "bin" / "prepare.json").write_text(json.dumps({"dataset": "iwslt14.de-en"}))
    refused(text_run(*SPLITS, "--force"), "--force replaces only a folder prepare-text.sh made")
    assert sorted(p.name for p in notes.parent.iterdir()) == ["notes.txt", "prepare.json"]
    assert notes.read_text() == "keep me"


def test_refuses_a_corpus_too_small_for_the_default_valid(text_run, tmp_path):
    for lang in ("de", "en"):
        (text_run.raw / f"small.{lang}").write_text("".join(f"Satz {i}.\n" for i in range(9)), encoding="utf-8")
    refused(text_run("--trainpref", "RAW/small", "--testpref", "RAW/test"), "--trainpref has 9 pairs",
            "--validpref")
    assert nothing_written(tmp_path)


def test_refuses_a_max_len_over_the_model_positions(text_run, tmp_path):
    refused(text_run(*SPLITS, "--max-len", "1024"), "--max-len 1024", "at most 1023")
    assert nothing_written(tmp_path)


def test_prepare_text_sh_names_the_missing_modules_and_python(tmp_path):
    """A Python without sentencepiece and normplug (site-packages and PYTHONPATH off) is refused in one line naming
    both and PYTHON=; one that has them runs."""
    bare = tmp_path / "python"
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -I -S \"$@\"\n")
    bare.chmod(0o755)
    script = REPO / "scripts" / "prepare-text.sh"
    proc = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": str(bare)})
    errors = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(errors) == 1, proc.stderr
    for needle in (f"{bare} lacks normplug, sentencepiece, fairseq", "PYTHON=/path/to/python"):
        assert needle in errors[0], errors[0]
    proc = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": sys.executable})
    assert proc.returncode == 0 and "--trainpref" in proc.stdout, proc.stderr


# --- the rules, against values written out here -----------------------------------------------------------------

def test_filter_is_clean_corpus_n_lengths_in_pieces_ratio_in_words():
    """clean-corpus-n.perl -ratio R MIN MAX (moses.length_rule, which tests/test_prepare.py checks against the perl
    script's output): a side outside MIN..MAX pieces, or over R times the other in words."""
    def rule(n_src, n_tgt, w_src, w_tgt, limits=(1, 250, 1.5)):
        return own_corpus.filter_reason((n_src, n_tgt, w_src, w_tgt), limits)
    assert rule(0, 3, 1, 1) == "length"
    assert rule(251, 251, 100, 100) == "length"
    assert rule(250, 250, 100, 100) is None
    assert rule(3, 2, 3, 2) is None  # 3/2 is not over 1.5
    assert rule(2, 2, 4, 2) == "ratio" and rule(2, 2, 2, 4) == "ratio"
    assert rule(3, 3, 9, 1, (1, 250, 9)) is None
    # issue 40: 10 and 18 pieces at a small vocabulary, 7 words each: kept
    de, en = "Der kleine Bäcker malt die langsame Katze.", "The little baker paints the slow cat."
    assert rule(10, 18, raw_text.count_words(de), raw_text.count_words(en)) is None
    assert rule(10, 18, 7, 7) is None and length_rule(10, 18, 1, 250, 1.5) == "ratio"


def test_words_are_whitespace_tokens_and_han_or_kana_characters():
    assert raw_text.count_words("Der kleine Bäcker malt die langsame Katze.") == 7
    assert raw_text.count_words("  l'homme,\tça va ! ") == 4
    assert raw_text.count_words("我爱你。") == 4  # 我 爱 你, and 。
    assert raw_text.count_words("東京タワーは 333 m") == 8  # 東 京 タ ワ ー は, 333, m
    assert raw_text.count_words("서울은 크다") == 2  # Hangul is written with spaces


def test_a_filter_that_drops_over_5_percent_says_so(capsys):
    own_corpus.note_filters({"pairs": 89, "input_pairs": 100, "dropped": {"length": 5, "ratio": 6}}, (1, 250, 1.5))
    lines = capsys.readouterr().err.splitlines()
    assert lines == [l for l in lines if "ratio filter dropped 6 of the 100 training pairs (6%)" in l] and lines


def test_model_positions_are_fairseqs_default():
    """A sentence fits when its pieces and the </s> fairseq appends fit the default positions of the models."""
    from fairseq.models.transformer import DEFAULT_MAX_SOURCE_POSITIONS, DEFAULT_MAX_TARGET_POSITIONS

    assert own_corpus.MAX_POSITIONS == DEFAULT_MAX_SOURCE_POSITIONS == DEFAULT_MAX_TARGET_POSITIONS
    assert own_corpus.over_positions((1023, 1023, 1, 1)) is None
    assert own_corpus.over_positions((1024, 3, 1, 1)) == 0 and own_corpus.over_positions((3, 1024, 1, 1)) == 1


def test_lines_and_line_ends_as_counted(tmp_path):
    """Lines split on \\n only; a CR before it (Windows) dropped; a last line without \\n counts."""
    path = tmp_path / "x.en"
    path.write_bytes("\ufeffGrüße\r\nzwei\u2028halb\n\ufeffohne Ende".encode("utf-8"))
    assert list(raw_text.read_text(path)) == ["Grüße", "zwei\u2028halb", "ohne Ende"]  # byte order marks dropped
    assert raw_text.check_file(path)[0] == 3


def test_sample_is_seeded_uniform_and_skips_held_out_pairs(tmp_path):
    for lang in ("de", "en"):
        (tmp_path / f"t.{lang}").write_text("".join(f"{lang}{i}\n" for i in range(1000)), encoding="utf-8")
    def draw(seed, skip=frozenset()):
        return raw_text.sample_pairs(tmp_path / "t.de", tmp_path / "t.en", 100, seed, skip)
    a = draw(1)
    assert a == draw(1) and a != draw(2) and len(a) == 200
    assert all(s[2:] == t[2:] for s, t in zip(a[::2], a[1::2]))  # pairs stay pairs
    picked = [int(s[2:]) for s in a[::2]]
    assert 350 < sum(picked) / 100 < 650  # not the first 100 lines
    assert not {int(s[2:]) for s in draw(1, frozenset(range(500)))[::2]} & set(range(500))


# --- end to end ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """RAW/ prepared by scripts/prepare-text.sh (the shell script, 2 workers): (raw, dest)."""
    root = tmp_path_factory.mktemp("own_corpus")
    raw, dest = write_raw_corpus(root / "raw"), root / "bin"
    for lang in ("de", "en"):  # a byte order mark, as an editor writes it, on both sides of the test text
        (raw / f"test.{lang}").write_text("\ufeff" + (raw / f"test.{lang}").read_text(encoding="utf-8"), "utf-8")
    proc = subprocess.run(["bash", str(REPO / "scripts" / "prepare-text.sh"), "-s", "de", "-t", "en",
                           "--trainpref", str(raw / "train"), "--validpref", str(raw / "valid"), "--testpref",
                           str(raw / "test"), "--vocab-size", "80", "--destdir", str(dest), "--workers", "2"],
                          capture_output=True, text=True, env={**os.environ, "PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return raw, dest


@pytest.fixture(scope="module")
def reproduced(prepared, tmp_path_factory):
    """`normplug-recipe reproduce configs/text/rbn.yaml --data DEST --out OUT -- <tiny model, 20 updates>` (the other
    configs differ in their arch and criterion only): (raw, dest, out)."""
    raw, dest = prepared
    out = tmp_path_factory.mktemp("own_runs")
    run_cli("normplug-recipe", "reproduce", REPO / "configs" / "text" / "rbn.yaml", "--data", dest, "--out", out,
            "--", *TINY_MODEL,
            "--max-update", "20", "--max-tokens", "500", "--warmup-updates", "5", "--lr", "0.003",
            "--num-workers", "0", "--data-buffer-size", "0", cwd=REPO)
    return raw, dest, out


def binarized_pieces(dest, split, lang):
    """The binarized SPLIT's LANG side, as the pieces fairseq holds, one string a sentence."""
    from fairseq.data import Dictionary, data_utils

    d = Dictionary.load(str(dest / f"dict.{lang}.txt"))
    data = data_utils.load_indexed_dataset(str(dest / f"{split}.de-en.{lang}"), d)
    return [d.string(data[i]) for i in range(len(data))]


@pytest.mark.slow
@needs_fairseq
def test_prepare_text_filters_train_only_and_keeps_the_raw_references(prepared):
    import sentencepiece as spm

    raw, dest = prepared
    info = json.loads((dest / "prepare.json").read_text(encoding="utf-8"))
    assert (info["source_lang"], info["target_lang"], info["bpe"], info["remove_bpe"]) == ("de", "en",
                                                                                            "sentencepiece",
                                                                                            "sentencepiece")
    assert info["sentencepiece"]["vocab_size"] == 80 and info["sentencepiece"]["model_type"] == "unigram"
    assert info["inputs"]["train"]["de"]["lines"] == 300 and len(info["inputs"]["test"]["en"]["sha256"]) == 64
    assert {"sentencepiece", "fairseq", "python"} <= set(info["versions"])
    sp = spm.SentencePieceProcessor(model_file=str(dest / "spm.model"))
    assert sp.get_piece_size() == 80
    # train: exactly the pairs the rule keeps (1..250 pieces a side, neither over 1.5 times the other in words: this
    # text's whitespace tokens), in order
    pairs = list(zip(*((raw / f"train.{lang}").read_text(encoding="utf-8").splitlines() for lang in ("de", "en"))))
    coded = [[sp.encode(side, out_type=str) for side in pair] for pair in pairs]
    words = [[len(side.split()) for side in pair] for pair in pairs]
    keep = [k for k, ((s, t), (ws, wt)) in enumerate(zip(coded, words)) if 1 <= len(s) <= 250 and 1 <= len(t) <= 250
            and ws <= 1.5 * wt and wt <= 1.5 * ws]
    assert EMPTY not in keep and LONG not in keep and UNBALANCED not in keep and len(keep) > 250
    for lang, k in (("de", 0), ("en", 1)):
        assert binarized_pieces(dest, "train", lang) == [" ".join(coded[i][k]) for i in keep]
    dropped = info["sizes"]["train"]["dropped"]
    too_long_or_empty = [k for k, (s, t) in enumerate(coded) if not (1 <= len(s) <= 250 and 1 <= len(t) <= 250)]
    assert info["sizes"]["train"]["pairs"] == len(keep) and dropped == {
        "length": len(too_long_or_empty), "ratio": 300 - len(keep) - len(too_long_or_empty)}
    assert EMPTY in too_long_or_empty and LONG in too_long_or_empty and dropped["ratio"] >= 1
    # valid and test whole, and their raw text kept beside them: the pieces decode to it, the byte order mark gone
    # from both (sacreBLEU would count it in the first word of the reference)
    for split in ("valid", "test"):
        for lang in ("de", "en"):
            text = (raw / f"{split}.{lang}").read_text(encoding="utf-8").replace("\ufeff", "")
            assert (dest / "raw" / f"{split}.{lang}").read_text(encoding="utf-8") == text
            assert [sp.decode(p.split()) for p in binarized_pieces(dest, split, lang)] == text.splitlines()
    assert info["references"]["test"] == "raw/test.en"
    assert not [p for p in dest.parent.iterdir() if p.name.endswith(".tmp")]  # the temporary folder is gone


@pytest.mark.slow
@needs_fairseq
def test_prepare_text_holds_out_valid_from_gzipped_train(tmp_path):
    raw = write_raw_corpus(tmp_path / "raw", sizes=(("train", 200), ("test", 10)))
    for lang in ("de", "en"):
        path = raw / f"train.{lang}"
        (raw / f"train.{lang}.gz").write_bytes(gzip.compress(path.read_bytes()))
        path.unlink()
    dest = tmp_path / "bin"
    (dest / "old").mkdir(parents=True)  # a folder prepare-text.sh made (its prepare.json), which --force replaces
    (dest / "prepare.json").write_text(json.dumps({"dataset": own_corpus.OWN_CORPUS}))
    assert prepare_script.main(["text", "-s", "de", "-t", "en", "--trainpref", str(raw / "train"), "--testpref",
                                str(raw / "test"), "--vocab-size", "70", "--valid-size", "15", "--seed", "3",
                                "--destdir", str(dest), "--workers", "1", "--force"]) == 0
    assert not (dest / "old").exists()  # --force replaced the folder
    train = list(zip(*(gzip.decompress((raw / f"train.{lang}.gz").read_bytes()).decode().splitlines()
                       for lang in ("de", "en"))))
    valid = list(zip(*((dest / "raw" / f"valid.{lang}").read_text(encoding="utf-8").splitlines()
                       for lang in ("de", "en"))))
    held = sorted(random.Random(3).sample(range(200), 15))
    assert EMPTY in held  # the empty pair is drawn: left out of valid, which is otherwise whole, in corpus order
    assert valid == [train[i] for i in held if i != EMPTY]
    info = json.loads((dest / "prepare.json").read_text(encoding="utf-8"))
    assert info["sizes"]["valid"]["pairs"] == 14 and info["sizes"]["train"]["input_pairs"] == 185
    assert info["sizes"]["valid"]["left_out_blank_or_too_long"] == 1
    assert len(binarized_pieces(dest, "train", "de")) == info["sizes"]["train"]["pairs"]


@pytest.mark.slow
@needs_fairseq
def test_data_digest_names_the_binarized_text_and_default_valid_is_a_tenth(tmp_path, capsys):
    """prepare.json's data_digest: the same text prepared again (into another folder) gives the same digest, other
    text into the same folder another one. Without --validpref the default valid is a tenth of 120 pairs, said so."""
    def prepare(raw, dest, *extra):
        capsys.readouterr()
        assert prepare_script.main(["text", "-s", "de", "-t", "en", "--trainpref", str(raw / "train"), "--testpref",
                                    str(raw / "test"), "--vocab-size", "70", "--destdir", str(dest), "--workers", "1",
                                    *extra]) == 0, capsys.readouterr().err[-2000:]
        info = json.loads((dest / "prepare.json").read_text(encoding="utf-8"))
        return info, capsys.readouterr().err

    sizes = (("train", 120), ("test", 10))
    first, second = write_raw_corpus(tmp_path / "a", sizes), write_raw_corpus(tmp_path / "b", sizes, seed=1)
    info, log = prepare(first, tmp_path / "one")
    assert re.fullmatch(r"[0-9a-f]{16}", info["data_digest"])
    assert info["sizes"]["valid"]["pairs"] == 12 and "12 of the 120 training pairs held out as valid" in log
    again, _ = prepare(first, tmp_path / "two")
    assert again["data_digest"] == info["data_digest"] and again["date"] != "" and again["script"] != info["script"]
    other, _ = prepare(second, tmp_path / "one", "--force")
    assert other["data_digest"] != info["data_digest"]


@pytest.mark.slow
@needs_fairseq
def test_reproduce_scores_sacrebleu_and_chrf_of_detokenized_output(reproduced):
    import sacrebleu

    raw, dest, out = reproduced
    refs = (raw / "test.en").read_text(encoding="utf-8").replace("\ufeff", "").splitlines()  # its byte order mark gone
    table = (out / "results.md").read_text(encoding="utf-8")
    for name in ("text-rbn",):
        log = (out / name / f"generate-{name}.txt").read_text(encoding="utf-8")
        hyps = {int(m[1]): m[2] for m in re.finditer(r"^H-(\d+)\t\S+\t(.*)$", log, flags=re.M)}
        hyps = [hyps[i] for i in range(len(refs))]
        assert not any("\u2581" in h for h in hyps)  # detokenized: no SentencePiece marks
        scores = json.loads((out / name / f"scores-{name}.json").read_text(encoding="utf-8"))
        assert scores["sacrebleu"] == round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)
        assert scores["chrf"] == round(sacrebleu.corpus_chrf(hyps, [refs]).score, 2)
        assert "tok:13a" in scores["sacrebleu_signature"] and "tokenized_bleu" not in scores
        assert str(raw / "test.en") not in scores["sacrebleu_references"]  # the copy in DEST/raw
        assert str(dest / "raw" / "test.en") in scores["sacrebleu_references"]
        row = next(line for line in table.splitlines() if line.startswith(f"| {name} "))
        assert f"| sacreBLEU ↑ | — | {scores['sacrebleu']:.2f} | — | chrF {scores['chrf']:.2f} |" in row, row
    assert "chrF `" in table and "--post-process sentencepiece" in table


@pytest.mark.slow
@needs_fairseq
def test_interactive_and_hub_translate_raw_text_to_detokenized_text(reproduced):
    """fairseq-interactive --bpe sentencepiece and TransformerModel.from_pretrained(bpe="sentencepiece") on a raw
    sentence: the same detokenized output, the SentencePiece decoding of the pieces the model produced."""
    import sentencepiece as spm
    from fairseq.models.transformer import TransformerModel

    raw, dest, out = reproduced
    sp = spm.SentencePieceProcessor(model_file=str(dest / "spm.model"))
    checkpoint = out / "text-rbn" / "checkpoint_best.pt"
    proc = run_cli("fairseq-interactive", dest, "--user-dir", USER_DIR, "--path", checkpoint, "--source-lang", "de",
                   "--target-lang", "en", "--bpe", "sentencepiece", "--sentencepiece-model", dest / "spm.model",
                   "--beam", "5", "--min-len", "3", "--cpu", input=RAW_SENTENCE + "\n")
    fields = {line.split("\t")[0]: line.split("\t") for line in proc.stdout.splitlines() if "\t" in line}
    assert fields["S-0"][1] == " ".join(sp.encode(RAW_SENTENCE, out_type=str))  # the raw sentence, encoded
    pieces, detok = fields["H-0"][2].split(), fields["D-0"][2]
    assert len(pieces) >= 3 and detok == sp.decode(pieces) and "\u2581" not in detok
    hub = TransformerModel.from_pretrained(str(out / "text-rbn"), checkpoint_file="checkpoint_best.pt",
                                           data_name_or_path=str(dest), user_dir=USER_DIR, bpe="sentencepiece",
                                           sentencepiece_model=str(dest / "spm.model"))
    assert hub.translate(RAW_SENTENCE, beam=5, min_len=3) == detok


def readme_python():
    """The code block of the README's "From Python" section."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("\n### From Python\n"):]
    return re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)


@pytest.mark.slow
@needs_fairseq
def test_readme_from_python_runs(reproduced, lm_data, tmp_path, capsys):
    """The README's code, with its checkpoint folders, data and sentences replaced by tiny ones: a BN (RBN) model
    trained on a scripts/prepare-text.sh corpus (tests/test_text.py), raw text in and detokenized text out."""
    _, text_data, text_runs = reproduced
    lm_checkpoint = tmp_path / "lm"  # and a BN language model of a few updates on the tiny LM corpus
    run_cli("fairseq-train", *lm_train_args(lm_data, lm_checkpoint, "transformer_lm_ptb_bn", "--criterion",
                                              "cross_entropy_rbn"))
    code = readme_python()
    replace = {"demo-out/bn-seed1": text_runs / "text-rbn", "demo-out/data-bin/synthetic": text_data,
               "demo-out/data-bin/synthetic/spm.model": text_data / "spm.model",
               "Pföt meim maut hech li maut.": RAW_SENTENCE, "runs/wang2022-ptb-post-rbn": lm_checkpoint,
               "data/data-bin/ptb": lm_data, "the company said": "w1 w2 w3", "the company": "w1 w2"}
    for literal, value in replace.items():
        assert f'"{literal}"' in code, literal
        code = code.replace(f'"{literal}"', repr(str(value)))
    capsys.readouterr()
    exec(compile(code, "README.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 3 and printed[0] and "\u2581" not in printed[0] and printed[2].startswith("w1 w2"), printed


# --- scoring: the raw references, not the binarized text ---------------------------------------------------------

def fake_data(folder, refs):
    (folder / "raw").mkdir(parents=True)
    (folder / "raw" / "test.en").write_text("".join(r + "\n" for r in refs), encoding="utf-8")
    (folder / "prepare.json").write_text(json.dumps({"source_lang": "de", "target_lang": "en"}), encoding="utf-8")
    return folder


def test_scores_detokenized_output_against_the_raw_references(tmp_path, monkeypatch):
    """sacreBLEU and chrF of the H- lines against DATA/raw/test.en, not against the T- lines (SentencePiece's
    NFKC-normalized text); fairseq-generate runs with --post-process sentencepiece and the data's languages."""
    from normplug.recipes import ConfigError, load_config, scoring

    refs = ["Das Büro hat 3 Räume.", "Oﬃce ½, Ｆlur!"]  # NFKC: "Office 1⁄2, Flur!"
    data = fake_data(tmp_path / "bin", refs)
    recipe = load_config(REPO / "configs" / "text" / "ln.yaml", data)
    assert (recipe.source_lang, recipe.target_lang) == ("de", "en")  # null in the config: prepare.json's
    generated = f"T-1\tOffice 1⁄2, Flur!\nH-1\t-0.2\t{refs[1]}\nT-0\t{refs[0]}\nH-0\t-0.1\t{refs[0]}\n"
    argvs = []
    monkeypatch.setattr(scoring, "run_checked", lambda argv, what, log: argvs.append(argv) or generated)
    scores = scoring.score_translation(recipe, tmp_path / "checkpoint_best.pt", tmp_path, log=lambda message: None)
    assert scores["sacrebleu"] == 100.0 and scores["chrf"] == 100.0 and "tokenized_bleu" not in scores
    argv = argvs[0]
    assert argv[argv.index("--post-process") + 1] == "sentencepiece" and "--remove-bpe" not in argv
    assert argv[argv.index("--source-lang") + 1] == "de" and argv[argv.index("--target-lang") + 1] == "en"
    (data / "raw" / "test.en").write_text("one line\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="decoded 2 sentences .* has 1 lines"):
        scoring.score_translation(recipe, tmp_path / "checkpoint_best.pt", tmp_path, log=lambda message: None)


def test_text_configs_need_a_prepare_text_folder(tmp_path):
    from normplug.recipes import ConfigError, check_data, load_config

    plain = tmp_path / "plain"
    plain.mkdir()
    recipe = load_config(REPO / "configs" / "text" / "bn.yaml", plain)
    with pytest.raises(ConfigError, match="source_lang and target_lang are null.*has none"):
        check_data(recipe)
    data = fake_data(tmp_path / "bin", ["x"])
    with pytest.raises(ConfigError, match="lacks dict.de.txt"):
        check_data(load_config(REPO / "configs" / "text" / "bn.yaml", data))
