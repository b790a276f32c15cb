"""``normplug-tid``: training–inference discrepancy (TID) of a model's BN/PN layers.

For every batch-statistics norm (BatchNorm, PowerNorm) of one or more fairseq
checkpoints, measure on a held-out split (Wang, Wu & Huang, NeurIPS 2022)::

    mean TID     = mean_c |μ̂_c − μ_B,c| / σ_B,c
    variance TID = mean_c |σ̂_c / σ_B,c − 1|

where μ_B, σ²_B are the statistics of one batch's real tokens as the layer
would compute them in training, and μ̂, σ̂² the population statistics the
checkpoint normalises with at inference. The model runs in eval mode, so every
layer's input is what it is at inference (upstream layers normalised with
population statistics, no dropout). PowerNorm has no mean statistic: its mean
TID is reported as ``n/a`` (empty in the CSV) and its variance TID compares
ψ with the batch quadratic mean.

Per layer, batches are averaged **token-weighted** (Σ n_b·TID_b / Σ n_b, n_b
the layer's real tokens in batch b; source tokens for encoder layers, target
tokens for decoder layers). Batches are fairseq's length-bucketed ones, taken
in a fixed random order (``--seed``) so that ``--max-batches`` is a sample of
all lengths. TID depends on the batch size (smaller batches, noisier batch
statistics, larger TID): compare checkpoints at the same ``--max-tokens``.

Examples::

    normplug-tid checkpoints/checkpoint_best.pt --data data-bin/iwslt14
    normplug-tid checkpoints/ --csv tid.csv --plot tid.png      # every epoch/update checkpoint
    normplug-tid avg.pt avg_reest.pt --max-batches 50           # before/after re-estimation

With several checkpoints they are sorted by their update count (from the
checkpoint's ``optimizer_history``); when their update counts differ the plot
shows TID over training, one line per layer (the central figure of Wang, Wu &
Huang), otherwise (one checkpoint; an average before and after
re-estimation) bars per layer and checkpoint. Mean and variance TID are the
two panels. Outputs are written to temporary names and renamed only when
everything succeeded, so an error never leaves a half-written CSV or PNG.
"""
import argparse
import csv
import math
import os
import sys
from typing import Dict, List, NamedTuple, Optional

import torch

from ..norms import BatchStatNorm
from ..norms.base import measure_discrepancy, real_tokens
from .common import (ToolError, add_data_args, atomic_path, check_data_args, configure_logging, device_for,
                     fail, iterate_batches, load_model, numbered_checkpoints, run_model)

PROG = "normplug-tid"


class LayerTID(NamedTuple):
    layer: str
    norm: str
    tid_mean: Optional[float]  # None where the norm has no mean statistic
    tid_var: float
    batches: int
    tokens: int


def batch_tid(norm: BatchStatNorm, x, pad_mask):
    """(mean TID or None, variance TID, real tokens) of one batch's statistics against the
    norm's population statistics, or None for fewer than 2 real tokens (no spread)."""
    n = int(real_tokens(x, pad_mask).sum())
    if n < 2:
        return None
    batch_mean, batch_var = norm.batch_statistics(x, pad_mask)
    with torch.no_grad():
        d = measure_discrepancy(batch_mean, batch_var, *norm.population_statistics())
    return (None if batch_mean is None else float(d.tid_mean)), float(d.tid_var), n


class TIDMeter:
    """Forward pre-hooks on batch-statistics norms that accumulate their TID per batch,
    token-weighted: Σ_b n_b·TID_b / Σ_b n_b, n_b the layer's real tokens in batch b."""

    def __init__(self, norms: Dict[str, BatchStatNorm]):
        self.norms = norms
        self.sums = {name: [0.0, 0.0, 0, 0] for name in norms}  # Σ n·mean, Σ n·var, batches, tokens
        self.handles = []

    def _hook(self, name):
        def hook(module, args, kwargs):
            x = args[0] if args else kwargs["x"]
            measured = batch_tid(module, x, args[1] if len(args) > 1 else kwargs.get("pad_mask"))
            if measured is None:
                return
            tid_mean, tid_var, n = measured
            acc = self.sums[name]
            acc[0] += n * (tid_mean or 0.0)
            acc[1] += n * tid_var
            acc[2] += 1
            acc[3] += n
        return hook

    def __enter__(self):
        self.handles = [m.register_forward_pre_hook(self._hook(name), with_kwargs=True)
                        for name, m in self.norms.items()]
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        return False

    def results(self) -> List[LayerTID]:
        out = []
        for name, module in self.norms.items():
            s_mean, s_var, batches, tokens = self.sums[name]
            has_mean = module.population_statistics()[0] is not None
            out.append(LayerTID(name, module.norm_name,
                                s_mean / tokens if tokens and has_mean else None,
                                s_var / tokens if tokens else math.nan, batches, tokens))
        return out


def measure_tid(model, task, split="valid", max_tokens=4096, max_sentences=None,
                max_batches=None, seed=1, device="cpu") -> List[LayerTID]:
    """Per-layer TID of ``model`` in eval mode (every layer normalises with its population
    statistics, as at inference) over batches of ``split``."""
    model.eval()
    with TIDMeter(model.batch_stat_norms()) as meter, torch.no_grad():
        for sample in iterate_batches(task, model, split, max_tokens, max_sentences, max_batches, seed):
            run_model(model, sample, device)
    return meter.results()


def build_parser():
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Per-layer training-inference discrepancy (TID) of BN/PN layers of "
        "fairseq checkpoints, measured on a data split against the population statistics.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT",
                   help="checkpoint files, or save dirs (every checkpointN.pt / checkpoint_E_U.pt in them)")
    add_data_args(p, "valid", "measure on")
    p.add_argument("--csv", metavar="PATH", help="write the table as CSV")
    p.add_argument("--plot", metavar="PATH", help="draw a PNG figure")
    p.add_argument("-v", "--verbose", action="store_true", help="show fairseq's log")
    return p


def _expand(paths):
    out = []
    for path in paths:
        if os.path.isdir(path):
            found = numbered_checkpoints(path)
            if not found:
                raise ToolError(f"no checkpointN.pt / checkpoint_E_U.pt files in {path}")
            out += found
        else:
            out.append(path)
    return out


def run(args):
    """Measure every checkpoint; returns [(CheckpointInfo, [LayerTID])], by update count."""
    check_data_args(args)
    if args.data is not None and not os.path.isdir(args.data):
        raise ToolError(f"data directory not found: {args.data}")
    paths = _expand(args.checkpoints)
    for path in paths:  # fail before any work is done
        if not os.path.exists(path):
            raise ToolError(f"checkpoint not found: {path}")
    device = device_for(args)
    results = []
    for path in paths:
        model, task, info = load_model(path, args.data)
        if not model.batch_stat_norms():
            raise ToolError(f"{path} has no BN/PN layer (no batch-statistics norm); TID is defined "
                            "for 'batch' and 'power' norms only")
        model.to(device)
        layers = measure_tid(model, task, args.split, args.max_tokens, args.batch_size,
                             args.max_batches, seed=args.seed, device=device)
        if all(layer.batches == 0 for layer in layers):
            raise ToolError(f"split {args.split!r} gave no batch with 2 or more real tokens")
        results.append((info, layers))
    results.sort(key=lambda r: (math.inf if r[0].num_updates is None else r[0].num_updates,
                                math.inf if r[0].epoch is None else r[0].epoch))
    return results


def _fmt(v, width=9):
    return f"{'n/a':>{width}}" if v is None else f"{v:{width}.4f}"


def print_table(results, split, out=sys.stdout):
    for info, layers in results:
        when = []
        if info.epoch is not None:
            when.append(f"epoch {info.epoch}")
        if info.num_updates is not None:
            when.append(f"{info.num_updates} updates")
        batches = max((layer.batches for layer in layers), default=0)
        print(f"{info.path}" + (f" ({', '.join(when)})" if when else "")
              + f" on {split}: {batches} batches", file=out)
        width = max([5] + [len(layer.layer) for layer in layers])
        print(f"  {'layer':<{width}}  {'norm':<6}  {'tid_mean':>9}  {'tid_var':>9}  {'tokens':>8}",
              file=out)
        for layer in layers:
            print(f"  {layer.layer:<{width}}  {layer.norm:<6}  {_fmt(layer.tid_mean)}  "
                  f"{_fmt(layer.tid_var)}  {layer.tokens:>8}", file=out)
    out.flush()


CSV_COLUMNS = ["checkpoint", "epoch", "num_updates", "layer", "norm", "tid_mean", "tid_var",
               "batches", "tokens"]


def write_csv(results, path):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for info, layers in results:
            for layer in layers:
                w.writerow([
                    info.path,
                    "" if info.epoch is None else info.epoch,
                    "" if info.num_updates is None else info.num_updates,
                    layer.layer, layer.norm,
                    "" if layer.tid_mean is None else repr(layer.tid_mean),
                    repr(layer.tid_var), layer.batches, layer.tokens,
                ])


PANELS = (("tid_mean", "mean TID  mean_c |μ̂−μ_B| / σ_B"),
          ("tid_var", "variance TID  mean_c |σ̂/σ_B − 1|"))


def _when(info):
    when = [f"epoch {info.epoch}"] if info.epoch is not None else []
    if info.num_updates is not None:
        when.append(f"{info.num_updates} updates")
    return ", ".join(when)


def _value(layers, name, key):
    match = [layer for layer in layers if layer.layer == name]
    v = getattr(match[0], key) if match else None
    return math.nan if v is None else v


def _training_axis(results):
    """(x values, label) when the checkpoints are distinct points of one run, else None."""
    for attr, label in (("num_updates", "updates"), ("epoch", "epoch")):
        xs = [getattr(info, attr) for info, _ in results]
        if all(x is not None for x in xs) and len(set(xs)) == len(xs):
            return xs, label
    return None


def draw(results, path, split):
    """One checkpoint, or checkpoints at the same point of training (e.g. an
    average before/after re-estimation): bars per layer. Checkpoints of one
    run at distinct update counts: TID over training, one line per layer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    for _, layers in results:
        names += [layer.layer for layer in layers if layer.layer not in names]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    axis = _training_axis(results) if len(results) > 1 else None
    for ax, (key, title) in zip(axes, PANELS):
        drawn = False
        if axis is None:  # grouped bars: layers on x, one bar per checkpoint
            width = 0.8 / len(results)
            top = 0.0
            for j, (info, layers) in enumerate(results):
                ys = [_value(layers, name, key) for name in names]
                if all(math.isnan(y) for y in ys):
                    continue
                xs = [i - 0.4 + width * (j + 0.5) for i in range(len(names))]
                label = os.path.basename(info.path) + (f" ({_when(info)})" if _when(info) else "")
                ax.bar(xs, ys, width=width * 0.95, label=label)
                top = max([top] + [y for y in ys if math.isfinite(y)])
                drawn = True
            ax.set_xticks(range(len(names)))
            ax.set_xticklabels(names, rotation=45, ha="right", fontsize=8)
            ax.set_xlim(-0.5, len(names) - 0.5)
            if drawn and len(results) > 1:
                ax.legend(fontsize=7, loc="upper left")
                if top > 0:  # room for the legend above the bars
                    ax.set_ylim(0, top * (1.15 + 0.07 * len(results)))
            ax.grid(axis="y", alpha=0.3)
        else:  # lines over training, one per layer
            xs, xlabel = axis
            order = sorted(range(len(xs)), key=lambda i: xs[i])
            count = 0
            for name in names:
                ys = [_value(results[i][1], name, key) for i in order]
                if all(math.isnan(y) for y in ys):
                    continue
                ax.plot([xs[i] for i in order], ys, marker="o", markersize=3, label=name)
                count += 1
            drawn = count > 0
            if drawn and count <= 16:
                ax.legend(fontsize=7, ncol=2 if count > 8 else 1)
            ax.set_xlabel(xlabel)
            ax.grid(alpha=0.3)
        if not drawn:
            ax.text(0.5, 0.5, "n/a (no mean statistic)", ha="center", va="center",
                    transform=ax.transAxes)
        ax.set_title(title, fontsize=10)
        ax.set_ylim(bottom=0)
    if len(results) == 1:
        info = results[0][0]
        fig.suptitle(f"TID per layer on {split}: {os.path.basename(info.path)}"
                     + (f" ({_when(info)})" if _when(info) else ""), fontsize=11)
    elif axis is None:
        fig.suptitle(f"TID per layer on {split} ({len(results)} checkpoints)", fontsize=11)
    else:
        fig.suptitle(f"TID over training on {split} ({len(results)} checkpoints)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


def main(argv=None):
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    try:
        if args.plot:  # before any work: matplotlib is an optional extra of the package
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                raise ToolError("--plot needs matplotlib, the 'plot' extra of normplug: "
                                "pip install 'normplug[plot]' (or pip install matplotlib)") from None
        results = run(args)
        print_table(results, args.split)
        for path, write in ((args.csv, write_csv), (args.plot, lambda rows, tmp: draw(rows, tmp, args.split))):
            if path:
                with atomic_path(path) as tmp:
                    write(results, tmp)
                print(f"wrote {path}")
    except ToolError as err:
        fail(PROG, str(err))
    except KeyboardInterrupt:
        fail(PROG, "interrupted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
