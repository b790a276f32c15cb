"""The demo behind ``make demo``: the whole pipeline on a toy task, CPU.

1. corpus   seeded synthetic corpus (scripts/synthetic.py, seed 1) written as raw text, prepared by
            scripts/prepare-text.sh (a joint SentencePiece model of 4,000 pieces, fairseq-preprocess) (once)
2. train    LN, BN and RBN Post-Norm Transformers (configs/demo/{ln,bn,rbn}.yaml) side by side, by the
            recipe driver's train() (normplug-recipe train)
3. evaluate the driver's evaluate() on each final checkpoint: fairseq-generate --post-process sentencepiece,
            sacreBLEU and chrF of the detokenized output against the raw references
4. TID      normplug-tid's measurement and figure (OUT/tid-bn-vs-rbn.png) of the BN and RBN epoch checkpoints
5. table    norm | sacreBLEU | chrF | mean TID | var TID, printed and written to OUT/results.md
6. compare  BN and RBN against LN (normplug-recipe compare): sacreBLEU's paired bootstrap and approximate
            randomization on the test outputs, printed and written to OUT/compare-demo-ln.md

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
from normplug.tools import tid
from normplug.tools.common import atomic_path, configure_logging, numbered_checkpoints

SCRIPTS = Path(__file__).resolve().parent
KINDS = ("ln", "bn", "rbn")
TID_KINDS = ("bn", "rbn")
SEED = 1
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
    t0, kind = time.time(), save.name

    def progress(line):
        m = re.search(r"epoch (\d+) \| valid on 'valid' subset \| loss ([\d.]+)", line)
        if m:
            print(f"[train] {kind:>3}: epoch {int(m[1]):>3}  valid loss {m[2]}  ({time.time() - t0:.0f}s)")

    rc = train(recipe, save, gpu=False, threads=threads, echo=progress,
               log=lambda msg: print(f"[train] {kind:>3}: {msg}"))
    if rc != 0:
        raise SystemExit(f"demo: training {kind} failed (exit {rc}); see {save / 'train.log'}")
    return time.time() - t0


def run_tid(out: Path, data: Path, recipe, kind: str):
    """normplug-tid's measurement, in process, of a run's epoch checkpoints on the valid split at the
    training batch size (TID depends on it): [(CheckpointInfo, [LayerTID])], oldest first."""
    return tid.run(tid.build_parser().parse_args([*numbered_checkpoints(str(out / kind), "epoch"), "--data", str(data),
                                                  "--max-tokens", str(recipe.train["max-tokens"]), "--cpu"]))


def layer_means(results):  # [(epoch, mean TID, variance TID)], each averaged over the BN layers
    return [(info.epoch, *tid.mean_over_layers(layers)) for info, layers in results]


def write_table(out: Path, scores):
    """The demo's table (sacreBLEU and chrF; TID of the final checkpoint, as evaluate measured it), results.md and
    .csv."""
    rows = [{"norm": kind.upper(), "sacrebleu": scores[kind]["sacrebleu"], "chrf": scores[kind]["chrf"],
             "tid_mean": scores[kind].get("tid_mean"), "tid_var": scores[kind].get("tid_var"),
             "checkpoint": scores[kind]["checkpoint"]} for kind in KINDS]
    lines = ["| norm | sacreBLEU | chrF | mean TID | var TID |", "|---|---|---|---|---|"]
    lines += [f"| {r['norm']} | {fmt(r['sacrebleu'], 1)} | {fmt(r['chrf'], 1)} | {fmt(r['tid_mean'], 4)} | "
              f"{fmt(r['tid_var'], 4)} |" for r in rows]
    write_atomic(out / "results.md", "\n".join([
        "# normplug demo results", "", "Synthetic corpus (scripts/synthetic.py, seed 1) as raw text, prepared by "
        f"scripts/prepare-text.sh ({VOCAB_SIZE} SentencePiece pieces); small Post-Norm Transformers trained on CPU "
        "(configs/demo/). sacreBLEU and chrF: the test set (500 pairs) decoded with fairseq-generate --post-process "
        "sentencepiece, against the raw references; TID = training–inference discrepancy of the final checkpoint "
        "on the valid split, averaged over the BN layers (LN has none).", "",
        *lines, "", f"sacreBLEU signature: `{scores['ln']['sacrebleu_signature']}`",
        f"chrF signature: `{scores['ln']['chrf_signature']}`", ""]))
    write_csv(out / "results.csv", rows, list(rows[0]))
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(prog="scripts/demo.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--out", default="demo-out", help="output folder (default %(default)s)")
    ap.add_argument("--train-pairs", type=int, default=20000, help="synthetic training pairs (default %(default)s)")
    ap.add_argument("--epochs", type=int, help="override the configs' max-epoch (5)")
    ap.add_argument("--threads", type=int, help="threads per training (default: cores // 3, at least 1)")
    ap.add_argument("--force", action="store_true", help="rebuild the corpus and retrain")
    args = ap.parse_args(argv)
    configure_logging(verbose=False)  # fairseq's and matplotlib's INFO logs of the in-process TID
    sys.stdout.reconfigure(line_buffering=True)  # progress lines show at once, through a pipe too

    t_start = time.time()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    threads = args.threads or max(1, cores // len(KINDS))
    extra = ["--max-epoch", str(args.epochs)] if args.epochs else []
    print(f"normplug demo -> {out}  ({cores} cores)")
    data, rebuilt = build_corpus(out, args.train_pairs, args.force, cores)
    configs = {kind: with_training_arguments(load_config(SCRIPTS.parent / "configs" / "demo" / f"{kind}.yaml", data),
                                             extra) for kind in KINDS}
    if rebuilt:
        for kind in KINDS:
            shutil.rmtree(out / kind, ignore_errors=True)
    print(f"[train] {', '.join(KINDS)} side by side ({threads} thread(s) each); logs: {out}/<norm>/train.log")
    with ThreadPoolExecutor(len(KINDS)) as pool:
        runs = {k: pool.submit(train_one, configs[k], out / k, threads) for k in KINDS}
        train_seconds = {k: run.result() for k, run in runs.items()}

    print("[eval] decoding the test set (beam 5, --post-process sentencepiece) and scoring; [tid] TID of the BN/RBN "
          "epoch checkpoints (valid split)")
    with ThreadPoolExecutor(len(KINDS)) as pool:
        evals = {k: pool.submit(evaluate, configs[k], out / k, gpu=False, log=lambda msg: None) for k in KINDS}
        tids = {k: run_tid(out, data, configs[k], k) for k in TID_KINDS}  # meanwhile, in this thread
        scores = {k: run.result() for k, run in evals.items()}
    tid_points = {k: layer_means(results) for k, results in tids.items()}
    for kind, points in tid_points.items():
        print(f"[tid] {kind:>3} mean/var TID by epoch: " + ", ".join(f"e{e} {m:.3f}/{v:.3f}" for e, m, v in points))
    with atomic_path(str(out / "tid-bn-vs-rbn.png")) as tmp:
        tid.draw({k.upper(): tids[k] for k in TID_KINDS}, tmp, "valid")

    print("\nFinal checkpoints; sacreBLEU and chrF of the detokenized test output against the raw references; TID "
          "on the valid split averaged over BN layers:\n")
    print("\n".join(write_table(out, scores))
          + f"\n\nsacreBLEU signature: {scores['ln']['sacrebleu_signature']}\nchrF signature: "
          f"{scores['ln']['chrf_signature']}")
    print("\nBN and RBN against LN on the test set (normplug-recipe compare; one seed a norm: README.md, What "
          "`make demo` does, says what several would cost):\n")
    print("\n".join(compare(out, "demo-ln")[2:]))
    trained = ", ".join(f"{k} {v:.0f}s" for k, v in train_seconds.items())
    print(f"Time: {time.time() - t_start:.0f}s (training {trained}"
          + f")\nTables: {out / 'results.md'} (and .csv), {out / 'compare-demo-ln.md'}; figure: "
          f"{out / 'tid-bn-vs-rbn.png'} (TID per layer over training, BN and RBN); runs: {out}/<ln|bn|rbn>/\n")
    print("RBN (λ_μ=60, λ_σ=0) penalises the gap between batch and population means only: it should keep the mean "
          "TID small, not the variance TID. A toy task: not the papers' numbers (README.md, What `make demo` does).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
