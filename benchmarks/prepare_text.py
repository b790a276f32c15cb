"""The encode step of scripts/prepare-text.sh at two corpus sizes: sentences a second, and the peak memory of the
process and its workers (their resident sets summed, sampled every 20 ms from /proc: Linux). Streaming keeps the
peak flat: the larger corpus's peak should be within 1.3x the smaller's.

    PYTHONPATH=scripts .venv/bin/python benchmarks/prepare_text.py [--sizes 50000 400000] [--workers 2] [--vocab-size 4000]

Each size is the seed-1 synthetic corpus (scripts/synthetic.py) as raw text, encoded in a fresh process by the
SentencePiece model trained once on the smaller corpus, its training pairs filtered as prepare-text.sh does.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

try:  # scripts/ on PYTHONPATH, which the encoding processes started here inherit
    import own_corpus
    import raw_text
    import synthetic
except ImportError as e:
    sys.exit(f"benchmarks/prepare_text.py: no module {e.name}: run it as PYTHONPATH=scripts .venv/bin/python "
             "benchmarks/prepare_text.py")


def tree_rss(root):
    """Resident memory (bytes) of process ROOT and its descendants."""
    parents, rss = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            parents[int(entry)] = int(fields[1])
            rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    tree, grew = {root}, True
    while grew:
        grown = tree | {p for p, parent in parents.items() if parent in tree}
        grew, tree = grown != tree, grown
    return sum(rss.get(p, 0) for p in tree)


def encode_child(model, prefix, out, workers):
    """The encode step on PREFIX.{src,tgt}, in this process: prints {"seconds", "pairs", "peak"}."""
    peak, done = [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], tree_rss(os.getpid()))
            time.sleep(0.02)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    files = {lang: Path(f"{prefix}.{lang}") for lang in ("src", "tgt")}
    pieces, raw = Path(out) / "pieces", Path(out) / "raw"
    pieces.mkdir(parents=True)
    raw.mkdir()
    t0 = time.time()
    sizes, _ = own_corpus.encode_train(Path(model), files, pieces, raw, frozenset(), (1, 250, 1.5), workers)
    seconds = time.time() - t0
    done.set()
    sampler.join()
    print(json.dumps({"seconds": seconds, "pairs": sizes["input_pairs"], "kept": sizes["pairs"], "peak": peak[0]}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs=2, default=[50000, 400000], help="training pairs of the two corpora")
    ap.add_argument("--workers", type=int, default=2, help="encoding processes (default %(default)s)")
    ap.add_argument("--vocab-size", type=int, default=4000, help="SentencePiece pieces (default %(default)s)")
    ap.add_argument("--child", nargs=4, metavar=("MODEL", "PREFIX", "OUT", "WORKERS"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return encode_child(*a.child[:3], int(a.child[3]))
    with tempfile.TemporaryDirectory() as tmp:
        tmp, rows = Path(tmp), []
        for n in a.sizes:
            synthetic.generate(tmp / str(n), seed=1, n_train=n, n_valid=1, n_test=1, raw=True)
        small = tmp / str(min(a.sizes)) / "train"
        sentences = raw_text.sample_pairs(Path(f"{small}.src"), Path(f"{small}.tgt"), 10 ** 9, 1)
        t0 = time.time()
        own_corpus.train_model(tmp / "spm", sentences, a.vocab_size, "unigram", 1.0, a.workers)
        print(f"spm-train: {len(sentences)} sentences, {a.vocab_size} pieces, {time.time() - t0:.1f} s")
        del sentences
        for n in a.sizes:
            proc = subprocess.run([sys.executable, __file__, "--child", str(tmp / "spm.model"),
                                   str(tmp / str(n) / "train"), str(tmp / f"out{n}"), str(a.workers)],
                                  capture_output=True, text=True, check=True)
            rows.append((n, json.loads(proc.stdout.strip().splitlines()[-1])))
    print(f"\nencode step, {a.workers} worker processes (sentences = both sides of each pair):\n")
    print("| training pairs | seconds | sentences/s | peak memory (process + workers) |")
    print("|---|---|---|---|")
    for n, r in rows:
        print(f"| {n:,} | {r['seconds']:.1f} | {2 * r['pairs'] / r['seconds']:,.0f} | {r['peak'] / 2 ** 20:.0f} MiB |")
    ratio = rows[1][1]["peak"] / rows[0][1]["peak"]
    print(f"\npeak memory at {rows[1][0]:,} pairs / at {rows[0][0]:,}: {ratio:.2f}x (target: within 1.3x) -> "
          f"{'met' if ratio <= 1.3 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
