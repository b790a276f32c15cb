"""``normplug-tid``: training–inference discrepancy (TID) of a model's BN/PN layers (Wang, Wu &
Huang, NeurIPS 2022), measured in eval mode on a held-out split:

    mean TID     = mean_c |μ̂_c − μ_B,c| / σ_B,c
    variance TID = mean_c |σ̂_c / σ_B,c − 1|

μ_B, σ²_B: one batch's real-token statistics as in training; μ̂, σ̂²: the population statistics.
PowerNorm has no mean statistic (``n/a``). Per layer, batches are averaged token-weighted. TID
grows as batches shrink: compare checkpoints at the same ``--max-tokens``.

    normplug-tid checkpoints/checkpoint_best.pt --data data-bin/iwslt14
    normplug-tid checkpoints/ --csv tid.csv --plot tid.png      # every epoch/update checkpoint
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
                     hook_norm_inputs, iterate_batches, load_model, need_fairseq, numbered_checkpoints, run_model,
                     run_tool)

PROG = "normplug-tid"


# tid_mean is None where the norm has no mean statistic
LayerTID = NamedTuple("LayerTID", [("layer", str), ("norm", str), ("tid_mean", Optional[float]),
                                   ("tid_var", float), ("batches", int), ("tokens", int)])


def batch_tid(norm: BatchStatNorm, x, pad_mask):
    """(mean TID or None, variance TID, real tokens) of one batch's statistics against the norm's
    population statistics, or None for fewer than 2 real tokens (no spread)."""
    n = int(real_tokens(x, pad_mask).sum())
    if n < 2:
        return None
    batch_mean, batch_var = norm.batch_statistics(x, pad_mask)
    with torch.no_grad():
        d = measure_discrepancy(batch_mean, batch_var, *norm.population_statistics())
    return (None if batch_mean is None else float(d.tid_mean)), float(d.tid_var), n


class TIDMeter:
    """Forward pre-hooks on batch-statistics norms that accumulate their TID, token-weighted."""

    def __init__(self, norms: Dict[str, BatchStatNorm]):
        self.norms = norms
        self.sums = {name: [0.0, 0.0, 0, 0] for name in norms}  # Σ n·mean, Σ n·var, batches, tokens

    def _record(self, name, module, x, pad_mask):
        measured = batch_tid(module, x, pad_mask)
        if measured is not None:
            tid_mean, tid_var, n = measured
            added = (n * (tid_mean or 0.0), n * tid_var, 1, n)
            self.sums[name] = [a + b for a, b in zip(self.sums[name], added)]

    def __enter__(self):
        self.handles = hook_norm_inputs(self.norms, self._record)
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()

    def results(self) -> List[LayerTID]:
        def layer(name, module):
            s_mean, s_var, batches, tokens = self.sums[name]
            has_mean = module.population_statistics()[0] is not None
            return LayerTID(name, module.norm_name, s_mean / tokens if tokens and has_mean else None,
                            s_var / tokens if tokens else math.nan, batches, tokens)
        return [layer(name, module) for name, module in self.norms.items()]


def build_parser():
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT",
                   help="checkpoint files, or save dirs (every checkpointN.pt / checkpoint_E_U.pt in them)")
    add_data_args(p, "valid", "measure on")
    p.add_argument("--csv", metavar="PATH", help="write the table as CSV")
    p.add_argument("--plot", metavar="PATH", help="draw a PNG figure")
    p.add_argument("-v", "--verbose", action="store_true", help="show fairseq's log")
    return p


def run(args):
    """Measure every checkpoint; returns [(CheckpointInfo, [LayerTID])], by update count."""
    check_data_args(args)
    if args.data is not None and not os.path.isdir(args.data):
        raise ToolError(f"data directory not found: {args.data}")
    paths = []
    for path in args.checkpoints:  # fail before any work is done
        found = numbered_checkpoints(path) if os.path.isdir(path) else [path]
        if not found:
            raise ToolError(f"no checkpointN.pt / checkpoint_E_U.pt files in {path}")
        paths += found
    missing = [path for path in paths if not os.path.exists(path)]
    if missing:
        raise ToolError(f"checkpoint not found: {missing[0]}")
    device = device_for(args)
    results = []
    for path in paths:
        model, task, info = load_model(path, args.data)
        if not model.batch_stat_norms():
            raise ToolError(f"{path} has no BN/PN layer (no batch-statistics norm); TID is defined "
                            "for 'batch' and 'power' norms only")
        model.to(device)  # in eval mode: every layer normalises as at inference
        with TIDMeter(model.batch_stat_norms()) as meter, torch.no_grad():
            for sample in iterate_batches(task, model, args.split, args.max_tokens, args.batch_size,
                                          args.max_batches, args.seed):
                run_model(model, sample, device)
        layers = meter.results()
        if all(layer.batches == 0 for layer in layers):
            raise ToolError(f"split {args.split!r} gave no batch with 2 or more real tokens")
        results.append((info, layers))
    results.sort(key=lambda r: tuple(math.inf if v is None else v for v in (r[0].num_updates, r[0].epoch)))
    return results


def _label(info, path):
    """``path (epoch E, U updates)``, or the path alone where the checkpoint records neither."""
    when = ", ".join(([] if info.epoch is None else [f"epoch {info.epoch}"])
                     + ([] if info.num_updates is None else [f"{info.num_updates} updates"]))
    return path + (f" ({when})" if when else "")


def _fmt(v, width=9):
    return f"{'n/a':>{width}}" if v is None else f"{v:{width}.4f}"


def print_table(results, split, out=sys.stdout):
    for info, layers in results:
        batches = max((layer.batches for layer in layers), default=0)
        print(f"{_label(info, info.path)} on {split}: {batches} batches", file=out)
        width = max([5] + [len(layer.layer) for layer in layers])
        print(f"  {'layer':<{width}}  {'norm':<6}  {'tid_mean':>9}  {'tid_var':>9}  {'tokens':>8}", file=out)
        for layer in layers:
            print(f"  {layer.layer:<{width}}  {layer.norm:<6}  {_fmt(layer.tid_mean)}  "
                  f"{_fmt(layer.tid_var)}  {layer.tokens:>8}", file=out)
    out.flush()


CSV_COLUMNS = ["checkpoint", "epoch", "num_updates", "layer", "norm", "tid_mean", "tid_var", "batches", "tokens"]


def write_csv(results, path):
    with open(path, "w", newline="") as f:  # csv writes None as an empty cell
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for info, layers in results:
            for layer in layers:
                w.writerow([info.path, info.epoch, info.num_updates, layer.layer, layer.norm,
                            None if layer.tid_mean is None else repr(layer.tid_mean),
                            repr(layer.tid_var), layer.batches, layer.tokens])


PANELS = (("tid_mean", "mean TID  mean_c |μ̂−μ_B| / σ_B"), ("tid_var", "variance TID  mean_c |σ̂/σ_B − 1|"))


def _value(layers, name, key):
    v = next((getattr(layer, key) for layer in layers if layer.layer == name), None)
    return math.nan if v is None else v


def _training_axis(results):
    """(x values, label) when the checkpoints are distinct points of one run, else None."""
    for attr, label in (("num_updates", "updates"), ("epoch", "epoch")):
        xs = [getattr(info, attr) for info, _ in results]
        if all(x is not None for x in xs) and len(set(xs)) == len(xs):
            return xs, label
    return None


def draw(results, path, split):
    """One checkpoint, or checkpoints at the same point of training (e.g. an average before and
    after re-estimation): bars per layer. Checkpoints of one run at distinct update counts: TID
    over training, one line per layer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(layer.layer for _, layers in results for layer in layers))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    axis = _training_axis(results) if len(results) > 1 else None
    for ax, (key, title) in zip(axes, PANELS):
        if axis is None:  # grouped bars: layers on x, one bar per checkpoint
            width, top, drawn = 0.8 / len(results), 0.0, 0
            for j, (info, layers) in enumerate(results):
                ys = [_value(layers, name, key) for name in names]
                if not all(math.isnan(y) for y in ys):
                    ax.bar([i - 0.4 + width * (j + 0.5) for i in range(len(names))], ys, width=width * 0.95,
                           label=_label(info, os.path.basename(info.path)))
                    top, drawn = max([top] + [y for y in ys if math.isfinite(y)]), drawn + 1
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
            drawn = 0
            for name in names:
                ys = [_value(results[i][1], name, key) for i in order]
                if not all(math.isnan(y) for y in ys):
                    ax.plot([xs[i] for i in order], ys, marker="o", markersize=3, label=name)
                    drawn += 1
            if 0 < drawn <= 16:
                ax.legend(fontsize=7, ncol=2 if drawn > 8 else 1)
            ax.set_xlabel(xlabel)
            ax.grid(alpha=0.3)
        if not drawn:
            ax.text(0.5, 0.5, "n/a (no mean statistic)", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title, fontsize=10)
        ax.set_ylim(bottom=0)
    fig.suptitle(f"TID per layer on {split}: {_label(results[0][0], os.path.basename(results[0][0].path))}"
                 if len(results) == 1 else
                 f"TID {'per layer' if axis is None else 'over training'} on {split} ({len(results)} checkpoints)",
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


def main(argv=None):
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)

    def body():
        need_fairseq(PROG)
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
    run_tool(PROG, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
