"""Training throughput of every normplug architecture against fairseq's stock model of the
same shape, in one process, on the same batches.

For each family (benchmarks/families.py: ``translation``, the IWSLT architectures against
``transformer_iwslt_de_en``, Post- and Pre-Norm; ``lm``, the PTB and WikiText-103 language
models against fairseq's ``transformer_lm`` of the same shape), each round trains every model
for ``--updates`` updates (forward, the family's loss, backward, Adam step) on the same
batches of its synthetic corpus; the order of models is shuffled per round and the median
words/second (target tokens per second) over rounds is compared with the stock model's.

    .venv/bin/python benchmarks/train_throughput.py            # CPU, small dims, both families
    .venv/bin/python benchmarks/train_throughput.py --families lm --compile-norms
    .venv/bin/python benchmarks/train_throughput.py --device cuda --full-size
    .venv/bin/python benchmarks/train_throughput.py --device cuda --impls triton

Each plugin model is timed once per implementation of its fused norms in ``--impls``
(``--norm-impl``; rows "… triton" for the Triton kernels, which need a CUDA device: on the
CPU they are skipped with a line saying so).

The ``transformer_wmt_en_de_*`` architectures differ from the IWSLT ones only in their
dimensions, so on shrunk dimensions they are the same models; with ``--full-size`` both
are timed at their published shapes.
"""
import argparse
import logging
import random
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch

import families  # benchmarks/, this script's folder
import norms

# the small dimensions of a CPU run, per family
SMALL = {
    "translation": ["--encoder-layers", "2", "--decoder-layers", "2",
                    "--encoder-embed-dim", "128", "--decoder-embed-dim", "128",
                    "--encoder-ffn-embed-dim", "256", "--decoder-ffn-embed-dim", "256",
                    "--encoder-attention-heads", "4", "--decoder-attention-heads", "4"],
    "lm": ["--decoder-layers", "2", "--decoder-embed-dim", "128", "--decoder-ffn-embed-dim", "256",
           "--decoder-attention-heads", "4"],
}


def build(data, run, size_args, device, compile_norms, impl=None):
    from fairseq import tasks

    args = families.parse(run, data, ["--criterion", run.criterion, *size_args]
                          + (["--cpu"] if device == "cpu" else []) + (["--compile-norms"] if compile_norms else [])
                          + (["--norm-impl", impl] if impl else []))
    task = tasks.setup_task(args)
    torch.manual_seed(0)
    model = task.build_model(args).to(device)
    criterion = task.build_criterion(args).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98))
    return task, model, criterion, optimizer


def batches(task, max_tokens, count):
    task.load_dataset("train")
    itr = task.get_batch_iterator(
        dataset=task.dataset("train"), max_tokens=max_tokens, seed=1,
        max_positions=task.max_positions(), ignore_invalid_inputs=True,
    ).next_epoch_itr(shuffle=True)
    out = []
    for sample in itr:
        out.append(sample)
        if len(out) == count:
            break
    return out


def to_device(sample, device):
    from fairseq import utils

    return utils.move_to_cuda(sample) if device == "cuda" else sample


def train_round(model, criterion, optimizer, samples, device):
    model.train()
    tokens = 0
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for i, sample in enumerate(samples):
        if hasattr(model, "set_num_updates"):
            model.set_num_updates(i)
        loss, _, log = criterion(model, sample)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        tokens += int(sample["ntokens"])
    if device == "cuda":
        torch.cuda.synchronize()
    return tokens / (time.perf_counter() - start)


def measure(family, args, impls=("torch",)):
    """Median words/s of every run of ``family`` (each plugin run once per implementation in
    ``impls``), as label -> (words/s, its baseline's label)."""
    with tempfile.TemporaryDirectory() as tmp:
        data = families.corpus(family, Path(tmp), args.pairs)
        runs = families.runs(family, data, wmt=args.full_size)
        if args.only:  # the baselines stay
            runs = {label: run for label, run in runs.items() if label in args.only or label == run.baseline}
        size_args = [] if args.full_size else SMALL[family]
        models, samples, baselines = {}, {}, {}  # samples: the batches of each stock row's task, for its group
        for label, run in runs.items():
            plugin = label != run.baseline
            for impl in impls if plugin else (None,):
                row = norms.label(label, impl)
                task, model, criterion, optimizer = build(data, run, size_args, args.device,
                                                          args.compile_norms and plugin, impl)
                if not plugin:
                    samples[label] = [to_device(s, args.device) for s in batches(task, args.max_tokens, args.updates)]
                models[row] = (model, criterion, optimizer, samples[run.baseline])
                baselines[row] = run.baseline
        for label in models:  # warm-up round (and compilation), not timed
            train_round(*models[label], args.device)
        wps = {label: [] for label in models}
        rng = random.Random(0)
        for _ in range(args.rounds):
            order = list(models)
            rng.shuffle(order)
            for label in order:
                wps[label].append(train_round(*models[label], args.device))
    return {row: (statistics.median(wps[row]), baselines[row]) for row in models}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default=",".join(families.FAMILIES),
                    help=f"comma-separated families to time (default: all; {', '.join(families.FAMILIES)})")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--updates", type=int, default=12, help="timed updates per model per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=2048)
    ap.add_argument("--pairs", type=int, default=3000, help="synthetic training pairs (sentences)")
    ap.add_argument("--full-size", action="store_true", help="published dimensions (GPU)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--only", nargs="*", help="architectures to time (default: all)")
    ap.add_argument("--impls", default=",".join(norms.IMPLS),
                    help="implementations of the fused norms, comma-separated (default: %(default)s; "
                         "triton needs a CUDA device)")
    ap.add_argument("--compile-norms", action="store_true",
                    help="normplug's models with --compile-norms (the stock models stay eager)")
    args = ap.parse_args()
    chosen = args.families.split(",")
    for family in chosen:
        if family not in families.FAMILIES:
            ap.error(f"unknown family {family!r}; choose from {', '.join(families.FAMILIES)}")
    for impl in args.impls.split(","):
        if impl not in norms.IMPLS:
            ap.error(f"unknown impl {impl!r}; choose from {', '.join(norms.IMPLS)}")
    impls, skipped = norms.available_impls(args.device, tuple(args.impls.split(",")))
    for line in skipped:
        print(line)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)  # fairseq's INFO lines (and inductor's) would bury the tables
    if args.threads:
        torch.set_num_threads(args.threads)

    norm_mode = "compiled (--compile-norms)" if args.compile_norms else "eager"
    for family in chosen:
        median = measure(family, args, impls)
        dims = "published dimensions" if args.full_size else " ".join(SMALL[family])
        print(f"{family}: training throughput on {args.device} ({dims}), {args.updates} updates x "
              f"{args.rounds} interleaved rounds, max tokens {args.max_tokens}, {norm_mode} norms, "
              f"{torch.get_num_threads()} thread(s); words/s = target tokens per second")
        print("ratios are to fairseq's stock model of the same shape and the same Pre/Post-Norm")
        print(f"{'architecture':50s} {'median wps':>11s} {'x stock':>8s}")
        for label, (wps, baseline) in median.items():
            print(f"{label:50s} {wps:11.0f} {wps / median[baseline][0]:8.3f}")
        print()


if __name__ == "__main__":
    main()
