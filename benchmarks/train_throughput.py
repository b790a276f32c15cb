"""Training throughput of every normplug architecture against fairseq's stock
``transformer_iwslt_de_en``, in one process, on the same batches.

Each round trains every model for ``--updates`` updates (forward, label-smoothed
loss, backward, Adam step) on the same batches of the synthetic corpus; the
order of models is shuffled per round and the median words/second (target
tokens per second) over rounds is compared with the stock model's.

    .venv/bin/python benchmarks/train_throughput.py            # CPU, small dims
    .venv/bin/python benchmarks/train_throughput.py --device cuda --full-size

The ``transformer_wmt_en_de_*`` architectures differ from the IWSLT ones only
in their dimensions, so on shrunk dimensions they are the same models; with
``--full-size`` both families are timed at their published shapes.
"""
import argparse
import random
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

SMALL = [
    "--encoder-layers", "2", "--decoder-layers", "2",
    "--encoder-embed-dim", "128", "--decoder-embed-dim", "128",
    "--encoder-ffn-embed-dim", "256", "--decoder-ffn-embed-dim", "256",
    "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
]


def corpus(workdir: Path, pairs: int) -> Path:
    from synthetic import binarize, generate

    raw, dest = workdir / "raw", workdir / "bin"
    generate(raw, seed=7, n_train=pairs, n_valid=50, n_test=50)
    return binarize(raw, dest)


def build(data, arch, size_args, device, compile_norms=False):
    from fairseq import options, tasks

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        str(data), "--user-dir", str(REPO / "normplug"), "--arch", arch, *size_args,
        "--share-all-embeddings", "--dropout", "0.1", "--criterion", "label_smoothed_cross_entropy",
        "--label-smoothing", "0.1", "--warmup-updates", "4000",
    ] + (["--cpu"] if device == "cpu" else []) + (["--compile-norms"] if compile_norms else []))
    task = tasks.setup_task(args)
    torch.manual_seed(0)
    model = task.build_model(args).to(device)
    criterion = task.build_criterion(args).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98))
    return task, model, criterion, optimizer, args


def batches(task, args, max_tokens, count):
    task.load_dataset("train")
    itr = task.get_batch_iterator(
        dataset=task.dataset("train"), max_tokens=max_tokens, seed=1,
        max_positions=(1024, 1024), ignore_invalid_inputs=True,
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--updates", type=int, default=12, help="timed updates per model per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=2048)
    ap.add_argument("--pairs", type=int, default=3000, help="synthetic training pairs")
    ap.add_argument("--full-size", action="store_true", help="published dimensions (GPU)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--only", nargs="*", help="architectures to time (default: all)")
    ap.add_argument("--compile-norms", action="store_true",
                    help="normplug's models with --compile-norms (the stock models stay eager)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    if args.threads:
        torch.set_num_threads(args.threads)

    import normplug  # noqa: F401
    from normplug.models.architectures import ARCHITECTURES

    names = sorted(ARCHITECTURES)
    if not args.full_size:
        names = [n for n in names if n.startswith("transformer_iwslt_de_en")]
    if args.only:
        names = [n for n in names if n in args.only]
    # baselines: fairseq's own model, Post- and Pre-Norm, per shape
    shapes = ["transformer_iwslt_de_en"] + (["transformer_wmt_en_de"] if args.full_size else [])
    prenorm_flags = ["--encoder-normalize-before", "--decoder-normalize-before"]
    runs = {}
    for shape in shapes:
        runs[f"{shape} (stock)"] = (shape, [])
        runs[f"{shape} (stock, prenorm)"] = (shape, prenorm_flags)
    runs.update({name: (name, []) for name in names})
    size_args = [] if args.full_size else SMALL

    with tempfile.TemporaryDirectory() as tmp:
        data = corpus(Path(tmp), args.pairs)
        models = {}
        samples = None
        for label, (arch, extra) in runs.items():
            task, model, criterion, optimizer, fargs = build(
                data, arch, size_args + extra, args.device, args.compile_norms and "(stock" not in label)
            if samples is None:
                samples = [to_device(s, args.device) for s in batches(task, fargs, args.max_tokens, args.updates)]
            models[label] = (model, criterion, optimizer)
            del task
        for model, criterion, optimizer in models.values():  # warm-up round (and compilation), not timed
            train_round(model, criterion, optimizer, samples, args.device)
        wps = {label: [] for label in models}
        rng = random.Random(0)
        for _ in range(args.rounds):
            order = list(models)
            rng.shuffle(order)
            for label in order:
                wps[label].append(train_round(*models[label], samples, args.device))

    median = {label: statistics.median(v) for label, v in wps.items()}
    dims = "published dimensions" if args.full_size else "2+2 layers, 128/256, 4 heads"
    norms = "compiled (--compile-norms)" if args.compile_norms else "eager"
    print(f"training throughput on {args.device} ({dims}), {args.updates} updates x {args.rounds} "
          f"interleaved rounds, max tokens {args.max_tokens}, {norms} norms, "
          f"{torch.get_num_threads()} thread(s); words/s = target tokens per second")
    print("ratios are to fairseq's stock model of the same shape and the same Pre/Post-Norm")
    print(f"{'architecture':50s} {'median wps':>11s} {'x stock':>8s}")
    for label in runs:
        shape = next(s for s in shapes if label.startswith(s))
        prenorm = label.endswith("_prenorm") or label.endswith("prenorm)")
        base = median[f"{shape} (stock, prenorm)" if prenorm else f"{shape} (stock)"]
        print(f"{label:50s} {median[label]:11.0f} {median[label] / base:8.3f}")

if __name__ == "__main__":
    main()
