"""The demo behind ``make demo``: the whole pipeline on a toy task, CPU.

1. corpus   seeded synthetic corpus (scripts/synthetic.py, seed 1), binarized (once)
2. train    LN, BN and RBN Post-Norm Transformers (configs/demo/{ln,bn,rbn}.yaml) side by
            side, through the driver's train() (normplug-recipe train)
3. evaluate the driver's evaluate() on each final checkpoint: sacreBLEU and tokenized BLEU
4. TID      normplug-tid on the epoch checkpoints of BN and RBN (valid split)
5. table    norm | BLEU | mean TID | var TID, printed and written to OUT/results.md

Everything goes under --out (default demo-out/ in the current directory). A second run reuses
the corpus and the finished trainings; --force redoes everything.
"""
import argparse
import csv
import json
import logging
import os
import re
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from normplug.recipes import child_env, evaluate, fmt, load_config, run_logged, train, write_atomic, write_csv
from normplug.tools.common import atomic_path, numbered_checkpoints

SCRIPTS = Path(__file__).resolve().parent
KINDS = ("ln", "bn", "rbn")
TID_KINDS = ("bn", "rbn")
SEED = 1


def say(msg=""):
    print(msg, flush=True)


def build_corpus(out: Path, train_pairs: int, force: bool):
    """The binarized corpus, and whether it was (re)built: runs on an older one are stale."""
    raw, binary = out / "data" / "synthetic", out / "data-bin" / "synthetic"
    stamp, log = binary / "normplug-demo.json", out / "logs" / "corpus.log"
    wanted = {"seed": SEED, "train": train_pairs, "valid": 500, "test": 500}
    if not force and stamp.exists() and json.loads(stamp.read_text()) == wanted:
        say(f"[corpus] {binary} already built (seed {SEED}, {train_pairs} training pairs): skipped")
        return binary, False
    say(f"[corpus] generating {train_pairs} training pairs (seed {SEED}) and binarizing ...")
    log.parent.mkdir(parents=True, exist_ok=True)
    rc, text = run_logged([sys.executable, str(SCRIPTS / "synthetic.py"), "--out", str(raw), "--seed", str(SEED),
                           "--train", str(train_pairs), "--valid", "500", "--test", "500",
                           "--binarize", str(binary)], log)
    if rc != 0:
        raise SystemExit(f"demo: corpus generation failed; see {log}\n{text[-2000:]}")
    write_atomic(stamp, json.dumps(wanted))
    return binary, True


def train_one(recipe, save: Path, data: Path, extra, threads: int):
    """The driver's train(), its progress shown as one line per validation."""
    t0, kind = time.time(), save.name

    def progress(line):
        m = re.search(r"epoch (\d+) \| valid on 'valid' subset \| loss ([\d.]+)", line)
        if m:
            say(f"[train] {kind:>3}: epoch {int(m[1]):>3}  valid loss {m[2]}  ({time.time() - t0:.0f}s)")

    rc = train(recipe, save, extra, data, gpu=False, threads=threads, echo=progress,
               log=lambda msg: say(f"[train] {kind:>3}: {msg}"))
    if rc != 0:
        tail = (save / "train.log").read_text(errors="replace").splitlines()[-25:]
        raise SystemExit(f"demo: training {kind} failed (exit {rc}); see {save / 'train.log'}\n" + "\n".join(tail))
    return time.time() - t0


def run_tid(out: Path, data: Path, recipe, kind: str):
    """normplug-tid on a run's epoch checkpoints (valid split) at the training batch size (TID
    depends on it). Returns [(epoch, mean TID, var TID)] averaged over the BN layers."""
    csv_path = out / f"tid-{kind}.csv"
    argv = [sys.executable, "-m", "normplug.tools.tid", *numbered_checkpoints(str(out / kind), "epoch"),
            "--data", str(data), "--split", "valid", "--max-tokens", str(recipe.train["max-tokens"]),
            "--csv", str(csv_path), "--plot", str(out / f"tid-{kind}.png"), "--cpu"]
    rc, text = run_logged(argv, out / kind / "tid.log", env=child_env(1))
    if rc != 0:
        raise SystemExit(f"demo: normplug-tid failed on {kind}; see {out / kind / 'tid.log'}\n{text[-2000:]}")
    layers = {}
    for r in csv.DictReader(open(csv_path, newline="")):
        layers.setdefault((int(r["num_updates"]), int(r["epoch"])), []).append(r)
    return [(epoch, *[sum(float(r[k]) for r in rows) / len(rows) for k in ("tid_mean", "tid_var")])
            for (_, epoch), rows in sorted(layers.items())]


def draw_comparison(tid_points, path: Path):
    """BN vs RBN: layer-averaged mean and variance TID over epochs, one figure."""
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # before the import logs
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), dpi=110)
    for i, (ax, what) in enumerate(zip(axes, ("mean", "variance"))):
        for kind, points in tid_points.items():
            ax.plot([p[0] for p in points], [p[1 + i] for p in points], marker="o", label=kind.upper())
        ax.set(xlabel="epoch", ylim=(0, None))
        ax.set_title(f"{what} TID (average over BN layers)", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("Demo: TID on the valid split over training, BN vs RBN (synthetic corpus)", fontsize=11)
    fig.tight_layout()
    with atomic_path(str(path)) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


def write_table(out: Path, scores, tid_points):
    """The demo's table (BLEU = sacreBLEU; TID of the final checkpoint), results.md and .csv."""
    rows = [{"norm": kind.upper(), "bleu": scores[kind]["sacrebleu"],
             "tokenized_bleu": scores[kind]["tokenized_bleu"],
             "tid_mean": tid_points[kind][-1][1] if kind in tid_points else None,
             "tid_var": tid_points[kind][-1][2] if kind in tid_points else None,
             "checkpoint": scores[kind]["checkpoint"]} for kind in KINDS]
    lines = ["| norm | BLEU | mean TID | var TID |", "|---|---|---|---|"]
    lines += [f"| {r['norm']} | {fmt(r['bleu'], 1)} | {fmt(r['tid_mean'], 4)} | {fmt(r['tid_var'], 4)} |" for r in rows]
    md = ["# normplug demo results", "",
          "Synthetic corpus (scripts/synthetic.py, seed 1); small Post-Norm Transformers trained on "
          "CPU (configs/demo/). BLEU = sacreBLEU on the test set (500 pairs); TID = training–inference "
          "discrepancy of the final checkpoint on the valid split, averaged over the BN layers "
          "(normplug-tid). LN has no BN layer: no TID.", "", *lines, "",
          f"sacreBLEU signature: `{scores['ln']['sacrebleu_signature']}`", "",
          "Tokenized BLEU (fairseq scorer): " + ", ".join(f"{r['norm']} {r['tokenized_bleu']:.1f}" for r in rows), ""]
    write_atomic(out / "results.md", "\n".join(md))
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

    t_start, timing = time.time(), {}
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    threads = args.threads or max(1, cores // len(KINDS))
    extra = ["--max-epoch", str(args.epochs)] if args.epochs else []
    configs = {kind: load_config(SCRIPTS.parent / "configs" / "demo" / f"{kind}.yaml") for kind in KINDS}
    say(f"normplug demo -> {out}  ({cores} cores)")

    t = time.time()
    data, rebuilt = build_corpus(out, args.train_pairs, args.force)
    timing["corpus"] = time.time() - t

    t = time.time()
    if rebuilt:
        for kind in KINDS:
            shutil.rmtree(out / kind, ignore_errors=True)
    say(f"[train] {', '.join(KINDS)} side by side ({threads} thread(s) each); logs: {out}/<norm>/train.log")
    with ThreadPoolExecutor(len(KINDS)) as pool:
        runs = {k: pool.submit(train_one, configs[k], out / k, data, extra, threads) for k in KINDS}
        train_seconds = {k: run.result() for k, run in runs.items()}
    timing["train"] = time.time() - t

    t = time.time()
    say("[eval] decoding the test set (beam 5) and scoring; [tid] normplug-tid on the BN/RBN epoch "
        "checkpoints (valid split) ...")
    with ThreadPoolExecutor(max(2, cores)) as pool:
        evals = {k: pool.submit(evaluate, configs[k], out / k, data, log=lambda msg: None) for k in KINDS}
        tids = {k: pool.submit(run_tid, out, data, configs[k], k) for k in TID_KINDS}
        scores = {k: run.result() for k, run in evals.items()}
        tid_points = {k: run.result() for k, run in tids.items()}
    for kind in KINDS:
        s = scores[kind]
        say(f"[eval] {kind:>3}: sacreBLEU {s['sacrebleu']:.1f}, tokenized BLEU {s['tokenized_bleu']:.1f}  "
            f"({Path(s['checkpoint']).name})")
    for kind in TID_KINDS:
        say(f"[tid] {kind:>3} mean/var TID by epoch: "
            + ", ".join(f"e{p[0]} {p[1]:.3f}/{p[2]:.3f}" for p in tid_points[kind]))
    draw_comparison(tid_points, out / "tid-bn-vs-rbn.png")
    timing["evaluate+tid"] = time.time() - t

    lines = write_table(out, scores, tid_points)
    say("\nFinal checkpoints; BLEU = sacreBLEU (test), TID on the valid split averaged over BN layers:\n")
    say("\n".join(lines))
    say(f"\nsacreBLEU signature: {scores['ln']['sacrebleu_signature']}")
    say("Times: " + ", ".join(f"{k} {v:.0f}s" for k, v in timing.items())
        + f"; total {time.time() - t_start:.0f}s (training per model: "
        + ", ".join(f"{k} {v:.0f}s" for k, v in train_seconds.items()) + ")")
    say(f"\nTable:    {out / 'results.md'} (and results.csv)")
    say(f"Figures:  {out / 'tid-bn-vs-rbn.png'} (BN vs RBN), {out / 'tid-bn.png'}, {out / 'tid-rbn.png'} (per layer)")
    say(f"Runs:     {out}/<ln|bn|rbn>/ (checkpoints, train.log, generate-*.txt, scores-*.json)\n")
    say("RBN uses the published Post-Norm weights (λ_μ=60, λ_σ=0): it penalises the gap between batch and "
        "population means only, so it should keep the mean TID small, not the variance TID.")
    say("A toy task: the pipeline end to end on a CPU, not the papers' numbers or their ranking (tiny models, "
        "synthetic data, one seed): see README.md, \"What `make demo` does\".")
    return 0


if __name__ == "__main__":
    sys.exit(main())
