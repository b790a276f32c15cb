"""A seeded synthetic parallel corpus shaped like translation (data/README.md describes it): a
German-like source and an English-like target of pseudo-words, with agreement and reordering.
Only :class:`random.Random` with fixed seeds, no set or hash ordering: the same seed gives
byte-identical files on every Python; the lexicon (the "language pair") has a seed of its own.

    python scripts/synthetic.py --out data/synthetic --seed 1 [--binarize data/data-bin/synthetic]
    python scripts/synthetic.py --out data/synthetic-raw --seed 1 --raw   # as raw text, for prepare-text.sh
"""
import argparse
import bisect
import itertools
import os
import shutil
import subprocess
import sys
import random
import re
from pathlib import Path

# Source types per word class; comp: subordinating (a verb-final clause), conj: coordinating.
SIZES = {"noun": 1800, "adj": 450, "verb_t": 330, "verb_i": 170, "adv": 150, "prep": 25, "pron": 8,
         "comp": 6, "conj": 3}
N_CLASSES = 3
CLASS_WEIGHTS = (0.4, 0.35, 0.25)
ADJ_SUFFIXES = ("a", "o", "i")  # target adjective ending per noun class
MIN_LEN, MAX_LEN = 3, 60
LEXICON_SEED = 20240517

SRC_SOUNDS = (
    "b d f g h k l m n p r s t w z sch st kr pf br gr fl tr".split(),
    "a e i o u ei au ie ä ö ü".split(),
    ["", "", "n", "r", "l", "s", "t", "ch", "m", "ng"],
)
TGT_SOUNDS = (
    "b c d f g h j l m n p r s t v w th sh pl tr cl sp".split(),
    "a e i o u ea oo ay ow".split(),
    ["", "", "n", "r", "ll", "ss", "x", "ck", "nd", "st"],
)


def _pseudo_word(rng, sounds, n_syll, final_coda=None):
    onsets, nuclei, codas = sounds
    parts = []
    for i in range(n_syll):
        parts.append(rng.choice(onsets))
        parts.append(rng.choice(nuclei))
        if i == n_syll - 1:
            parts.append(rng.choice(codas) if final_coda is None else final_coda(rng))
        elif rng.random() < 0.25:
            parts.append(rng.choice(codas))
    return "".join(parts)


class Lexicon:
    """Word lists (index = Zipf rank), noun classes and translations."""

    def __init__(self, seed=LEXICON_SEED):
        rng = random.Random(seed)
        src_used, tgt_used = set(), set()

        def fresh(sounds, used, rank, final_coda=None, reserve=()):
            while True:
                n_syll = 1 if rank < 30 else 2 if rank < 400 else rng.choice((2, 3, 3))  # frequent: short
                w = _pseudo_word(rng, sounds, n_syll, final_coda)
                forms = [w] + [w + s for s in reserve]
                if len(w) >= 2 and not any(f in used for f in forms):
                    used.update(forms)
                    return w

        self.words = {}  # category -> [source word, ...] by Zipf rank
        self.noun_class = {}  # source noun -> 0..N_CLASSES-1
        self.tr = {}  # source word -> target string (may hold 2 words for adverbs)
        self.adj_forms = {}  # source adjective -> tuple of target forms per class
        # Target adjectives first: each reserves its stem and its class forms.
        consonant = lambda r: r.choice(["n", "r", "ll", "ss", "x", "ck", "nd", "st"])
        adj_stems = [fresh(TGT_SOUNDS, tgt_used, r, consonant, ADJ_SUFFIXES) for r in range(SIZES["adj"])]
        # Determiners: source has two (definite, indefinite), the target six.
        self.src_det = (fresh(SRC_SOUNDS, src_used, 0), fresh(SRC_SOUNDS, src_used, 0))
        self.tgt_det = tuple(tuple(fresh(TGT_SOUNDS, tgt_used, 0) for _ in range(N_CLASSES))
                             for _ in range(2))
        self.words["det"] = list(self.src_det)
        for cat in SIZES:
            ws = self.words[cat] = []
            for r in range(SIZES[cat]):
                s = fresh(SRC_SOUNDS, src_used, r)
                ws.append(s)
                if cat == "adj":
                    self.adj_forms[s] = tuple(adj_stems[r] + x for x in ADJ_SUFFIXES)
                    continue
                t = fresh(TGT_SOUNDS, tgt_used, r)
                if cat == "adv" and rng.random() < 0.2:
                    t = t + " " + fresh(TGT_SOUNDS, tgt_used, r)
                self.tr[s] = t
                if cat == "noun":
                    self.noun_class[s] = rng.choices(range(N_CLASSES), CLASS_WEIGHTS)[0]
        # Zipf sampling tables: weight 1/rank within each class.
        self._cum = {cat: list(itertools.accumulate(1.0 / (r + 1) for r in range(len(ws))))
                     for cat, ws in self.words.items()}

    def sample(self, rng, cat):
        cum = self._cum[cat]
        i = bisect.bisect_right(cum, rng.random() * cum[-1])
        return self.words[cat][min(i, len(cum) - 1)]


class Generator:
    """Draws sentence pairs from a :class:`Lexicon` with its own seed."""

    def __init__(self, lexicon, seed):
        self.lex = lexicon
        self.rng = random.Random(seed)

    def noun_phrase(self, allow_pronoun):
        rng, lex = self.rng, self.lex
        if allow_pronoun and rng.random() < 0.25:
            p = lex.sample(rng, "pron")
            return [p], [lex.tr[p]]
        definite = 0 if rng.random() < 0.6 else 1
        noun = lex.sample(rng, "noun")
        cls = lex.noun_class[noun]
        n_adj = rng.choices((0, 1, 2, 3), (0.55, 0.3, 0.12, 0.03))[0]
        adjs = [lex.sample(rng, "adj") for _ in range(n_adj)]
        src = [lex.src_det[definite]] + adjs + [noun]
        tgt = [lex.tgt_det[definite][cls], lex.tr[noun]] + [lex.adj_forms[a][cls] for a in adjs]
        return src, tgt

    def clause(self, subordinate):
        rng, lex = self.rng, self.lex
        subj_s, subj_t = self.noun_phrase(True)
        transitive = rng.random() < 0.6
        verb = lex.sample(rng, "verb_t" if transitive else "verb_i")
        adv_s, adv_t = [], []
        if rng.random() < 0.3:
            a = lex.sample(rng, "adv")
            adv_s, adv_t = [a], lex.tr[a].split()
        obj_s, obj_t = self.noun_phrase(False) if transitive else ([], [])
        pp_s, pp_t = [], []
        if rng.random() < 0.3:
            p = lex.sample(rng, "prep")
            np_s, np_t = self.noun_phrase(False)
            pp_s, pp_t = [p] + np_s, [lex.tr[p]] + np_t
        rest = adv_s + obj_s + pp_s
        src = subj_s + rest + [verb] if subordinate else subj_s + [verb] + rest  # verb-final / verb-second
        return src, subj_t + adv_t + [lex.tr[verb]] + obj_t + pp_t

    def pair(self):
        rng, lex = self.rng, self.lex
        while True:
            goal = MIN_LEN + int(rng.gammavariate(1.3, 10.0))  # mostly short, a long tail (TED/news)
            src, tgt = self.clause(False)
            while len(src) + 1 < goal:
                subordinate = rng.random() < 0.5  # ", COMP" + a verb-final clause, else CONJ + a main one
                link = lex.sample(rng, "comp" if subordinate else "conj")
                s, t = self.clause(subordinate)
                comma = [","] if subordinate else []
                src += comma + [link] + s
                tgt += comma + [lex.tr[link]] + t
            end = "?" if rng.random() < 0.08 else "."
            src.append(end)
            tgt.append(end)
            if MIN_LEN <= len(src) <= MAX_LEN and MIN_LEN <= len(tgt) <= MAX_LEN:
                return " ".join(src), " ".join(tgt)


def raw_line(line):
    """A tokenized lowercase line as a corpus a user brings holds it: capitalised, punctuation attached."""
    text = re.sub(r" ([,.?])", r"\1", line)
    return text[:1].upper() + text[1:]


def generate(out_dir, seed=1, n_train=20000, n_valid=500, n_test=500, raw=False):
    """Write ``{train,valid,test}.{src,tgt}`` (tokenized, lowercase; ``raw``: as :func:`raw_line` writes them) to
    out_dir; valid and test share no source sentence with train or each other. Returns {split: pairs}."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    gen = Generator(Lexicon(), seed)
    seen, counts = set(), {}
    for split, n in (("train", n_train), ("valid", n_valid), ("test", n_test)):
        pairs = []
        while len(pairs) < n:
            s, t = gen.pair()
            if split != "train" and s in seen:
                continue
            seen.add(s)
            pairs.append((s, t))
        for side, k in (("src", 0), ("tgt", 1)):
            tmp = out / f".{split}.{side}.tmp"
            with open(tmp, "w", encoding="utf-8", newline="\n") as f:
                f.writelines((raw_line(p[k]) if raw else p[k]) + "\n" for p in pairs)
            os.replace(tmp, out / f"{split}.{side}")
        counts[split] = n
    return counts


def binarize(out_dir, bin_dir):
    """Binarize a corpus of :func:`generate` into bin_dir (joined dictionary), through
    ``bin_dir.tmp`` renamed on success: an interrupted run leaves no half-written bin_dir."""
    out, dest = Path(out_dir), Path(bin_dir)
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    from normplug.tools.common import fairseq_exe  # next to the running python, else on PATH

    subprocess.run([fairseq_exe("fairseq-preprocess"), "--source-lang", "src", "--target-lang", "tgt",
                    "--trainpref", str(out / "train"), "--validpref", str(out / "valid"),
                    "--testpref", str(out / "test"), "--destdir", str(tmp),
                    "--joined-dictionary", "--workers", "1"], check=True)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="data/synthetic", help="output folder (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the sentence sampler")
    ap.add_argument("--train", type=int, default=20000, help="training pairs (default %(default)s)")
    ap.add_argument("--valid", type=int, default=500, help="validation pairs (default %(default)s)")
    ap.add_argument("--test", type=int, default=500, help="test pairs (default %(default)s)")
    ap.add_argument("--raw", action="store_true", help="write raw text (capitalised, punctuation attached), as a "
                    "corpus for scripts/prepare-text.sh")
    ap.add_argument("--binarize", metavar="BIN_DIR",
                    help="also run fairseq-preprocess --joined-dictionary into BIN_DIR")
    a = ap.parse_args(argv)
    if a.raw and a.binarize:
        ap.error("--binarize takes the tokenized text: prepare raw text with scripts/prepare-text.sh")
    print(f"synthetic: wrote {generate(a.out, a.seed, a.train, a.valid, a.test, a.raw)} to {a.out}", file=sys.stderr)
    if a.binarize:
        binarize(a.out, a.binarize)
        print(f"synthetic: binarized into {a.binarize}", file=sys.stderr)


if __name__ == "__main__":
    main()
