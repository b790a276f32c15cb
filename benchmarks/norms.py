"""Forward+backward time of every registered norm, against torch's LayerNorm.

    .venv/bin/python benchmarks/norms.py [--device cuda] [--dtype bfloat16] [--threads 1]

One batch of T×B×C activations (default 32×128×512) whose sentences have lengths
drawn uniformly from 8..T, padded on the right (pad_mask B×T, True at padding).
Every norm is built with its defaults, put in train mode and called as
``norm(x, pad_mask)``; a step is the forward plus ``torch.autograd.grad`` of the
output with respect to the input and the norm's parameters, with an upstream
gradient that is zero at padding (as in a model, where nothing reads padding).

Measurements are interleaved: each round times one step of every candidate, in a
fresh random order, so drift and load from other processes hit all of them alike; the table
gives each candidate's median over the rounds, its ratio to ``torch.nn.LayerNorm``
(affine) and to ``x * 2`` (one elementwise pass each way, the memory-bound floor).
"""
import argparse
import importlib
import random
import statistics
import sys
import time
import types
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def load_norms():
    """The norm registry, with every norm module that imports; and the failures.

    Normally ``import normplug.norms`` registers them all. Should one norm module be
    missing or broken, the others are still loaded one by one so their numbers
    can be had.
    """
    try:
        norms = importlib.import_module("normplug.norms")
        return norms, []
    except Exception as exc:  # noqa: BLE001 - report and fall back
        problems = [f"normplug.norms: {type(exc).__name__}: {exc}"]
    for name in [m for m in sys.modules if m == "normplug.norms" or m.startswith("normplug.norms.")]:
        del sys.modules[name]
    pkg = types.ModuleType("normplug.norms")
    pkg.__path__ = [str(REPO / "normplug" / "norms")]
    sys.modules["normplug.norms"] = pkg
    registry = importlib.import_module("normplug.norms.registry")
    for path in sorted((REPO / "normplug" / "norms").glob("*.py")):
        if path.stem in ("__init__", "registry"):
            continue
        try:
            importlib.import_module(f"normplug.norms.{path.stem}")
        except Exception as exc:  # noqa: BLE001
            problems.append(f"normplug.norms.{path.stem}: {type(exc).__name__}: {exc}")
    return registry, problems


def make_batch(T, B, C, device, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, T + 1, (B,), generator=gen) if T >= 8 else torch.full((B,), T)
    pad_mask = torch.arange(T).unsqueeze(0) >= lengths.unsqueeze(1)  # B×T, True at padding
    x = torch.randn(T, B, C, generator=gen) * 1.5 + 0.3
    g = torch.randn(T, B, C, generator=gen)
    g.masked_fill_(pad_mask.t().unsqueeze(-1), 0.0)
    to = dict(device=device, dtype=dtype)
    return x.to(**to), g.to(**to), pad_mask.to(device), lengths


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory for reuse (no trimming, no mmap for
    blocks up to its 32 MB cap). Otherwise whether a step's fresh 8 MB buffers
    page-fault depends on what the previous candidate freed, and that swamps
    the differences being measured (medians moved 2× between identical runs
    here). A long training process is in the kept state anyway. Returns False
    where this is not glibc."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        ok_trim = libc.mallopt(m_trim_threshold, 1 << 30)
        ok_mmap = libc.mallopt(m_mmap_threshold, 32 << 20)
        return bool(ok_trim and ok_mmap)
    except (OSError, AttributeError):
        return False


def step_fn(module, x, g, pad_mask, call):
    params = [p for p in module.parameters() if p.requires_grad]
    inputs = [x] + params

    release = getattr(module, "discrepancy", None)  # batch-statistic norms keep their last terms

    def step():
        y = call(module, x, pad_mask)
        grads = torch.autograd.grad(y, inputs, g)
        if release is not None:
            release()
        return grads

    return step


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--T", type=int, default=32)
    ap.add_argument("--B", type=int, default=128)
    ap.add_argument("--C", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=60, help="timed rounds (one step of each per round)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--clock", default="wall", choices=["wall", "thread"],
        help="wall: elapsed time; thread: CPU time of this thread (CPU with --threads 1 only;"
        " steadier on a machine shared with other jobs, page faults included)",
    )
    ap.add_argument("--only", nargs="*", help="registered norms to time (default: all)")
    ap.add_argument(
        "--allocator", default="keep", choices=["keep", "default"],
        help="keep: glibc keeps freed memory, so timings are not page faults of fresh buffers"
        " (see keep_freed_memory); default: leave malloc as it is",
    )
    args = ap.parse_args(argv)
    allocator = "default malloc"
    if args.allocator == "keep":
        allocator = "malloc keeps freed memory" if keep_freed_memory() else "default malloc (not glibc)"

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.clock == "thread" and (device.type != "cpu" or torch.get_num_threads() != 1):
        ap.error("--clock thread measures one CPU thread: use it with --device cpu --threads 1")
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    dtype = getattr(torch, args.dtype)
    norms, problems = load_norms()

    x, g, pad_mask, lengths = make_batch(args.T, args.B, args.C, device, dtype, args.seed)
    x.requires_grad_(True)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    candidates = {}  # label -> step
    errors = {}
    ln = torch.nn.LayerNorm(args.C).to(device=device, dtype=dtype)
    candidates["torch.nn.LayerNorm"] = step_fn(ln, x, g, pad_mask, lambda m, x, p: m(x))
    candidates["x * 2"] = step_fn(torch.nn.Module(), x, g, pad_mask, lambda m, x, p: x * 2)
    names = list(norms.norm_names())
    rows = []  # (label, name, past warm-up)
    for name in args.only or names:
        rows.append((name, name, False))
        if name == "power":  # a fresh PowerNorm is in warm-up; most of training is past it
            rows.append(("power (past warm-up)", name, True))
    for label, name, past_warmup in rows:
        try:
            module = norms.create_norm(name, args.C).to(device=device, dtype=dtype).train()
            if past_warmup:
                module.set_num_updates(module.warmup_updates)
            step = step_fn(module, x, g, pad_mask, lambda m, x, p: m(x, pad_mask=p))
            for _ in range(2):
                step()  # fails here rather than inside the timing loop
            sync()
            candidates[label] = step
        except Exception as exc:  # noqa: BLE001 - keep the table for the others
            errors[label] = f"{type(exc).__name__}: {exc}"

    times = {k: [] for k in candidates}
    for _ in range(args.warmup):
        for step in candidates.values():
            step()
    sync()
    order = list(candidates)
    rng = random.Random(args.seed)
    for _ in range(args.rounds):
        rng.shuffle(order)  # no candidate always follows the same one
        for label in order:
            step = candidates[label]
            sync()
            t0 = clock()
            step()
            sync()
            times[label].append(clock() - t0)

    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    q = {k: statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3 for k, v in times.items()}
    ref, floor = med["torch.nn.LayerNorm"], med["x * 2"]
    pad_frac = pad_mask.float().mean().item()
    print(
        f"forward+backward, T={args.T} B={args.B} C={args.C} {args.dtype} on {device}"
        f" ({torch.get_num_threads()} threads), padding {pad_frac:.0%} of tokens"
        f" (lengths {int(lengths.min())}..{int(lengths.max())});"
        f" {args.clock} clock, median of {args.rounds} interleaved rounds; {allocator}"
    )
    print(f"{'norm':<22}{'median ms':>11}{'IQR ms':>15}{'min ms':>9}{'x LayerNorm':>13}{'x (x*2)':>9}")
    for label in candidates:
        lo, _, hi = (v * 1e3 for v in q[label])
        print(
            f"{label:<22}{med[label]:>11.3f}{f'{lo:.2f}-{hi:.2f}':>15}{min(times[label]) * 1e3:>9.3f}"
            f"{med[label] / ref:>13.2f}{med[label] / floor:>9.2f}"
        )
    for name, err in errors.items():
        print(f"{name:<22}  failed: {err}")
    for p in problems:
        print(f"(import problem) {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
