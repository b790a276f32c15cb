"""The seeded synthetic corpus: determinism, shape, and the rules it encodes."""
import collections
import hashlib
import math
import subprocess
import sys
from pathlib import Path

import pytest

import synthetic
from synthetic import Lexicon, generate

REPO = Path(__file__).resolve().parents[1]
FILES = [f"{s}.{side}" for s in ("train", "valid", "test") for side in ("src", "tgt")] + ["lexicon.tsv"]


def digest(d):
    return {f: hashlib.sha256((Path(d) / f).read_bytes()).hexdigest() for f in FILES}


def read(d, name):
    return (Path(d) / name).read_text(encoding="utf-8").split("\n")[:-1]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("syn") / "seed1"
    counts = generate(d, seed=1)  # the default sizes
    assert counts == {"train": 20000, "valid": 500, "test": 500}
    return d


@pytest.fixture(scope="module")
def lex():
    return Lexicon()


def test_same_seed_is_byte_identical_other_seed_differs(corpus, tmp_path):
    generate(tmp_path / "again", seed=1)
    assert digest(tmp_path / "again") == digest(corpus)
    generate(tmp_path / "seed2", seed=2)
    other = digest(tmp_path / "seed2")
    for f in FILES[:-1]:
        assert other[f] != digest(corpus)[f], f
    # the lexicon (the "language pair") does not depend on the sampling seed
    assert other["lexicon.tsv"] == digest(corpus)["lexicon.tsv"]
    # sizes are options
    counts = generate(tmp_path / "small", seed=1, n_train=100, n_valid=10, n_test=7)
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


def test_vocabulary_size_and_zipf(corpus, lex):
    counts = collections.Counter(w for line in read(corpus, "train.src") for w in line.split())
    assert 2000 <= len(counts) <= 4000, len(counts)
    assert set(counts) <= set(lex.source_types())
    freqs = sorted(counts.values(), reverse=True)
    xs = [math.log(r + 1) for r in range(10, 1000)]
    ys = [math.log(freqs[r]) for r in range(10, 1000)]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    assert -1.6 <= slope <= -0.7, slope
    tgt_types = {w for line in read(corpus, "train.tgt") for w in line.split()}
    assert 2000 <= len(tgt_types) <= 6000


def reference_translation(src, lex):
    """An independent re-implementation of the grammar: parse the source by word
    class and rebuild the target from the rules in the module docstring."""
    cat = lex.category
    toks = src.split()
    out, clause = [], []

    def np_at(i):
        """(target tokens, next index) of the noun phrase starting at i."""
        if cat[toks[i]] == "pron":
            return [lex.tr[toks[i]]], i + 1
        assert cat[toks[i]] == "det", (src, toks[i])
        definite = lex.src_det.index(toks[i])
        j = i + 1
        adjs = []
        while cat[toks[j]] == "adj":
            adjs.append(toks[j])
            j += 1
        noun = toks[j]
        assert cat[noun] == "noun"
        c = lex.noun_class[noun]
        return [lex.tgt_det[definite][c], lex.tr[noun]] + [lex.adj_forms[a][c] for a in adjs], j + 1

    def flush(start, end):
        units, i = [], start
        while i < end:
            c = cat[toks[i]]
            if c in ("det", "pron"):
                t, i = np_at(i)
                units.append(("np", t))
            elif c == "prep":
                t, j = np_at(i + 1)
                units.append(("pp", [lex.tr[toks[i]]] + t))
                i = j
            elif c in ("verb_t", "verb_i"):
                units.append(("verb", [lex.tr[toks[i]]]))
                i += 1
            elif c == "adv":
                units.append(("adv", lex.tr[toks[i]].split()))
                i += 1
            else:
                raise AssertionError((src, toks[i], c))
        assert i == end
        kinds = [k for k, _ in units]
        subj = units[0]
        assert subj[0] == "np"
        adv = [u for u in units if u[0] == "adv"]
        verb = [u for u in units if u[0] == "verb"]
        rest = [u for u in units[1:] if u[0] in ("np", "pp")]
        assert len(verb) == 1 and len(adv) <= 1
        return kinds, subj[1] + sum((u[1] for u in adv), []) + verb[0][1] + sum((u[1] for u in rest), [])

    start, subordinate = 0, False
    i = 0
    while i < len(toks):
        c = cat[toks[i]]
        if c == "conj" or (toks[i] == "," and cat[toks[i + 1]] == "comp") or toks[i] in (".", "?"):
            kinds, t = flush(start, i)
            # verb-second main clauses, verb-final subordinate clauses in the source
            if subordinate:
                assert kinds[-1] == "verb", src
            else:
                assert kinds[1] == "verb", src
            out += t
            if c == "conj":
                out.append(lex.tr[toks[i]])
                start, subordinate, i = i + 1, False, i + 1
            elif toks[i] == ",":
                out += [",", lex.tr[toks[i + 1]]]
                start, subordinate, i = i + 2, True, i + 2
            else:
                assert i == len(toks) - 1
                out.append(toks[i])
                i += 1
        else:
            i += 1
    return " ".join(out)


def test_target_follows_the_rules(corpus, lex):
    src, tgt = read(corpus, "train.src")[:3000], read(corpus, "train.tgt")[:3000]
    n_sub = 0
    for s, t in zip(src, tgt):
        assert reference_translation(s, lex) == t
        n_sub += any(lex.category[w] == "comp" for w in s.split())
    assert n_sub > 300  # verb-final clauses are common


def test_adjective_noun_swap_and_agreement(corpus, lex):
    """Each source 'DET ADJ+ NOUN' shows up in the target as the contiguous
    'DET(class) NOUN ADJ(class)+'."""
    swaps = 0
    for s, t in zip(read(corpus, "valid.src"), read(corpus, "valid.tgt")):
        ws, padded = s.split(), " " + t + " "
        for i, w in enumerate(ws):
            if lex.category[w] != "det" or lex.category[ws[i + 1]] != "adj":
                continue
            j = i + 1
            while lex.category[ws[j]] == "adj":
                j += 1
            noun, adjs = ws[j], ws[i + 1:j]
            c = lex.noun_class[noun]
            want = [lex.tgt_det[lex.src_det.index(w)][c], lex.tr[noun]] + [lex.adj_forms[a][c] for a in adjs]
            assert " " + " ".join(want) + " " in padded, (s, t, want)
            swaps += 1
    assert swaps > 100
    # the three classes all occur, so agreement is really conditional
    assert set(lex.noun_class.values()) == {0, 1, 2}


def test_not_word_by_word(corpus, lex):
    """Mapping each source word to a target word in place is wrong in most sentences."""
    def word_by_word(s):
        out = []
        for w in s.split():
            c = lex.category[w]
            if c == "det":
                out.append(lex.tgt_det[lex.src_det.index(w)][0])
            elif c == "adj":
                out.append(lex.adj_forms[w][0])
            else:
                out.append(lex.tr[w])
        return " ".join(out)

    src, tgt = read(corpus, "test.src"), read(corpus, "test.tgt")
    exact = sum(word_by_word(s) == t for s, t in zip(src, tgt))
    assert exact < 0.1 * len(src)
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
