"""Forward+backward time of every registered norm, eager and compiled, against torch's LayerNorm.

    .venv/bin/python benchmarks/norms.py [--device cuda] [--dtype float16] [--threads 1]

One batch of T×B×C activations (default 32×128×512) whose sentences have lengths
drawn uniformly from 8..T, padded on the right (pad_mask B×T, True at padding). Every
norm is built with its defaults, in train mode, and called as ``norm(x, pad_mask)``; a
step is the forward plus ``torch.autograd.grad`` of the output with respect to the input
and the parameters, with an upstream gradient that is zero at padding. "compiled" is
``torch.compile(norm, fullgraph=True, dynamic=False)``, compiled before timing.

Measurements are interleaved: each round times one step of every candidate in a fresh
random order, so drift and load hit all of them alike. The table gives each
candidate's median and its ratio to eager ``torch.nn.LayerNorm`` measured in the same
process, plus ``x * 2`` (one elementwise pass each way, the memory-bound floor).
"""
import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from normplug.norms import create_norm, norm_names  # noqa: E402


def make_batch(T, B, C, device, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min(8, T), T + 1, (B,), generator=gen)
    pad_mask = torch.arange(T).unsqueeze(0) >= lengths.unsqueeze(1)  # B×T, True at padding
    x = torch.randn(T, B, C, generator=gen) * 1.5 + 0.3
    g = torch.randn(T, B, C, generator=gen).masked_fill_(pad_mask.t().unsqueeze(-1), 0.0)
    return x.to(device, dtype), g.to(device, dtype), pad_mask.to(device)


def keep_freed_memory():
    """Ask glibc's malloc to keep freed memory: otherwise whether a step's fresh buffers
    page-fault depends on what the previous candidate freed (medians moved 2× here)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def make_step(module, call, x, g, pad_mask):
    inputs = [x] + [p for p in module.parameters() if p.requires_grad]

    def step():
        grads = torch.autograd.grad(call(x, pad_mask), inputs, g)
        if hasattr(module, "discrepancy"):
            module.discrepancy()  # what the criterion does with the saved statistics
        return grads

    return step


def candidates(C, device, dtype, compiled):
    """label -> (module, how); the norms are built in train mode with their defaults. The
    baseline is normplug's ``layer``: torch's nn.LayerNorm itself, called with the mask."""
    def build(name):
        return create_norm(name, C, **({"groups": 4} if name == "power" else {})).to(device, dtype).train()

    out = {"nn.LayerNorm": (create_norm("layer", C).to(device, dtype), None)}
    for name in norm_names():
        out[name] = (build(name), None)
    if compiled:
        out["nn.LayerNorm compiled"] = (create_norm("layer", C).to(device, dtype), "compile")
        for name in norm_names():
            out[f"{name} compiled"] = (build(name), "compile")
    return out


def measure(device="cpu", dtype=torch.float32, T=32, B=128, C=512, rounds=40, warmup=3, compiled=True):
    """(median seconds per step, seconds of the untimed first calls, padding share) by label."""
    x, g, pad_mask = make_batch(T, B, C, device, dtype, seed=0)
    x.requires_grad_(True)
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    steps, first_calls = {}, {}
    floor_input = x.detach().clone().requires_grad_(True)
    steps["x * 2"] = lambda: torch.autograd.grad(floor_input * 2, [floor_input], g)
    for label, (module, how) in candidates(C, device, dtype, compiled).items():
        call = torch.compile(module, fullgraph=True, dynamic=False) if how == "compile" else module
        steps[label] = make_step(module, call, x, g, pad_mask)
        start = time.perf_counter()
        for _ in range(warmup):  # the first call of a compiled module compiles it
            steps[label]()
        sync()
        first_calls[label] = time.perf_counter() - start
    times = {label: [] for label in steps}
    rng = random.Random(0)
    for _ in range(rounds):
        order = list(steps)
        rng.shuffle(order)
        for label in order:
            sync()
            start = time.perf_counter()
            steps[label]()
            sync()
            times[label].append(time.perf_counter() - start)
    return {label: statistics.median(v) for label, v in times.items()}, first_calls, float(pad_mask.float().mean())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--T", type=int, default=32)
    ap.add_argument("--B", type=int, default=128)
    ap.add_argument("--C", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=40, help="timed rounds (one step of each per round)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true", help="eager only")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    keep_freed_memory()
    compiled = not args.no_compile
    median, first_calls, padding = measure(args.device, getattr(torch, args.dtype), args.T, args.B, args.C,
                                           args.rounds, args.warmup, compiled)
    base = median["nn.LayerNorm"]
    print(f"norm forward+backward on {args.device}, {args.dtype}, T×B×C = {args.T}×{args.B}×{args.C}, "
          f"{padding:.0%} padding, {torch.get_num_threads()} thread(s), median of {args.rounds} "
          f"interleaved rounds; ratio = time / eager nn.LayerNorm ({base * 1e3:.3f} ms)")
    print(f"{'norm':14s} {'eager ms':>9s} {'eager ×LN':>10s}"
          + (f" {'compiled ms':>12s} {'compiled ×LN':>13s} {'first calls s':>14s}" if compiled else ""))
    for name in ["nn.LayerNorm", *norm_names(), "x * 2"]:
        line = f"{name:14s} {median[name] * 1e3:9.3f} {median[name] / base:10.2f}"
        if compiled and f"{name} compiled" in median:
            c = f"{name} compiled"
            line += f" {median[c] * 1e3:12.3f} {median[c] / base:13.2f} {first_calls[c]:14.1f}"
        print(line)


if __name__ == "__main__":
    main()
