"""The GPU check: one table, estimated at 7–9 minutes on one H200 with one implementation of
the fused norms (``--impls triton``), the language models about 1 of them; the default, torch
and triton, trains each plugin model twice (not yet timed whole: the last line gives each
part's time). Split it with --impls, --families, --skip-norms, --kinds and --fp32-updates 0
where one call must be shorter.

1. The norm benchmark (benchmarks/norms.py) in float32 and float16, eager and compiled, each
   fused norm in its torch and its Triton implementation (``--impls``), as ratios to eager
   nn.LayerNorm.
2. For each family of benchmarks/families.py (``--families``): every architecture and the
   stock fairseq model it is compared with trains with fairseq's ``--fp16`` trainer (loss
   scaling, float32 master weights), then in float32, on the family's synthetic corpus at
   max tokens 4096: every logged loss and the final parameters finite, and words/s against
   the stock model of the same shape, Pre/Post-Norm and precision. Each plugin model trains
   once per ``--impls`` (``--norm-impl torch``, then ``--norm-impl triton``: rows "… triton"),
   which doubles this part; ``--impls triton`` times the fused kernels alone.

   * ``translation``: ``--updates`` (100) and ``--fp32-updates`` (30) updates of every
     ``transformer_iwslt_de_en_*`` architecture and of fairseq's ``transformer_iwslt_de_en``
     (Post- and Pre-Norm) at the IWSLT dimensions, dropout 0.3.
   * ``lm``: ``--lm-updates`` (50) and ``--lm-fp32-updates`` (20) updates of every
     ``transformer_lm_ptb_*`` and ``transformer_lm_wt103_*`` architecture and of fairseq's
     ``transformer_lm`` of each shape, at the published sizes (3 or 6 layers, d_model 256,
     d_inner 2100). These models are small, so fewer updates keep the part to about a
     minute, most of it building each model and trainer.

Each row is printed as soon as it is measured, so a run cut short keeps what it measured.

    benchmarks/gpu_check.sh                  # on a CUDA machine with torch and fairseq
    benchmarks/gpu_check.sh --families lm --skip-norms   # the language models only
    benchmarks/gpu_check.sh --smoke          # a few tiny updates on any device (checks the script)

On the CPU (``--smoke``) the Triton implementation is skipped with a line saying so.
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
import norms

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


def norm_rows(device, smoke, rows, impls):
    size = dict(T=8, B=8, C=64, rounds=3, warmup=2) if smoke else dict(rounds=30)
    fused = norms.fused_norms()
    for dtype in (torch.float32, torch.float16):
        median, _, _, failures = norms.measure(device, dtype, impls=impls, **size)
        base = median["nn.LayerNorm"]
        for name in norms.norm_names():
            for impl in impls if name in fused else ("torch",):
                for compiled in (False, True):
                    key = norms.label(name, impl, compiled)
                    part = f"norm {str(dtype)[6:]} {'compiled' if compiled else 'eager'}"
                    if key in failures:
                        emit(rows, (part, norms.label(name, impl), "failed", "", failures[key][:120]))
                    else:
                        emit(rows, (part, norms.label(name, impl), f"{median[key] * 1e3:.3f} ms",
                                    f"{median[key] / base:.2f} × LN", ""))


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


def training_rows(family, device, passes, smoke, rows, kinds=None, impls=("torch",)):
    """``passes``: (updates, fp16) pairs; every architecture of ``family`` runs each pass in turn,
    each plugin architecture once per implementation in ``impls``."""
    with tempfile.TemporaryDirectory() as tmp:
        data = families.corpus(family, Path(tmp), 1000 if smoke else 20000)
        runs = families.runs(family, data, kinds)
        # untimed warm-up of each stock model over as many batches as a timed run: otherwise the
        # first timed run of a shape pays for the allocator and cuBLAS meeting each batch shape
        # (stock Post-Norm ran 3× slower than every other model on an H200 after a 20-update warm-up)
        for label, run in runs.items():
            if label == run.baseline:
                train(data, family, run, False, passes[0][0], device, smoke, passes[0][1])
        for updates, fp16 in passes:
            wps = {}
            for label, run in runs.items():
                plugin = label != run.baseline
                for impl in impls if plugin else ("torch",):
                    row = norms.label(label, impl)
                    wps[row], finite = train(data, family, run, plugin, updates, device, smoke, fp16, impl)
                    part = f"train {updates} updates {'fp16' if fp16 else 'fp32'}"
                    if wps[row] is None:
                        emit(rows, (part, row, "diverged", "", "fp16 loss scale at its minimum"))
                    else:
                        stock = wps[run.baseline]
                        emit(rows, (part, row, f"{wps[row]:,.0f} words/s",
                                    f"{wps[row] / stock:.2f} × stock" if stock else "",
                                    "finite" if finite else "NaN/inf"))


def main(argv=None):
    from normplug.models.architectures import KINDS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--families", default=",".join(families.FAMILIES),
                    help=f"comma-separated families to train (default: all; {', '.join(families.FAMILIES)})")
    ap.add_argument("--updates", type=int, default=100, help="fp16 updates of each translation architecture")
    ap.add_argument("--fp32-updates", type=int, default=30, help="float32 updates of each (0: none)")
    ap.add_argument("--lm-updates", type=int, default=50, help="fp16 updates of each language model")
    ap.add_argument("--lm-fp32-updates", type=int, default=20, help="float32 updates of each (0: none)")
    ap.add_argument("--kinds", default="", help="comma-separated architecture kinds to train (default: all)")
    ap.add_argument("--skip-norms", action="store_true", help="training rows only")
    ap.add_argument("--impls", default=",".join(norms.IMPLS),
                    help="implementations of the fused norms, comma-separated (default: %(default)s)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes and a few updates, to check the script")
    args = ap.parse_args(argv)
    chosen = args.families.split(",")
    kinds = args.kinds.split(",") if args.kinds else None
    wanted = args.impls.split(",")
    for values, valid, what in ((chosen, families.FAMILIES, "family"), (kinds or [], KINDS, "kind"),
                                (wanted, norms.IMPLS, "impl")):
        for value in values:
            if value not in valid:
                ap.error(f"unknown {what} {value!r}; choose from {', '.join(valid)}")
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)  # fairseq's INFO lines would bury the table
    if args.device == "cpu" and not args.smoke:
        ap.error("the GPU check needs --device cuda (or --smoke)")
    start = time.time()
    name = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    impls, skipped = norms.available_impls(args.device, tuple(wanted))
    triton = "" if "triton" not in impls else f", triton {__import__('triton').__version__}"
    print(f"normplug GPU check on {name}, torch {torch.__version__}{triton}", flush=True)
    for line in skipped:
        print(line, flush=True)
    print("| part | name | value | ratio | check |\n|---|---|---|---|---|", flush=True)
    rows, seconds = [], {}
    if not args.skip_norms:
        norm_rows(args.device, args.smoke, rows, impls)
        seconds["norms"] = time.time() - start
    updates = {"translation": (args.updates, args.fp32_updates), "lm": (args.lm_updates, args.lm_fp32_updates)}
    for family in chosen:
        fp16_updates, fp32_updates = updates[family]
        # fairseq's fp16 trainer needs CUDA: a smoke run on the CPU is float32 only
        passes = [(10, False)] if args.smoke and args.device == "cpu" else \
            [(10 if args.smoke else fp16_updates, True)] + \
            ([(10 if args.smoke else fp32_updates, False)] if fp32_updates else [])
        family_start = time.time()
        training_rows(family, args.device, passes, args.smoke, rows, kinds, impls)
        seconds[family] = time.time() - family_start
    print(f"{len(rows)} rows in {time.time() - start:.0f} s ("
          + ", ".join(f"{part} {s:.0f} s" for part, s in seconds.items()) + ")")
    bad = [row[1] for row in rows if row[4] == "NaN/inf"]
    failed = [f"{row[0]} {row[1]}" for row in rows if row[2] == "failed"]
    if bad:
        print(f"NaN or inf in: {', '.join(bad)}")
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if bad or failed else 0


if __name__ == "__main__":
    sys.exit(main())
