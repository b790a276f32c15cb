"""Speed of the fused norms on a CUDA device: forward+backward of each fused norm's torch path,
eager and compiled, and of its Triton kernels, timed by triton.testing.do_bench (median, L2
flushed between calls) as ratios to eager nn.LayerNorm of the same size, with the achieved
bandwidth and the peak memory a step allocates.

N tokens are T×B with B = 128 sentences of random lengths (norms.make_batch). GB/s counts the
compulsory traffic of a fused forward+backward, 5·N·C elements (x and y forward; x, ∂L/∂y and
∂L/∂x backward), the same for every candidate, so it is comparable with the device's peak.
"compiled" is torch.compile(fullgraph=True, dynamic=True), one graph per norm and dtype for
every size (what --compile-norms settles on once batch shapes vary).
"""
import time

import torch

import norms  # benchmarks/, this script's folder
from gpu_verify import CONFIGS, one_line, power_groups
from normplug.norms import create_norm

SIZES = [(4096, 512), (8192, 1024), (32768, 1024), (8192, 4096)]
SMOKE_SIZES = [(256, 64)]
DTYPES = (torch.float16, torch.bfloat16)
SENTENCES = 128
CANDIDATES = (("torch", False), ("torch", True), ("triton", False))


def config_label(name, opts):
    return name + (f"({opts['detach']})" if opts else "")


def _build(name, opts, C, impl, device, dtype):
    options = dict(opts, impl=impl, **({"groups": power_groups(C)} if name == "power" else {}))
    return create_norm(name, C, **options).to(device, dtype).train()


def _time(module, call, x, g, pad):
    """(median ms, peak MiB above the inputs) of one forward+backward step."""
    from triton.testing import do_bench

    step = norms.make_step(module, call, x, g, pad)
    step()  # compiles a compiled candidate, JIT-compiles the kernels
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    return do_bench(step, warmup=25, rep=100, return_mode="median"), peak


def speed(device, emit, smoke=False, deadline=float("inf"), norms_checked=None):
    """Emit one row per candidate and size; return ({norm: its largest Triton ÷ torch-eager
    time}, the number of sizes timed), the ratio inf where a Triton candidate failed;
    ``norms_checked``: those norms only (default all). Needs CUDA (do_bench times CUDA events)."""
    if not str(device).startswith("cuda"):
        emit(("speed", "all", "n/a", "", "do_bench times CUDA kernels: no CUDA device here"))
        return {}, 0
    worst, sizes = {}, 0
    for dtype in DTYPES:
        torch._dynamo.reset()  # each dtype's graphs start afresh (and stay under the recompile limit)
        for N, C in SMOKE_SIZES if smoke else SIZES:
            part = f"speed {str(dtype)[6:]} N={N} C={C}"
            if time.monotonic() > deadline:
                emit((part, "all", "not run", "", "the check's deadline passed"))
                continue
            x, g, pad = norms.make_batch(N // SENTENCES, SENTENCES, C, device, dtype, seed=0)
            x.requires_grad_(True)
            gbytes = 5 * N * C * x.element_size() / 1e9
            ln = create_norm("layer", C).to(device, dtype)
            base, peak = _time(ln, ln, x, g, pad)
            sizes += 1
            emit((part, "nn.LayerNorm", f"{base * 1e3:.1f} us", "1.00 × LN",
                  f"{gbytes / base * 1e3:,.0f} GB/s, {peak:.0f} MiB"))
            for name, opts in (c for c in CONFIGS if norms_checked is None or c[0] in norms_checked):
                label, ms = config_label(name, opts), {}
                for impl, compiled in CANDIDATES:
                    module = _build(name, opts, C, impl, device, dtype)
                    call = torch.compile(module, fullgraph=True, dynamic=True) if compiled else module
                    row = f"{label} {impl}" + (" compiled" if compiled else "")
                    try:
                        ms[impl, compiled], peak = _time(module, call, x, g, pad)
                    except Exception as err:  # noqa: BLE001 (the row says so; the others still run)
                        emit((part, row, "failed", "", one_line(err)))
                        continue
                    t = ms[impl, compiled]
                    emit((part, row, f"{t * 1e3:.1f} us", f"{t / base:.2f} × LN",
                          f"{gbytes / t * 1e3:,.0f} GB/s, {peak:.0f} MiB"))
                if ("torch", False) in ms:
                    triton = ms.get(("triton", False), float("inf"))  # inf: the Triton candidate failed
                    worst[name] = max(worst.get(name, 0.0), triton / ms["torch", False])
    return worst, sizes
