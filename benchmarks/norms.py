"""Forward+backward time of every registered norm, eager and compiled, torch and Triton
implementations, against torch's LayerNorm.

    .venv/bin/python benchmarks/norms.py [--device cuda] [--dtype float16] [--threads 1] [--impls torch]

One batch of T×B×C activations (default 32×128×512) whose sentences have lengths
drawn uniformly from 8..T, padded on the right (pad_mask B×T, True at padding). Every
norm is built with its defaults, in train mode, and called as ``norm(x, pad_mask)``; a
step is the forward plus ``torch.autograd.grad`` of the output with respect to the input
and the parameters, with an upstream gradient that is zero at padding. "compiled" is
``torch.compile(norm, fullgraph=True, dynamic=False)``, compiled before timing. Norms with
an ``impl`` option run twice: the plain torch code (``impl="torch"``) and the fused Triton
kernels (``impl="triton"``, on a CUDA device with triton installed; skipped otherwise).

Measurements are interleaved: each round times one step of every candidate in a fresh
random order, so drift and load hit all of them alike. The table gives each
candidate's median and its ratio to eager ``torch.nn.LayerNorm`` measured in the same
process, plus ``x * 2`` (one elementwise pass each way, the memory-bound floor).
"""
import argparse
import logging
import random
import statistics
import time

import torch

from normplug.norms import create_norm, norm_names, norm_options
from normplug.norms.impl import triton_available

IMPLS = ("torch", "triton")


def fused_norms():
    """The norms that take ``impl`` (a torch and a Triton implementation)."""
    return [name for name in norm_names() if "impl" in norm_options(name)]


def available_impls(device, wanted=IMPLS):
    """The implementations of ``wanted`` that run on ``device``, and a line for each skipped one."""
    runnable = str(device).startswith("cuda") and triton_available()
    skipped = [] if runnable or "triton" not in wanted else [
        "triton impl skipped: its kernels need a CUDA device and the triton package "
        "(the tests run them on the CPU under TRITON_INTERPRET=1)"]
    return tuple(i for i in wanted if i == "torch" or runnable), skipped


def label(name, impl="torch", compiled=False):
    """A candidate's label: the norm, " triton" for its Triton implementation, " compiled"."""
    return name + (" triton" if impl == "triton" else "") + (" compiled" if compiled else "")


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


def candidates(C, device, dtype, compiled, impls=("torch",)):
    """label -> (module, how); the norms are built in train mode with their defaults. The
    baseline is normplug's ``layer``: torch's nn.LayerNorm itself, called with the mask."""
    fused = fused_norms()

    def build(name, impl):
        options = dict({"groups": 4} if name == "power" else {}, **({"impl": impl} if name in fused else {}))
        return create_norm(name, C, **options).to(device, dtype).train()

    out = {"nn.LayerNorm": (create_norm("layer", C).to(device, dtype), None)}
    if compiled:
        out["nn.LayerNorm compiled"] = (create_norm("layer", C).to(device, dtype), "compile")
    for name in norm_names():
        for impl in impls if name in fused else ("torch",):
            out[label(name, impl)] = (build(name, impl), None)
            if compiled:
                out[label(name, impl, compiled=True)] = (build(name, impl), "compile")
    return out


def measure(device="cpu", dtype=torch.float32, T=32, B=128, C=512, rounds=40, warmup=3, compiled=True,
            impls=("torch",)):
    """(median seconds per step, seconds of the untimed first calls, padding share, failures)
    by label (:func:`label`); ``impls``: the implementations of the fused norms to time. A
    candidate whose first calls raise (a compilation that fails) is left out of the timing
    and listed in ``failures`` with its error, so one failure does not stop the others."""
    x, g, pad_mask = make_batch(T, B, C, device, dtype, seed=0)
    x.requires_grad_(True)
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    steps, first_calls, failures = {}, {}, {}
    floor_input = x.detach().clone().requires_grad_(True)
    steps["x * 2"] = lambda: torch.autograd.grad(floor_input * 2, [floor_input], g)
    for key, (module, how) in candidates(C, device, dtype, compiled, impls).items():
        call = torch.compile(module, fullgraph=True, dynamic=False) if how == "compile" else module
        steps[key] = make_step(module, call, x, g, pad_mask)
        start = time.perf_counter()
        try:
            for _ in range(warmup):  # the first call of a compiled module compiles it
                steps[key]()
            sync()
        except Exception as err:  # noqa: BLE001 (reported in the table, the others still run)
            failures[key] = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
            del steps[key]
            continue
        first_calls[key] = time.perf_counter() - start
    times = {key: [] for key in steps}
    rng = random.Random(0)
    for _ in range(rounds):
        order = list(steps)
        rng.shuffle(order)
        for key in order:
            sync()
            start = time.perf_counter()
            steps[key]()
            sync()
            times[key].append(time.perf_counter() - start)
    return ({key: statistics.median(v) for key, v in times.items()}, first_calls,
            float(pad_mask.float().mean()), failures)


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
    ap.add_argument("--impls", default=",".join(IMPLS),
                    help="implementations of the fused norms, comma-separated (default: %(default)s)")
    args = ap.parse_args(argv)
    logging.getLogger().setLevel(logging.WARNING)  # importing normplug imports fairseq, which sets DEBUG
    for impl in args.impls.split(","):
        if impl not in IMPLS:
            ap.error(f"unknown impl {impl!r}; choose from {', '.join(IMPLS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    keep_freed_memory()
    compiled = not args.no_compile
    impls, skipped = available_impls(args.device, tuple(args.impls.split(",")))
    for line in skipped:
        print(line)
    median, first_calls, padding, failures = measure(args.device, getattr(torch, args.dtype), args.T, args.B, args.C,
                                           args.rounds, args.warmup, compiled, impls)
    base = median["nn.LayerNorm"]
    print(f"norm forward+backward on {args.device}, {args.dtype}, T×B×C = {args.T}×{args.B}×{args.C}, "
          f"{padding:.0%} padding, {torch.get_num_threads()} thread(s), median of {args.rounds} "
          f"interleaved rounds; ratio = time / eager nn.LayerNorm ({base * 1e3:.3f} ms)")
    modes = [False, True] if compiled else [False]
    columns = [(impl, c) for c in modes for impl in impls]
    print(f"{'norm':14s}" + "".join(f" {impl + (' compiled' if c else ' eager'):>17s}" for impl, c in columns)
          + (f" {'first calls s':>14s}" if compiled else ""))
    for name in ["nn.LayerNorm", *norm_names(), "x * 2"]:
        cells = []
        for impl, c in columns:
            key = label(name, impl, c) if name != "x * 2" or not c else None
            if key in median:
                cells.append(f"{median[key] * 1e3:7.3f} ms {median[key] / base:5.2f}×")
            else:
                cells.append("failed" if key in failures else "—")
        line = f"{name:14s}" + "".join(f" {cell:>17s}" for cell in cells)
        if compiled and label(name, compiled=True) in first_calls:
            line += f" {first_calls[label(name, compiled=True)]:14.1f}"
        print(line)
    for key, error in failures.items():
        print(f"{key}: failed: {error}")


if __name__ == "__main__":
    main()
