"""The GPU check: one run on one GPU that says whether each fused Triton norm is correct and
faster than its torch path, and how training compares with stock fairseq; the last line gives
each part's time (benchmarks/README.md has the estimates: it has never run on a GPU).

1. ``--verify`` (benchmarks/gpu_verify.py): every fused norm, Triton against its torch path and
   a float64 reference, fp32/fp16/bf16, five shapes, three paddings, a non-contiguous input,
   running buffers, padding rows, two runs bitwise, three compiled steps against eager.
   About 430 cases, most of the time compiling Triton specialisations and inductor graphs.
2. ``--speed`` (benchmarks/gpu_speed.py): forward+backward with triton.testing.do_bench at
   (N, C) = (4096, 512), (8192, 1024), (32768, 1024), (8192, 4096) in fp16 and bf16: torch eager,
   torch compiled and Triton, as ratios to nn.LayerNorm, with GB/s and peak memory.
3. ``--train``: words/s of fairseq's ``--fp16`` trainer against the stock model of the same
   shape and Post/Pre-Norm, on a synthetic corpus at max tokens 4096: by default the kinds of
   the 0.95× target (bn, rbn, pn) in the translation family, ``--updates`` (40) updates each,
   each plugin model once per ``--impls`` (torch, triton). The full table of every architecture,
   ``--train --kinds all --families translation,lm --updates 100 --fp32-updates 30
   --lm-updates 50 --lm-fp32-updates 20``, needs a larger ``--budget``.

With no part named, all three run. ``--budget`` seconds (450) bound the run: each part has a
deadline (verify 40%, speed 75%, train 100% of it, shares of the parts chosen), after which it
skips what is left with a line saying so; gpu_check.sh kills the run 30 s after the budget.
Rows print as they are measured; then one line per fused norm:

    VERDICT <norm> correct=yes|no worst=<largest gap, as a fraction of its tolerance> speed=<ratio>

speed is the largest Triton ÷ torch-eager time of that norm over the sizes timed (below 1:
Triton faster). ``--smoke`` shrinks every part so that it runs on the CPU: under
TRITON_INTERPRET=1 the verify part runs the kernels in Triton's interpreter; the speed part
says n/a.

    benchmarks/gpu_check.sh                     # on a CUDA machine: all three parts
    benchmarks/gpu_check.sh --verify            # correctness only, the whole budget
    TRITON_INTERPRET=1 benchmarks/gpu_check.sh --smoke --verify   # the script itself, on the CPU
"""
import argparse
import math
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

import families  # benchmarks/, this script's folder
import gpu_speed
import gpu_verify
import norms

PARTS = {"verify": 0.40, "speed": 0.35, "train": 0.25}  # each part's share of --budget

# the training recipe's flags that differ by family: IWSLT's dropout (the language models'
# architectures set their reference's)
RECIPE = {"translation": ["--dropout", "0.3"], "lm": []}
SMOKE_MODEL = {
    "translation": ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32",
                    "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
                    "--encoder-attention-heads", "4", "--decoder-attention-heads", "4"],
    "lm": ["--decoder-layers", "1", "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64",
           "--decoder-attention-heads", "4"],
}


def emit(rows, row):
    rows.append(row)
    print("| " + " | ".join(row) + " |", flush=True)


def train(data, family, run, plugin, updates, device, smoke, fp16, impl="torch"):
    """``updates`` updates with fairseq's Trainer, the plugin's fused norms in ``impl``;
    returns (words/s, all losses finite)."""
    from fairseq import tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    # the plugin's models train with the RBN criterion at zero weights (TID logged, loss unchanged)
    criterion = ["--criterion", f"{run.criterion}_rbn", "--power-warmup", str(updates // 2),
                 "--norm-impl", impl] if plugin else ["--criterion", run.criterion]
    args = families.parse(run, data, [
        *criterion, *(["--fp16"] if fp16 else []), *RECIPE[family], "--optimizer", "adam",
        "--adam-betas", "(0.9, 0.98)", "--lr", "5e-4", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "100",
        "--max-tokens", "4096", "--seed", "1", "--num-workers", "0", "--data-buffer-size", "0",
        "--save-dir", str(Path(data).parent / "save"), *(SMOKE_MODEL[family] if smoke else []),
        *(["--cpu"] if device == "cpu" else [])])
    (Path(data).parent / "save").mkdir(exist_ok=True)  # fairseq saves crash.pt there on divergence
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    model, criterion = task.build_model(cfg.model), task.build_criterion(cfg.criterion)
    trainer = Trainer(cfg, task, model, criterion)
    epoch = trainer.get_train_iterator(epoch=1, load_dataset=True)
    losses = []
    try:
        wps = _train_loop(trainer, epoch, updates, device, losses)
    except Exception as err:  # fp16: the loss scale fell to its minimum (fairseq's crash handling may raise on)
        if isinstance(err, FloatingPointError) or isinstance(err.__context__, FloatingPointError):
            return None, False
        raise
    return wps, all(math.isfinite(v) for v in losses) and all(
        torch.isfinite(p).all() for p in trainer.model.parameters()) and len(losses) > updates // 2


def _train_loop(trainer, epoch, updates, device, losses):
    """Run ``updates`` updates, appending each logged loss to ``losses``; returns words/s
    after the first 5 updates."""
    tokens, done, start = 0, 0, None
    while done < updates:
        for sample in epoch.next_epoch_itr(shuffle=True):
            if done == 5 and start is None:  # the first updates warm up (allocator, cuDNN, loss scale)
                if device == "cuda":
                    torch.cuda.synchronize()
                start, tokens = time.perf_counter(), 0
            log = trainer.train_step([sample])
            if log is not None:  # None: fp16 overflow, the update was skipped and the scale lowered
                losses.append(log["loss"])
            tokens += sample["ntokens"]
            done += 1
            if done == updates:
                break
        epoch = trainer.get_train_iterator(epoch=epoch.next_epoch_idx, load_dataset=False)
    if device == "cuda":
        torch.cuda.synchronize()
    return tokens / (time.perf_counter() - start)


def training_rows(family, device, passes, smoke, rows, kinds=None, impls=("torch",), deadline=math.inf):
    """``passes``: (updates, fp16) pairs; every architecture of ``family`` runs each pass in turn,
    each plugin architecture once per implementation in ``impls``, until ``deadline``."""
    with tempfile.TemporaryDirectory() as tmp:
        data = families.corpus(family, Path(tmp), 1000 if smoke else 20000)
        runs = families.runs(family, data, kinds)
        # untimed warm-up of each stock model over as many batches as a timed run: otherwise the
        # first timed run of a shape pays for the allocator and cuBLAS meeting each batch shape
        # (stock Post-Norm ran 3× slower than every other model on an H200 after a 20-update warm-up)
        for label, run in runs.items():
            if label == run.baseline and time.monotonic() < deadline:
                train(data, family, run, False, passes[0][0], device, smoke, passes[0][1])
        for updates, fp16 in passes:
            wps = {}
            for label, run in runs.items():
                plugin = label != run.baseline
                for impl in impls if plugin else ("torch",):
                    row = norms.label(label, impl)
                    part = f"train {updates} updates {'fp16' if fp16 else 'fp32'}"
                    if time.monotonic() > deadline:
                        wps[row] = None
                        emit(rows, (part, row, "not run", "", "the check's deadline passed"))
                        continue
                    wps[row], finite = train(data, family, run, plugin, updates, device, smoke, fp16, impl)
                    if wps[row] is None:
                        emit(rows, (part, row, "diverged", "", "fp16 loss scale at its minimum"))
                    else:
                        stock = wps.get(run.baseline)
                        emit(rows, (part, row, f"{wps[row]:,.0f} words/s",
                                    f"{wps[row] / stock:.2f} × stock" if stock else "",
                                    "finite" if finite else "NaN/inf"))


def main(argv=None):
    from normplug.models.architectures import KINDS
    from normplug.norms.impl import interpreting

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for part in PARTS:
        ap.add_argument(f"--{part}", action="store_true", help=f"run the {part} part (default: all three)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--budget", type=float, default=450, help="seconds the parts may take (default %(default)s)")
    ap.add_argument("--families", default="translation",
                    help=f"comma-separated families to train (default: %(default)s; {', '.join(families.FAMILIES)})")
    ap.add_argument("--kinds", default="bn,rbn,pn", help="comma-separated architecture kinds to train, or all")
    ap.add_argument("--updates", type=int, default=40, help="fp16 updates of each translation architecture")
    ap.add_argument("--fp32-updates", type=int, default=0, help="float32 updates of each (0: none)")
    ap.add_argument("--lm-updates", type=int, default=40, help="fp16 updates of each language model")
    ap.add_argument("--lm-fp32-updates", type=int, default=0, help="float32 updates of each (0: none)")
    ap.add_argument("--impls", default=",".join(norms.IMPLS),
                    help="implementations the plugin models train with, comma-separated (default: %(default)s)")
    ap.add_argument("--norms", default=",".join(gpu_verify.NORMS),
                    help="comma-separated fused norms to verify and time (default: all)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, to check the script (CPU: TRITON_INTERPRET=1)")
    args = ap.parse_args(argv)
    chosen = args.families.split(",")
    kinds = None if args.kinds == "all" else args.kinds.split(",")
    wanted = args.impls.split(",")
    checked = args.norms.split(",")
    for values, valid, what in ((chosen, families.FAMILIES, "family"), (kinds or [], KINDS, "kind"),
                                (wanted, norms.IMPLS, "impl"), (checked, gpu_verify.NORMS, "norm")):
        for value in values:
            if value not in valid:
                ap.error(f"unknown {what} {value!r}; choose from {', '.join(valid)}")
    if args.device == "cpu" and not args.smoke:
        ap.error("the GPU check needs --device cuda (or --smoke)")
    parts = [part for part in PARTS if getattr(args, part)] or list(PARTS)
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)  # fairseq's INFO lines would bury the table
    start = time.monotonic()
    # each part's deadline: its share of the budget, after the shares of the parts before it
    shares = [PARTS[part] for part in parts]
    deadline = {part: start + args.budget * sum(shares[:i + 1]) / sum(shares) for i, part in enumerate(parts)}
    name = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    impls, skipped = norms.available_impls(args.device, tuple(wanted))
    versions = f"torch {torch.__version__} (CUDA {torch.version.cuda})"
    try:
        versions += f", triton {__import__('triton').__version__}"
    except ImportError:
        pass
    print(f"normplug GPU check on {name}, {versions}, {time.strftime('%Y-%m-%d')}, parts: "
          f"{', '.join(parts)}, budget {args.budget:.0f} s", flush=True)
    rows, seconds, verdicts, speeds = [], {}, {}, ({}, 0)
    try:
        if "verify" in parts:
            if args.device == "cpu" and not interpreting():
                print("verify: not run: the Triton kernels need a CUDA device, or TRITON_INTERPRET=1 on the CPU")
            else:
                gpu_verify.verify(args.device, args.smoke, deadline["verify"], checked,
                                  emit=lambda line: print(line, flush=True), verdicts=verdicts)
            seconds["verify"] = time.monotonic() - start
        if "speed" in parts or "train" in parts:
            print("| part | name | value | ratio | check |\n|---|---|---|---|---|", flush=True)
        if "speed" in parts:
            part_start = time.monotonic()
            speeds = gpu_speed.speed(args.device, lambda row: emit(rows, row), args.smoke, deadline["speed"],
                                     checked)
            seconds["speed"] = time.monotonic() - part_start
        if "train" in parts:
            train_part(args, chosen, kinds, impls, skipped, rows, seconds, deadline["train"])
    except KeyboardInterrupt:  # gpu_check.sh's hard limit (SIGINT): report what was measured
        print(f"interrupted after {time.monotonic() - start:.0f} s: what follows covers what ran", flush=True)
    report(rows, seconds, verdicts, speeds if "speed" in parts else None, checked, time.monotonic() - start)
    wrong = [norm for norm, verdict in verdicts.items() if not verdict.correct]
    bad = [row for row in rows if row[4] == "NaN/inf" or row[2] == "failed"]
    return 1 if bad or wrong else 0


def train_part(args, chosen, kinds, impls, skipped, rows, seconds, deadline):
    """The training rows of each chosen family."""
    for line in skipped:
        print(line, flush=True)
    updates = {"translation": (args.updates, args.fp32_updates), "lm": (args.lm_updates, args.lm_fp32_updates)}
    for family in chosen:
        fp16_updates, fp32_updates = updates[family]
        # fairseq's fp16 trainer needs CUDA: a smoke run on the CPU is float32 only
        passes = [(10, False)] if args.smoke and args.device == "cpu" else \
            [(10 if args.smoke else fp16_updates, True)] + \
            ([(10 if args.smoke else fp32_updates, False)] if fp32_updates else [])
        family_start = time.monotonic()
        training_rows(family, args.device, passes, args.smoke, rows, kinds, impls, deadline)
        seconds[family] = time.monotonic() - family_start


def report(rows, seconds, verdicts, speeds, checked, elapsed):
    """The VERDICT lines, each part's time, and the rows that failed; ``speeds``: what the speed
    part returned, None if it did not run."""
    ratios, sizes = speeds or ({}, 0)
    print("worst = the largest gap over the verify cases; speed = the largest Triton ÷ torch-eager "
          + (f"forward+backward time over {sizes} sizes (below 1: Triton faster)" if sizes
             else "time, n/a: " + ("no size timed" if speeds else "the speed part did not run")))
    for norm in checked:
        verdict = verdicts.get(norm) or gpu_verify.Verdict(norm)
        ratio = ratios.get(norm)
        print(verdict.line("n/a" if ratio is None else "failed" if math.isinf(ratio) else f"{ratio:.2f}"),
              flush=True)
    times = ", ".join(f"{part} {s:.0f} s" for part, s in seconds.items())
    print(f"{len(rows)} rows in {elapsed:.0f} s ({times})")
    bad = [row[1] for row in rows if row[4] == "NaN/inf"]
    failed = [f"{row[0]} {row[1]}" for row in rows if row[2] == "failed"]
    if bad:
        print(f"NaN or inf in: {', '.join(bad)}")
    if failed:
        print(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    sys.exit(main())
