"""The demo behind ``make demo``: the whole pipeline on a toy task, CPU.

1. corpus   seeded synthetic corpus (scripts/synthetic.py, seed 1) written as raw text, prepared by
            scripts/prepare-text.sh (a joint SentencePiece model of 4,000 pieces, fairseq-preprocess) (once)
2. train    LN, BN and RBN Post-Norm Transformers (configs/demo/{ln,bn,rbn}.yaml), each with training seeds
            1 and 2 (--seeds), side by side, by the recipe driver's train() (normplug-recipe train --seeds)
3. evaluate the driver's evaluate() on each final checkpoint: fairseq-generate --post-process sentencepiece,
            sacreBLEU and chrF of the detokenized output against the raw references
4. TID      normplug-tid's measurement and figure (OUT/tid-bn-vs-rbn.png) of the BN and RBN epoch checkpoints
            of the first seed
5. table    norm | sacreBLEU | chrF | mean TID | var TID, mean ± sd over the seeds, printed and written to
            OUT/results.md
6. compare  BN and RBN against LN (normplug-recipe compare): sacreBLEU's paired bootstrap and approximate
            randomization on the test outputs, seed by seed and pooled, printed and written to OUT/compare-demo-ln.md

Everything goes under --out (default demo-out/). A second run reuses the corpus and the finished
trainings; --force redoes everything.
"""
import argparse
import json
import os
import re
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from normplug.recipes import (evaluate, fmt, load_config, run_logged, train, with_training_arguments, write_atomic,
                              write_csv)
from normplug.recipes.compare import compare
from normplug.recipes.table import mean_sd
from normplug.tools import tid
from normplug.tools.common import atomic_path, configure_logging, numbered_checkpoints

SCRIPTS = Path(__file__).resolve().parent
KINDS = ("ln", "bn", "rbn")
TID_KINDS = ("bn", "rbn")
SEED = 1  # the corpus's
TRAINING_SEEDS = (1, 2)
VOCAB_SIZE = 4000  # SentencePiece pieces, joint: the corpus has about 6,000 words (both sides)


def build_corpus(out: Path, train_pairs: int, force: bool, workers: int):
    """The prepared corpus, and whether it was (re)built: runs on an older one are stale."""
    raw, binary = out / "data" / "synthetic-raw", out / "data-bin" / "synthetic"
    stamp, log = binary / "normplug-demo.json", out / "logs" / "corpus.log"
    wanted = {"seed": SEED, "train": train_pairs, "valid": 500, "test": 500, "vocab_size": VOCAB_SIZE}
    if not force and stamp.exists() and json.loads(stamp.read_text()) == wanted:
        print(f"[corpus] {binary} already built (seed {SEED}, {train_pairs} training pairs): skipped")
        return binary, False
    print(f"[corpus] generating {train_pairs} training pairs (seed {SEED}) as raw text; scripts/prepare-text.sh "
          f"--vocab-size {VOCAB_SIZE} ...")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    for argv in ([sys.executable, str(SCRIPTS / "synthetic.py"), "--out", str(raw), "--seed", str(SEED), "--raw",
                  "--train", str(train_pairs), "--valid", "500", "--test", "500"],
                 ["bash", str(SCRIPTS / "prepare-text.sh"), "--source-lang", "src", "--target-lang", "tgt",
                  *[a for s in ("train", "valid", "test") for a in (f"--{s}pref", str(raw / s))],
                  "--vocab-size", str(VOCAB_SIZE), "--destdir", str(binary), "--workers", str(workers), "--force"]):
        rc, text = run_logged(argv, log, env={**os.environ, "PYTHON": sys.executable}, mode="a")
        if rc != 0:
            raise SystemExit(f"demo: preparing the corpus failed; see {log}\n{text[-2000:]}")
    write_atomic(stamp, json.dumps(wanted))
    return binary, True


def train_one(recipe, save: Path, threads: int):
    """The driver's train(), its progress shown as one line per validation."""
    t0, kind = time.time(), save.name.replace("-seed", "/")

    def progress(line):
        m = re.search(r"epoch (\d+) \| valid on 'valid' subset \| loss ([\d.]+)", line)
        if m:
            print(f"[train] {kind:>5}: epoch {int(m[1]):>3}  valid loss {m[2]}  ({time.time() - t0:.0f}s)")

    rc = train(recipe, save, gpu=False, threads=threads, echo=progress,
               log=lambda msg: print(f"[train] {kind:>5}: {msg}"))
    if rc != 0:
        raise SystemExit(f"demo: training {kind} failed (exit {rc}); see {save / 'train.log'}")
    return time.time() - t0


def run_tid(folder: Path, data: Path, recipe):
    """normplug-tid's measurement, in process, of a run's epoch checkpoints on the valid split at the
    training batch size (TID depends on it): [(CheckpointInfo, [LayerTID])], oldest first."""
    return tid.run(tid.build_parser().parse_args([*numbered_checkpoints(str(folder), "epoch"), "--data", str(data),
                                                  "--max-tokens", str(recipe.train["max-tokens"]), "--cpu"]))


def layer_means(results):  # [(epoch, mean TID, variance TID)], each averaged over the BN layers
    return [(info.epoch, *tid.mean_over_layers(layers)) for info, layers in results]


def write_table(out: Path, scores, seeds):
    """The demo's table (sacreBLEU and chrF; TID of the final checkpoint, as evaluate measured it), each the mean ±
    sample sd over the seeds; results.md, and results.csv with a row a run."""
    runs = [{"norm": kind.upper(), "seed": seed, **{key: scores[kind, seed].get(key) for key in
                                                    ("sacrebleu", "chrf", "tid_mean", "tid_var", "checkpoint")}}
            for kind in KINDS for seed in seeds]
    lines = ["| norm | sacreBLEU | chrF | mean TID | var TID |", "|---|---|---|---|---|"]
    for kind in KINDS:
        cells = [mean_sd([r[key] for r in runs if r["norm"] == kind.upper()]) if kind in TID_KINDS or "tid" not in key
                 else None for key in ("sacrebleu", "chrf", "tid_mean", "tid_var")]
        lines.append(f"| {kind.upper()} | " + " | ".join(fmt(c, d) for c, d in zip(cells, (1, 1, 4, 4))) + " |")
    first = scores[KINDS[0], seeds[0]]
    write_atomic(out / "results.md", "\n".join([
        "# normplug demo results", "", "Synthetic corpus (scripts/synthetic.py, seed 1) as raw text, prepared by "
        f"scripts/prepare-text.sh ({VOCAB_SIZE} SentencePiece pieces); small Post-Norm Transformers trained on CPU "
        "(configs/demo/). sacreBLEU and chrF: the test set (500 pairs) decoded with fairseq-generate --post-process "
        "sentencepiece, against the raw references; TID = training–inference discrepancy of the final checkpoint "
        f"on the valid split, averaged over the BN layers (LN has none). Training seeds {' '.join(map(str, seeds))}: "
        "mean ± sample sd (n); every run in results.csv.", "",
        *lines, "", f"sacreBLEU signature: `{first['sacrebleu_signature']}`",
        f"chrF signature: `{first['chrf_signature']}`", ""]))
    write_csv(out / "results.csv", runs, list(runs[0]))
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(prog="scripts/demo.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--out", default="demo-out", help="output folder (default %(default)s)")
    ap.add_argument("--train-pairs", type=int, default=20000, help="synthetic training pairs (default %(default)s)")
    ap.add_argument("--epochs", type=int, help="override the configs' max-epoch (5)")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(TRAINING_SEEDS), help="training seeds of each "
                    "norm (default: %(default)s)")
    ap.add_argument("--threads", type=int, help="threads per training (default: cores // trainings, at least 1)")
    ap.add_argument("--force", action="store_true", help="rebuild the corpus and retrain")
    args = ap.parse_args(argv)
    configure_logging(verbose=False)  # fairseq's and matplotlib's INFO logs of the in-process TID
    sys.stdout.reconfigure(line_buffering=True)  # progress lines show at once, through a pipe too

    t_start = time.time()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    seeds = args.seeds
    runs = [(kind, seed) for kind in KINDS for seed in seeds]
    threads = args.threads or max(1, cores // len(runs))
    extra = ["--max-epoch", str(args.epochs)] if args.epochs else []
    print(f"normplug demo -> {out}  ({cores} cores)")
    data, rebuilt = build_corpus(out, args.train_pairs, args.force, cores)
    configs = {(kind, seed): with_training_arguments(
        load_config(SCRIPTS.parent / "configs" / "demo" / f"{kind}.yaml", data), [*extra, "--seed", str(seed)])
        for kind, seed in runs}
    folders = {run: out / f"{run[0]}-seed{run[1]}" for run in runs}  # normplug-recipe's OUT/<name>-seed<S>
    if rebuilt:
        for folder in folders.values():
            shutil.rmtree(folder, ignore_errors=True)
    print(f"[train] {', '.join(KINDS)}, seeds {' '.join(map(str, seeds))}, side by side ({threads} thread(s) each); "
          f"logs: {out}/<norm>-seed<S>/train.log")
    with ThreadPoolExecutor(len(runs)) as pool:
        jobs = {run: pool.submit(train_one, configs[run], folders[run], threads) for run in runs}
        train_seconds = {run: job.result() for run, job in jobs.items()}

    print("[eval] decoding the test set (beam 5, --post-process sentencepiece) and scoring; [tid] TID of the BN/RBN "
          "epoch checkpoints (valid split)")
    with ThreadPoolExecutor(len(runs)) as pool:
        evals = {run: pool.submit(evaluate, configs[run], folders[run], gpu=False, log=lambda msg: None) for run in runs}
        tids = {k: run_tid(folders[k, seeds[0]], data, configs[k, seeds[0]]) for k in TID_KINDS}  # meanwhile
        scores = {run: job.result() for run, job in evals.items()}
    tid_points = {k: layer_means(results) for k, results in tids.items()}
    for kind, points in tid_points.items():
        print(f"[tid] {kind:>3} mean/var TID by epoch: " + ", ".join(f"e{e} {m:.3f}/{v:.3f}" for e, m, v in points))
    with atomic_path(str(out / "tid-bn-vs-rbn.png")) as tmp:
        tid.draw({k.upper(): tids[k] for k in TID_KINDS}, tmp, "valid")

    print("\nFinal checkpoints; sacreBLEU and chrF of the detokenized test output against the raw references; TID "
          "on the valid split averaged over BN layers:\n")
    print("\n".join(write_table(out, scores, seeds))
          + f"\n\nsacreBLEU signature: {scores['ln', seeds[0]]['sacrebleu_signature']}\nchrF signature: "
          f"{scores['ln', seeds[0]]['chrf_signature']}")
    print("\nBN and RBN against LN on the test set (normplug-recipe compare), seed by seed and pooled:\n")
    print("\n".join(compare(out, "demo-ln")[2:]))
    trained = ", ".join(f"{k}/{s} {v:.0f}s" for (k, s), v in train_seconds.items())
    print(f"Time: {time.time() - t_start:.0f}s (training {trained}"
          + f")\nTables: {out / 'results.md'} (and .csv), {out / 'compare-demo-ln.md'}; figure: "
          f"{out / 'tid-bn-vs-rbn.png'} (TID per layer over training, BN and RBN); runs: {out}/<ln|bn|rbn>-seed<S>/\n")
    print("RBN (λ_μ=60, λ_σ=0) penalises the gap between batch and population means only: it should keep the mean "
          "TID small, not the variance TID. A toy task: not the papers' numbers (README.md, What `make demo` does).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
