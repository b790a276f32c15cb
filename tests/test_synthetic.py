"""The seeded synthetic corpus: determinism, shape, and the properties a model must learn from it."""
import collections
import hashlib
import math
import subprocess
import sys
from pathlib import Path

import pytest

import synthetic
from conftest import lines as read_lines
from synthetic import Lexicon, generate

REPO = Path(__file__).resolve().parents[1]
FILES = [f"{s}.{side}" for s in ("train", "valid", "test") for side in ("src", "tgt")]
# sha256 of the default corpus at seed 1 (train.src, train.tgt): the demo's figures were made on it
SEED1 = {"train.src": "a7df406159f23d0d2bc57fe214ff6f1800f63b5c4bd20541851cb3753803a51a",
         "train.tgt": "4f5a1e0357528d9c4cc65c8b5ac794ff90f9d87c5177a2e6e309014a9159730a"}


def digest(d):
    return {f: hashlib.sha256((Path(d) / f).read_bytes()).hexdigest() for f in FILES}


def read(d, name):
    return read_lines(Path(d) / name)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("syn") / "seed1"
    assert generate(d, seed=1) == {"train": 20000, "valid": 500, "test": 500}  # the default sizes
    return d


@pytest.fixture(scope="module")
def lex():
    return Lexicon()


@pytest.fixture(scope="module")
def category(lex):
    return {w: cat for cat, ws in lex.words.items() for w in ws}


def test_same_seed_is_byte_identical_other_seed_differs(corpus, tmp_path):
    assert {f: digest(corpus)[f] for f in SEED1} == SEED1
    generate(tmp_path / "seed2", seed=2)
    other = digest(tmp_path / "seed2")
    for f in FILES:
        assert other[f] != digest(corpus)[f], f
    generate(tmp_path / "small", seed=1, n_train=100, n_valid=10, n_test=7)
    assert [len(read(tmp_path / "small", f"{s}.src")) for s in ("train", "valid", "test")] == [100, 10, 7]


def test_lines_aligned_and_lengths(corpus):
    lengths = []
    for s in ("train", "valid", "test"):
        src, tgt = read(corpus, f"{s}.src"), read(corpus, f"{s}.tgt")
        assert len(src) == len(tgt)
        for a, b in zip(src, tgt):
            assert a == a.lower() and b == b.lower() and a == a.strip() and "  " not in a
            assert 3 <= len(a.split()) <= 60 and 3 <= len(b.split()) <= 60
            lengths.append(len(a.split()))
    assert min(lengths) == 3 and max(lengths) >= 55
    mean = sum(lengths) / len(lengths)
    median = sorted(lengths)[len(lengths) // 2]
    assert 14 <= mean <= 24, mean
    assert median < mean  # skewed towards short sentences, long tail
    assert sum(n <= 20 for n in lengths) > 0.5 * len(lengths)
    assert sum(n > 40 for n in lengths) > 0.01 * len(lengths)


def test_vocabulary_size_and_zipf(corpus, category):
    counts = collections.Counter(w for line in read(corpus, "train.src") for w in line.split())
    assert 2000 <= len(counts) <= 4000, len(counts)
    assert set(counts) <= set(category) | {".", ",", "?"}
    freqs = sorted(counts.values(), reverse=True)
    xs = [math.log(r + 1) for r in range(10, 1000)]
    ys = [math.log(freqs[r]) for r in range(10, 1000)]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    assert -1.6 <= slope <= -0.7, slope
    tgt_types = {w for line in read(corpus, "train.tgt") for w in line.split()}
    assert 2000 <= len(tgt_types) <= 6000


def test_target_holds_each_source_words_translation_in_its_class(corpus, lex, category):
    """The same words in another order: every source word's translation, determiners and adjectives in the
    class of the noun they go with (the next noun)."""
    for s, t in zip(read(corpus, "valid.src"), read(corpus, "valid.tgt")):
        ws, want = s.split(), []
        for i, w in enumerate(ws):
            if category.get(w) in ("det", "adj"):
                c = lex.noun_class[next(x for x in ws[i:] if category.get(x) == "noun")]
                want.append(lex.tgt_det[lex.src_det.index(w)][c] if category[w] == "det" else lex.adj_forms[w][c])
            else:
                want += lex.tr[w].split() if w in category else [w]
        assert sorted(want) == sorted(t.split()), (s, t)


def test_adjective_noun_swap_and_agreement(corpus, lex, category):
    """Each source 'DET ADJ+ NOUN' shows up in the target as the contiguous
    'DET(class) NOUN ADJ(class)+'."""
    swaps = 0
    for s, t in zip(read(corpus, "valid.src"), read(corpus, "valid.tgt")):
        ws, padded = s.split(), " " + t + " "
        for i, w in enumerate(ws):
            if category.get(w) != "det" or category.get(ws[i + 1]) != "adj":
                continue
            j = i + 1
            while category[ws[j]] == "adj":
                j += 1
            noun, adjs = ws[j], ws[i + 1:j]
            c = lex.noun_class[noun]
            want = [lex.tgt_det[lex.src_det.index(w)][c], lex.tr[noun]] + [lex.adj_forms[a][c] for a in adjs]
            assert " " + " ".join(want) + " " in padded, (s, t, want)
            swaps += 1
    assert swaps > 100
    assert set(lex.noun_class.values()) == {0, 1, 2}  # all three classes occur: agreement is conditional


def test_source_clauses_verb_second_or_verb_final(corpus, category):
    """Main clauses put the verb right after the subject, clauses after ', COMP' put it last."""
    n_sub = 0
    for s in read(corpus, "train.src")[:3000]:
        clauses, sub = [[]], [False]
        for w in s.split()[:-1]:
            if w == "," or category[w] in ("conj", "comp"):
                if clauses[-1]:
                    clauses.append([])
                    sub.append(False)
                sub[-1] = category.get(w) == "comp"
            else:
                clauses[-1].append(w)
        for ws, subordinate in zip(clauses, sub):
            kinds = [category[w] for w in ws]
            subject_end = 0 if kinds[0] == "pron" else kinds.index("noun")
            verb = kinds.index("verb_t") if "verb_t" in kinds else kinds.index("verb_i")
            assert verb == (len(ws) - 1 if subordinate else subject_end + 1), (s, ws)
            n_sub += subordinate
    assert n_sub > 300  # verb-final clauses are common


def test_not_word_by_word(corpus, lex, category):
    """Mapping each source word to a target word in place is wrong in most sentences."""
    def word_by_word(s):
        out = []
        for w in s.split():
            c = category.get(w)
            out.append(lex.tgt_det[lex.src_det.index(w)][0] if c == "det" else lex.adj_forms[w][0] if c == "adj"
                       else lex.tr.get(w, w))
        return " ".join(out)

    src, tgt = read(corpus, "test.src"), read(corpus, "test.tgt")
    assert sum(word_by_word(s) == t for s, t in zip(src, tgt)) < 0.1 * len(src)
    pos = tot = 0
    for s, t in zip(src, tgt):
        a, b = word_by_word(s).split(), t.split()
        pos += sum(x == y for x, y in zip(a, b))
        tot += len(b)
    assert pos / tot < 0.6


def test_valid_and_test_unseen_in_train(corpus):
    train = set(read(corpus, "train.src"))
    valid, test = read(corpus, "valid.src"), read(corpus, "test.src")
    assert not train & set(valid) and not train & set(test) and not set(valid) & set(test)


@pytest.mark.slow
def test_cli_and_binarize(tmp_path):
    """The command line (in-process: `python scripts/synthetic.py` calls the
    same main), with --binarize when fairseq-preprocess is installed."""
    out, dest = tmp_path / "syn", tmp_path / "bin"
    have_fairseq = (Path(sys.executable).parent / "fairseq-preprocess").exists()
    synthetic.main(["--out", str(out), "--seed", "3", "--train", "300", "--valid", "30", "--test", "30"]
                   + (["--binarize", str(dest)] if have_fairseq else []))
    assert len(read(out, "train.tgt")) == 300 and len(read(out, "test.src")) == 30
    if have_fairseq:
        for f in ("dict.src.txt", "dict.tgt.txt", "train.src-tgt.src.bin", "test.src-tgt.tgt.idx"):
            assert (dest / f).exists(), f
        assert (dest / "dict.src.txt").read_bytes() == (dest / "dict.tgt.txt").read_bytes()
        assert not (tmp_path / "bin.tmp").exists()


def test_runs_as_a_file_without_normplug_imports(tmp_path):
    """The generator is plain Python: run by path it needs neither torch nor fairseq."""
    r = subprocess.run(
        [sys.executable, "-S", str(REPO / "scripts" / "synthetic.py"), "--out", str(tmp_path),
         "--train", "50", "--valid", "5", "--test", "5"],
        capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert len(read(tmp_path, "valid.src")) == 5
