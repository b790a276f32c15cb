"""``normplug-tid``: training–inference discrepancy (TID) of a model's BN/PN layers (Wang, Wu &
Huang, NeurIPS 2022), measured in eval mode on a held-out split:

    mean TID     = mean_c |μ̂_c − μ_B,c| / σ_B,c
    variance TID = mean_c |σ̂_c / σ_B,c − 1|

μ_B, σ²_B: one batch's real-token statistics as in training; μ̂, σ̂²: the population statistics.
PowerNorm has no mean statistic (``n/a``). Per layer, batches are averaged token-weighted. TID
grows as batches shrink: compare checkpoints at the same ``--max-tokens`` (README.md has examples).
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
from .common import (ToolError, add_data_args, atomic_path, configure_logging, device_for,
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
        self.norms, self.sums = norms, {name: [0.0, 0.0, 0, 0] for name in norms}  # Σ n·mean, Σ n·var, batches, n

    def _record(self, name, module, x, pad_mask):
        measured = batch_tid(module, x, pad_mask)
        if measured is not None:
            tid_mean, tid_var, n = measured
            self.sums[name] = [a + b for a, b in zip(self.sums[name], (n * (tid_mean or 0.0), n * tid_var, 1, n))]

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
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.partition("``: ")[2].replace("``", ""),
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
    for path in paths:  # in the order given; a save dir's oldest first
        model, task, info = load_model(path, args.data)
        if not model.batch_stat_norms():
            raise ToolError(f"{path} has no BN/PN layer (no batch-statistics norm); TID is defined "
                            "for 'batch' and 'power' norms only")
        results.append((info, measure(model, task, args.split, args.max_tokens, device, args.max_batches, args.seed)))
    return results


def measure(model, task, split: str, max_tokens: int, device, max_batches=None, seed=1) -> List[LayerTID]:
    """TID of every BN/PN layer of ``model`` on ``split`` (its batches of ``max_tokens``), in eval mode."""
    model.to(device)  # in eval mode: every layer normalises as at inference
    with TIDMeter(model.batch_stat_norms()) as meter, torch.no_grad():
        for sample in iterate_batches(task, model, split, max_tokens, max_batches, seed):
            run_model(model, sample, device)
    layers = meter.results()
    if all(layer.batches == 0 for layer in layers):
        raise ToolError(f"split {split!r} gave no batch with 2 or more real tokens")
    return layers


def mean_over_layers(layers: List[LayerTID]):
    """(mean TID or None where no layer has a mean statistic, variance TID), each averaged over the layers."""
    means = [layer.tid_mean for layer in layers if layer.tid_mean is not None]
    return (sum(means) / len(means) if means else None), sum(layer.tid_var for layer in layers) / len(layers)


def _label(info, path):
    """``path (epoch E, U updates)``, or the path alone where the checkpoint records neither."""
    when = ", ".join(([] if info.epoch is None else [f"epoch {info.epoch}"])
                     + ([] if info.num_updates is None else [f"{info.num_updates} updates"]))
    return path + (f" ({when})" if when else "")


def print_table(results, split, out=sys.stdout):
    def fmt(v):
        return f"{'n/a':>9}" if v is None else f"{v:9.4f}"
    for info, layers in results:
        batches = max((layer.batches for layer in layers), default=0)
        print(f"{_label(info, info.path)} on {split}: {batches} batches", file=out)
        width = max([5] + [len(layer.layer) for layer in layers])
        print(f"  {'layer':<{width}}  {'norm':<6}  {'tid_mean':>9}  {'tid_var':>9}  {'tokens':>8}", file=out)
        for layer in layers:
            print(f"  {layer.layer:<{width}}  {layer.norm:<6}  {fmt(layer.tid_mean)}  "
                  f"{fmt(layer.tid_var)}  {layer.tokens:>8}", file=out)
    out.flush()


CSV_COLUMNS = ["checkpoint", "epoch", "num_updates", "layer", "norm", "tid_mean", "tid_var", "batches", "tokens"]


def write_csv(results, path):
    with open(path, "w", newline="") as f:  # csv writes None as an empty cell, a float as its repr
        csv.writer(f).writerows([CSV_COLUMNS] + [[info.path, info.epoch, info.num_updates, *layer]
                                                 for info, layers in results for layer in layers])


# several runs (BN against RBN): a colour family and a line style per run, a shade per layer
RUN_STYLES = (("Blues", "-"), ("Oranges", "--"), ("Greens", ":"), ("Purples", "-."))


def layer_colours(runs: Dict[str, list]) -> Dict[str, list]:
    """Run label -> one colour per layer: tab10's per layer for one run; for several, each run's own family
    (no colour is shared between runs), darker for later layers."""
    import matplotlib
    names = {label: list(dict.fromkeys(layer.layer for _, layers in results for layer in layers))
             for label, results in runs.items()}
    if len(runs) == 1:
        return {label: [f"C{i % 10}" for i in range(len(layers))] for label, layers in names.items()}
    return {label: [matplotlib.colormaps[family](0.4 + 0.55 * i / max(len(layers) - 1, 1))
                    for i in range(len(layers))] for (label, layers), (family, _) in zip(names.items(), RUN_STYLES)}


def draw(runs: Dict[str, list], path, split):
    """Mean and variance TID of every BN/PN layer over the checkpoints of each run (``runs``: label ->
    :func:`run`'s results, at most 4), one line per layer and run, x = the checkpoints in training order."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), dpi=110)
    ticks = [_label(info, os.path.basename(info.path)) for info, _ in next(iter(runs.values()))]
    colours = layer_colours(runs)
    for ax, key, title in zip(axes, ("tid_mean", "tid_var"), ("mean TID  mean_c |μ̂−μ_B| / σ_B",
                                                             "variance TID  mean_c |σ̂/σ_B − 1|")):
        for (_, style), (label, results) in zip(RUN_STYLES, runs.items()):
            for i, name in enumerate(dict.fromkeys(layer.layer for _, layers in results for layer in layers)):
                ys = [next((getattr(x, key) for x in layers if x.layer == name), None) for _, layers in results]
                if any(y is not None for y in ys):
                    ax.plot([math.nan if y is None else y for y in ys], style, color=colours[label][i], marker="o",
                            label=f"{label} {name}".strip())
        if ax.lines:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "n/a (no mean statistic)", ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks(range(len(ticks)))
        ax.set_xticklabels(ticks, rotation=20, ha="right", fontsize=7)
        ax.set(ylim=(0, None))
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    fig.suptitle(f"TID per layer on {split}", fontsize=11)
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
                raise ToolError("--plot needs matplotlib (normplug's 'plot' extra): pip install matplotlib") from None
        results = run(args)
        print_table(results, args.split)
        for path, write in ((args.csv, write_csv), (args.plot, lambda rows, tmp: draw({"": rows}, tmp, args.split))):
            if path:
                with atomic_path(path) as tmp:
                    write(results, tmp)
                print(f"wrote {path}")
    run_tool(PROG, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
