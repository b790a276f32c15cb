"""``normplug-average``: average fairseq checkpoints, optionally re-estimating the
population statistics of their BN/PN layers for the averaged weights.

Averaging (as fairseq's ``scripts/average_checkpoints.py``): every
floating-point tensor of the model state — parameters *and* buffers, so also
BatchNorm's running mean/variance and PowerNorm's ψ² — is the element-wise
mean over the inputs (accumulated in float64). Integer buffers (update
counters) are copied from the newest input, the one with the most updates,
which also supplies everything else in the file (configuration, optimizer
history, extra state): the output is an ordinary fairseq checkpoint, loadable
by ``fairseq-generate --user-dir normplug`` and ``normplug-tid``. A record of
what was done is kept in ``extra_state['normplug_average']``.

Averaged running statistics are the mean of each input's statistics, which
need not be the statistics of the averaged weights (SPEC §4). With
``--reestimate-stats`` they are recomputed for the averaged model on
training batches: the model runs under ``no_grad`` with dropout off and each
BN/PN layer in train mode, so that it normalises with, and is updated by, its
own batch statistics; each layer's update is turned into a cumulative mean,
so the population statistics become the exact mean over the K batches of the
batch statistics (BatchNorm: momentum 1/t at its t-th batch, i.e. PyTorch's
``momentum=None``; PowerNorm: its warm-up phase, in which ψ² already is the
cumulative mean, with the counters restored afterwards). Parameters are
bit-identical; only the population statistics change.

Examples::

    # the last 6 epoch checkpoints of a run (the IWSLT recipe)
    normplug-average --inputs checkpoints/ --num-epoch-checkpoints 6 --output avg.pt
    # the same, with population statistics re-estimated on 200 training batches
    normplug-average --inputs checkpoints/ --num-epoch-checkpoints 6 --output avg_reest.pt \\
        --reestimate-stats --data data-bin/iwslt14 --max-batches 200
    # did the discrepancy between training and inference statistics drop?
    normplug-tid avg.pt avg_reest.pt --data data-bin/iwslt14 --csv tid_avg.csv
"""
import argparse
import os
import sys

from . import common
from .common import configure_logging

PROG = "normplug-average"


def build_parser():
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Average fairseq checkpoints (parameters and buffers); optionally "
        "re-estimate the population statistics of BN/PN layers for the averaged weights.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--inputs", nargs="+", required=True, metavar="PATH",
                   help="checkpoint files, or one save dir with --num-epoch-checkpoints / "
                   "--num-update-checkpoints")
    p.add_argument("--output", required=True, metavar="PATH", help="averaged checkpoint to write")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--num-epoch-checkpoints", type=int, metavar="N",
                       help="average the last N checkpointE.pt of the save dir")
    which.add_argument("--num-update-checkpoints", type=int, metavar="N",
                       help="average the last N checkpoint_E_U.pt of the save dir")
    p.add_argument("--checkpoint-upper-bound", type=int, metavar="K",
                   help="ignore checkpoints after epoch (or update) K")
    r = p.add_argument_group("re-estimation of population statistics")
    r.add_argument("--reestimate-stats", action="store_true",
                   help="recompute running statistics of BN/PN layers for the averaged weights")
    common.add_data_args(r, "train", "re-estimate on")
    p.add_argument("-v", "--verbose", action="store_true", help="show fairseq's log")
    return p


def fail(message: str):
    common.fail(PROG, message)


def select_inputs(args):
    """The checkpoint files to average, oldest first."""
    from normplug.analysis import ToolError, numbered_checkpoints

    n = args.num_epoch_checkpoints or args.num_update_checkpoints
    if args.num_epoch_checkpoints is not None or args.num_update_checkpoints is not None:
        if n is None or n <= 0:
            raise ToolError("the number of checkpoints to average must be > 0")
        if len(args.inputs) != 1 or not os.path.isdir(args.inputs[0]):
            raise ToolError("--num-epoch-checkpoints / --num-update-checkpoints need one "
                            "save directory as --inputs")
        kind = "epoch" if args.num_epoch_checkpoints else "update"
        found = numbered_checkpoints(args.inputs[0], kind)
        if args.checkpoint_upper_bound is not None:
            found = [f for f in found if _number(f, kind) <= args.checkpoint_upper_bound]
        if len(found) < n:
            raise ToolError(f"found {len(found)} {kind} checkpoint(s) in {args.inputs[0]}, "
                            f"need {n}")
        return found[-n:]
    if args.checkpoint_upper_bound is not None:
        raise ToolError("--checkpoint-upper-bound needs --num-epoch-checkpoints or "
                        "--num-update-checkpoints")
    for path in args.inputs:
        if os.path.isdir(path):
            raise ToolError(f"{path} is a directory: pass --num-epoch-checkpoints N or "
                            "--num-update-checkpoints N to pick checkpoints from it")
        if not os.path.exists(path):
            raise ToolError(f"checkpoint not found: {path}")
    return list(args.inputs)


def _number(path, kind):
    import re

    name = os.path.basename(path)
    if kind == "epoch":
        return int(re.match(r"checkpoint(\d+)\.pt", name).group(1))
    return int(re.match(r"checkpoint_\d+_(\d+)\.pt", name).group(1))


def _updates(info):
    return -1 if info.num_updates is None else info.num_updates


def average(paths):
    """(state of the newest input with the averaged model, newest path)."""
    from normplug.analysis import average_model_states, checkpoint_info, raw_load

    models, infos, newest, newest_i = [], [], None, None
    for i, path in enumerate(paths):
        state = raw_load(path)
        info = checkpoint_info(path, state)
        infos.append(info)
        models.append(state["model"])
        if newest is None or _updates(info) >= _updates(infos[newest_i]):
            newest, newest_i = state, i
        # only the newest is kept whole: optimizer states are large
        del state
    order = [newest_i] + [j for j in range(len(paths)) if j != newest_i]
    newest["model"] = average_model_states([models[j] for j in order], [paths[j] for j in order])
    newest_path = paths[newest_i]
    extra = newest.setdefault("extra_state", {}) or {}
    newest["extra_state"] = extra
    extra["normplug_average"] = {
        "inputs": [os.path.abspath(p) for p in paths],
        "num_updates": [info.num_updates for info in infos],
        "metadata_from": os.path.abspath(newest_path),
        "reestimated": None,
    }
    return newest, newest_path


def reestimate(state, tmp_path, args):
    """Re-estimate the population statistics of the model in ``state`` (saved at
    ``tmp_path``) in place; returns (layers, batches per layer)."""
    import torch

    from normplug.analysis import (
        ToolError,
        batch_stat_norms,
        iterate_batches,
        load_model,
        norm_buffer_keys,
        reestimate_population_statistics,
    )

    model, task, _ = load_model(tmp_path, args.data)
    if not batch_stat_norms(model):
        raise ToolError("the model has no BN/PN layer: there are no population statistics "
                        "to re-estimate (drop --reestimate-stats)")
    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    model.to(device)
    batches = iterate_batches(task, model, args.split, args.max_tokens, args.batch_size,
                              args.max_batches, seed=args.seed, shuffle=True)
    steps = reestimate_population_statistics(model, batches, device)
    if not any(steps.values()):
        raise ToolError(f"split {args.split!r} gave no batch to re-estimate on")
    new = model.state_dict()
    stored = state["model"]
    for key in norm_buffer_keys(model):
        if key not in stored:
            raise ToolError(f"the checkpoint has no {key!r}: cannot write the re-estimated "
                            "statistics back (old state-dict layout?)")
        stored[key] = new[key].detach().to("cpu", stored[key].dtype).clone()
    state["extra_state"]["normplug_average"]["reestimated"] = {
        "split": args.split,
        "batches": max(steps.values()),
        "max_tokens": args.max_tokens,
        "seed": args.seed,
        "layers": sorted(steps),
    }
    return steps


def main(argv=None):
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    for flag in ("max_tokens", "max_batches", "batch_size"):
        value = getattr(args, flag)
        if value is not None and value <= 0:
            fail(f"--{flag.replace('_', '-')} must be > 0")
    try:
        import torch

        import normplug  # noqa: F401  (registers the plugin's models, allow-lists checkpoints)
        from normplug.analysis import ToolError, atomic_path
    except Exception as err:  # pragma: no cover - broken installation
        fail(f"cannot import normplug: {type(err).__name__}: {err}")
    try:
        if args.data is not None and not args.reestimate_stats:
            raise ToolError("--data is only used with --reestimate-stats")
        paths = select_inputs(args)
        state, newest = average(paths)
        print(f"averaged {len(paths)} checkpoint(s): {', '.join(paths)} "
              f"(configuration and counters from {newest})")
        with atomic_path(args.output) as tmp:
            torch.save(state, tmp)
            if args.reestimate_stats:
                steps = reestimate(state, tmp, args)
                torch.save(state, tmp)
                print(f"re-estimated the population statistics of {len(steps)} layer(s) "
                      f"({', '.join(steps)}) on {max(steps.values())} batch(es) of {args.split}")
    except ToolError as err:
        fail(str(err))
    except KeyboardInterrupt:
        fail("interrupted")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
