"""Host time of the fused norms in eager mode: a forward+backward on a tiny tensor with no
kernel work, against torch's nn.LayerNorm on the same tensor, in one run.

    .venv/bin/python benchmarks/host_time.py [--rounds 30] [--calls 200]

On a GPU a norm over 4–8k tokens takes its kernels some 40 µs; the host time around them (the
autograd.Function, the planning, the allocations, the launches) must stay below that or eager
training waits on the CPU. Here the kernels are replaced by stand-ins that launch nothing, so
what is timed is the plugin's host code alone, on CPU tensors (T×B×C = 5×3×24, a padding mask):

- ``<norm> triton eager``: the autograd.Function calls the launches directly (eager mode);
- ``<norm> triton via custom ops``: the same through the torch.library custom ops, as
  torch.compile traces them: their dispatch is what eager mode skips;
- ``<norm> triton, Triton's launcher``: the real kernels, compiled for sm_90 (no GPU: Triton
  points at that target and the launch itself does nothing), so Triton's own per-launch host
  code is included.

Each round times ``--calls`` steps of every candidate in a fresh random order; the table gives
the median over rounds of the time a step, and its ratio to nn.LayerNorm's.
"""
import argparse
import contextlib
import os
import random
import statistics
import sys
import time
from unittest import mock

import torch

import kernel_plan  # benchmarks/, this script's folder
from normplug.norms import create_norm, impl as norm_impl, triton_batch, triton_power, triton_token

MODULES = (triton_batch, triton_power, triton_token)
T, B, C = 5, 3, 24


class _NoLaunch:
    """Stands in for a kernel: a launch does nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


@contextlib.contextmanager
def no_kernel_work():
    """The kernels replaced by stand-ins; CPU tensors accepted as under the interpreter."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(norm_impl, "interpreting", lambda: True))
        for module in MODULES:
            for name in [n for n in vars(module) if n.endswith("_kernel")]:
                stack.enter_context(mock.patch.object(module, name, _NoLaunch()))
        yield


@contextlib.contextmanager
def through_custom_ops():
    """The autograd.Functions call the torch.library custom ops, as where torch.compile traces."""
    with contextlib.ExitStack() as stack:
        for module in MODULES:
            stack.enter_context(mock.patch.object(module, "traced", lambda op, launches: op))
        yield


@contextlib.contextmanager
def triton_launcher():
    """Triton's launch path for kernels compiled for sm_90, the launch itself a no-op."""
    with kernel_plan.compiling_for(90) as (launches, aot):
        aot.n_by_c = T * B * C
        yield
        launches.clear()


def step_of(norm, x, pad):
    def step():
        xi = x.detach().requires_grad_(True)
        y = norm(xi, pad) if pad is not None else norm(xi)
        y.backward(torch.ones_like(y))
    return step


def candidates():
    """(label, context, step) of every candidate."""
    torch.manual_seed(0)
    x = torch.randn(T, B, C)
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[0, 3:] = True
    rows = [("nn.LayerNorm", contextlib.nullcontext, step_of(torch.nn.LayerNorm(C), x, None))]
    for name, options in (("batch", {}), ("power", {"groups": 4}), ("rms", {})):
        norm = create_norm(name, C, impl="triton", **options).train()
        rows.append((f"{name} triton eager", no_kernel_work, step_of(norm, x, pad)))
        rows.append((f"{name} triton via custom ops", lambda: _both(no_kernel_work, through_custom_ops),
                     step_of(norm, x, pad)))
        rows.append((f"{name} triton, Triton's launcher", triton_launcher, step_of(norm, x, pad)))
    return rows


@contextlib.contextmanager
def _both(first, second):
    with first(), second():
        yield


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET"):
        sys.exit("host_time.py compiles kernels for its launcher rows: run it without TRITON_INTERPRET")
    torch.set_num_threads(1)
    rows = candidates()
    for _, context, step in rows:  # warm-up: compiles the kernels, fills the plans' caches
        with context():
            for _ in range(20):
                step()
    times = {label: [] for label, _, _ in rows}
    for _ in range(args.rounds):
        for label, context, step in random.sample(rows, len(rows)):
            with context():
                start = time.perf_counter()
                for _ in range(args.calls):
                    step()
                times[label].append((time.perf_counter() - start) / args.calls * 1e6)
    base = statistics.median(times["nn.LayerNorm"])
    print(f"Host time of a forward+backward, T×B×C = {T}×{B}×{C}, CPU, 1 thread; median of {args.rounds} "
          f"rounds of {args.calls} calls, interleaved")
    print("| candidate | µs a step | × nn.LayerNorm |")
    print("|---|---|---|")
    for label, _, _ in rows:
        median = statistics.median(times[label])
        print(f"| {label} | {median:.1f} | {median / base:.2f} |")


if __name__ == "__main__":
    main()
