"""``normplug-average``: average fairseq checkpoints as fairseq's scripts/average_checkpoints.py
does (element-wise means of floating-point tensors, the rest from the input with the most updates),
optionally re-estimating the population statistics of their BN/PN layers ("precise BN") (README.md)."""
import argparse
import os
import sys
from typing import Dict, List, Sequence

import torch

from .common import (ToolError, add_data_args, atomic_path, checkpoint_info,
                     configure_logging, device_for, hook_norm_inputs, iterate_batches, load_model,
                     need_fairseq, numbered_checkpoints, positive, raw_load, run_model, run_tool)

PROG = "normplug-average"


def build_parser():
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inputs", nargs="+", required=True, metavar="PATH",
                   help="checkpoint files, or one save dir with --num-epoch-checkpoints / "
                   "--num-update-checkpoints")
    p.add_argument("--output", required=True, metavar="PATH", help="averaged checkpoint to write")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--num-epoch-checkpoints", type=positive, metavar="N",
                       help="average the last N checkpointE.pt of the save dir")
    which.add_argument("--num-update-checkpoints", type=positive, metavar="N",
                       help="average the last N checkpoint_E_U.pt of the save dir")
    r = p.add_argument_group("re-estimation of population statistics")
    r.add_argument("--reestimate-stats", action="store_true",
                   help="recompute the population statistics of BN/PN layers for the averaged weights")
    add_data_args(r, "train", "re-estimate on")
    p.add_argument("-v", "--verbose", action="store_true", help="show fairseq's log")
    return p


def select_inputs(args) -> List[str]:
    """The checkpoint files to average, oldest first."""
    n = args.num_epoch_checkpoints or args.num_update_checkpoints
    if n is None:
        directory = next((path for path in args.inputs if os.path.isdir(path)), None)
        if directory:
            raise ToolError(f"{directory} is a directory: pass --num-epoch-checkpoints N or "
                            "--num-update-checkpoints N to pick checkpoints from it")
        return list(args.inputs)
    if len(args.inputs) != 1 or not os.path.isdir(args.inputs[0]):
        raise ToolError("--num-epoch-checkpoints / --num-update-checkpoints need one save directory as --inputs")
    kind = "epoch" if args.num_epoch_checkpoints else "update"
    found = numbered_checkpoints(args.inputs[0], kind)
    if len(found) < n:
        raise ToolError(f"found {len(found)} {kind} checkpoint(s) in {args.inputs[0]}, need {n}")
    return found[-n:]


def average_model_states(states: Sequence[Dict[str, torch.Tensor]], names: Sequence[str]) -> Dict:
    """Element-wise mean (in float64) of floating-point tensors; others from ``states[0]``."""
    first = states[0]
    for name, sd in zip(names[1:], states[1:]):
        if set(sd) != set(first):
            raise ToolError(f"checkpoints {names[0]} and {name} have different parameters "
                            f"(e.g. {sorted(set(sd) ^ set(first))[0]!r}); they cannot be averaged")
        for k, v in sd.items():
            if tuple(v.shape) != tuple(first[k].shape):
                raise ToolError(f"{k!r} has shape {tuple(v.shape)} in {name} but "
                                f"{tuple(first[k].shape)} in {names[0]}")
    return {k: (torch.stack([sd[k].double() for sd in states]).mean(0).to(v.dtype)
                if v.is_floating_point() else v.clone())
            for k, v in first.items()}


def average(paths: List[str]) -> dict:
    """The state of the input with the most updates, with the averaged model."""
    models, infos, newest, state = [], [], None, None
    for i, path in enumerate(paths):
        loaded = raw_load(path)
        infos.append(checkpoint_info(path, loaded))
        models.append(loaded["model"])
        if newest is None or (infos[i].num_updates or -1) >= (infos[newest].num_updates or -1):
            newest, state = i, loaded  # only this one is kept whole: optimizer states are large
    order = [newest] + [i for i in range(len(paths)) if i != newest]
    state["model"] = average_model_states([models[i] for i in order], [paths[i] for i in order])
    state.setdefault("extra_state", {})["normplug_average"] = {
        "inputs": [os.path.abspath(p) for p in paths], "num_updates": [info.num_updates for info in infos],
        "metadata_from": os.path.abspath(paths[newest]), "reestimated": None}
    return state


def reestimate_population_statistics(model, batches, device="cpu") -> int:
    """Set the population statistics of every BN/PN layer to the mean, over ``batches``, of its
    batch statistics in a training-mode forward without dropout; returns the batch count."""
    norms = model.batch_stat_norms()
    if not norms:
        raise ToolError("the model has no BN/PN layer: there are no population statistics to re-estimate")
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    sums = {name: None for name in norms}

    def record(name, module, x, pad_mask):
        sums[name] = [None if s is None else s.double() + (0 if t is None else t)
                      for s, t in zip(module.batch_statistics(x, pad_mask), sums[name] or (None, None))]

    handles = hook_norm_inputs(norms, record)
    modes = {m: m.training for m in model.modules()}
    count = 0
    try:
        model.eval()
        for m in norms.values():
            m.train()  # normalise with batch statistics, as in training
        with torch.no_grad():
            for sample in batches:
                run_model(model, sample, device)
                count += 1
    finally:
        for h in handles:
            h.remove()
        model.load_state_dict(saved)
        for m, mode in modes.items():
            m.training = mode
    if count == 0:
        raise ToolError("the split gave no batch to re-estimate on")
    with torch.no_grad():
        for name, m in norms.items():
            for buffer, total in zip(m.population_statistics(), sums[name]):
                if buffer is not None:
                    buffer.copy_(total / count)
    return count


def reestimate(state: dict, tmp_path: str, args) -> int:
    model, task, _ = load_model(tmp_path, args.data)
    device = device_for(args)
    model.to(device)
    batches = iterate_batches(task, model, args.split, args.max_tokens, args.max_batches, seed=args.seed)
    count = reestimate_population_statistics(model, batches, device)
    new = model.state_dict()
    for key, value in state["model"].items():
        state["model"][key] = new[key].detach().to("cpu", value.dtype).clone()
    state["extra_state"]["normplug_average"]["reestimated"] = {
        "split": args.split, "batches": count, "max_tokens": args.max_tokens, "seed": args.seed,
        "layers": sorted(model.batch_stat_norms())}
    return count


def main(argv=None):
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)

    def body():
        if args.data is not None and not args.reestimate_stats:
            raise ToolError("--data is only used with --reestimate-stats")
        if args.reestimate_stats:
            need_fairseq(f"{PROG} --reestimate-stats")
        paths = select_inputs(args)
        if os.path.realpath(args.output) in map(os.path.realpath, paths):
            raise ToolError(f"--output {args.output} is one of the inputs: write the average to another file")
        state = average(paths)
        print(f"averaged {len(paths)} checkpoint(s): {', '.join(paths)} (configuration and counters from "
              f"{state['extra_state']['normplug_average']['metadata_from']})")
        with atomic_path(args.output) as tmp:
            torch.save(state, tmp)
            if args.reestimate_stats:
                count = reestimate(state, tmp, args)
                torch.save(state, tmp)
                print(f"re-estimated the population statistics of every BN/PN layer on {count} "
                      f"batch(es) of {args.split}")
    run_tool(PROG, body)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
