"""The fused norms' launches compiled for an NVIDIA GPU without one: per launch, the bytes it
moves, its programs, warps, registers, spills, the warps a multiprocessor keeps resident and
its bandwidth-bound time on an H100 (3.35 TB/s), next to torch's LayerNorm.

    .venv/bin/python benchmarks/kernel_plan.py                     # sm_90, the GPU check's sizes, fp16
    .venv/bin/python benchmarks/kernel_plan.py --arch 80 --dtypes float32,bfloat16
    .venv/bin/python benchmarks/kernel_plan.py --sizes 1024x16384 --norms batch,power,rms

A training step (forward and backward) of each fused norm runs through its public module
(``create_norm(name, C, impl="triton")``) on CPU tensors, with Triton pointed at an sm_90 or
sm_80 target (``compiling_for``): the host code plans every launch as on that GPU (its
registers read from the kernel compiled for it), and each launch compiles its kernel with
Triton's compiler and the wheel's ptxas, records it, and runs nothing. Registers and local
memory (spills) come from the binary (cuobjdump). Nothing here is a measurement: the times are
bytes ÷ bandwidth, the least a launch could take.

Bytes moved counts each tensor a launch reads or writes once (the compulsory traffic; a tensor
that fits in L2 may be read from there by the next launch). A BatchNorm launch after a split
reduction also re-reads the partial sums of its channels from every split (in L2): "merge KB".
torch's LayerNorm is one kernel forward (x → y) and two backward (x, ∂y → ∂x; x, ∂y → ∂γ, ∂β).
"""
import argparse
import contextlib
import math
import os
import re
import subprocess
import sys
import tempfile
import warnings
from typing import NamedTuple
from unittest import mock

import torch

from normplug.norms import create_norm, impl as norm_impl, triton_grid

H100_BANDWIDTH = 3.35e12  # bytes/s of an H100 SXM's HBM3
SIZES = [(4096, 512), (8192, 1024), (32768, 1024), (8192, 4096)]  # the GPU check's N×C
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
NORMS = {"batch": {}, "power": None, "layer_simple": {}, "detach": {"detach": "mean"}, "adanorm": {},
         "rms": {}, "scale": {}}  # None: PowerNorm's groups from the GPU check (power_groups)
SENTENCES = 128


class Launch(NamedTuple):
    kernel: str
    grid: tuple
    warps: int
    registers: int
    spill_bytes: int  # local memory a thread (ptxas spills registers there)
    shared: int
    bytes: int  # each tensor argument once
    merge_bytes: int  # partial sums re-read by every split of a merging launch (from L2)
    streams: bool  # reads an N×C tensor

    @property
    def programs(self):
        return math.prod(self.grid)

    def resident_warps(self, gpu):
        """Warps resident on one multiprocessor: programs that fit (registers, shared memory,
        warps) or that the grid gives it, times the warps of one."""
        fit = triton_grid.programs_per_multiprocessor(self.registers, self.warps, self.shared, gpu)
        return min(fit, math.ceil(self.programs / gpu.multiprocessors)) * self.warps


def power_groups(C):
    """The groups the GPU check gives PowerNorm (benchmarks/gpu_verify.py)."""
    return max(g for g in (1, 2, 4, 8, 16) if C % g == 0 and C // g >= min(64, C))


class _AotUtils:
    """The part of Triton's CUDA driver that loads a binary: here it reads the binary's resources."""

    cuobjdump = None

    def __init__(self, gpu):
        self.gpu = gpu

    def get_device_properties(self, device):
        return {"max_shared_mem": self.gpu.shared - 1024, "multiprocessor_count": self.gpu.multiprocessors}

    def load_binary(self, name, cubin, shared, device):
        import triton

        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(cubin)
            f.flush()
            usage = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True,
                                   check=True).stdout
        found = dict(re.findall(r"\b(REG|STACK|LOCAL):(\d+)", usage))
        regs, spills = int(found["REG"]), int(found["STACK"]) + int(found["LOCAL"])
        return name, (name, regs, spills), regs, spills, 1024  # module, function, n_regs, n_spills, threads

    def unload_module(self, module):
        pass


class _AotDriver:
    """Stands in for Triton's CUDA driver: compiles for ``arch`` and records launches instead of running them."""

    def __init__(self, arch, launches):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", arch, 32)
        self.utils = _AotUtils(triton_grid.PLANNED_GPUS[arch])
        self.launches = launches

    def get_current_device(self):
        return f"sm_{self.target.arch}"

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target

    def launcher_cls(self, src, metadata):
        names = src.fn.arg_names

        def launch(gx, gy, gz, stream, function, packed_metadata, launch_metadata, enter, exit_, *args):
            name, regs, spills = function
            values = dict(zip(names, args))
            tensors = {a.data_ptr(): a for a in args if isinstance(a, torch.Tensor)}
            streams = any(t.numel() == self.n_by_c for t in tensors.values())
            # a launch that merges S splits' partials (an argument S) reads them once a split
            merges = "S" in values and values["S"] > 1
            merge_bytes = values["part_ptr"].nbytes * gy if merges else 0
            self.launches.append(Launch(name, (gx, gy, gz), metadata.num_warps, regs, spills, metadata.shared,
                                        sum(t.nbytes for t in tensors.values()), merge_bytes, streams))
        return launch

    n_by_c = None


_AOT_DRIVERS = {}  # one an arch: a compiled kernel keeps the launcher of the driver it was loaded by


@contextlib.contextmanager
def compiling_for(arch):
    """Within: Triton compiles for sm_``arch`` and records launches (yielded list) instead of
    running them; CPU tensors stand in for CUDA ones and plan for that GPU."""
    from triton.runtime import driver

    launches = []
    aot = _AOT_DRIVERS.setdefault(arch, _AotDriver(arch, None))
    aot.launches = launches
    previous = driver._active  # None until a driver was asked for
    driver.set_active(aot)
    try:
        with mock.patch.object(norm_impl, "interpreting", lambda: True), \
                mock.patch.object(triton_grid, "planned_gpu", triton_grid.PLANNED_GPUS[arch]), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Triton's notes on its defaults
            yield launches, aot
    finally:
        driver._active = previous


def step_launches(name, options, N, C, dtype, arch, training=True, sync=False):
    """The launches of one step (forward, backward; in training or eval) of norm ``name`` on N
    tokens of C channels in ``dtype`` (a third of the sentences end in padding at half length);
    ``sync``: statistics summed over workers (a one-worker gloo group)."""
    with compiling_for(arch) as (launches, aot):
        aot.n_by_c = N * C
        norm = create_norm(name, C, impl="triton", **options).to(dtype).train(training)
        if sync:
            if not torch.distributed.is_initialized():
                torch.distributed.init_process_group("gloo", init_method="file://" + tempfile.mktemp(),
                                                     rank=0, world_size=1)
            norm._sync = lambda: True
        T = N // SENTENCES
        x = torch.empty(T, SENTENCES, C, dtype=dtype).requires_grad_(True)
        pad = torch.zeros(SENTENCES, T, dtype=torch.bool)
        pad[::3, T // 2:] = True
        y = norm(x, pad)
        y.backward(torch.empty_like(y))
    return launches


def records(arch, cases):
    """One dict a launch of each case (name, options, N, C, dtype name, training, sync), with
    its resident warps a multiprocessor, or one dict with the error of a refused case."""
    gpu = triton_grid.PLANNED_GPUS[arch]
    rows = []
    for name, options, N, C, dtype, training, sync in cases:
        case = dict(arch=arch, norm=name, options=options, N=N, C=C, dtype=dtype, training=training, sync=sync)
        try:
            launches = step_launches(name, options, N, C, DTYPES[dtype], arch, training, sync)
        except Exception as err:  # noqa: BLE001 (a refused width is a record)
            rows.append(dict(case, error=f"{type(err).__name__}: {err}"))
            continue
        rows += [dict(case, **launch._asdict(), programs=launch.programs,
                      resident_warps=launch.resident_warps(gpu)) for launch in launches]
    return rows


def layer_norm_launches(N, C, dtype):
    """torch's LayerNorm, as (kernel, bytes): forward x → y (+ μ, 1/σ); backward x, ∂y → ∂x and
    x, ∂y → ∂γ, ∂β."""
    e = torch.finfo(dtype).bits // 8
    stats = 2 * N * 4
    return [("LayerNorm forward", 2 * N * C * e + stats), ("LayerNorm ∂x", 3 * N * C * e + stats),
            ("LayerNorm ∂γ ∂β", 2 * N * C * e + stats)]


def norm_options(name, C):
    options = NORMS[name]
    return {"groups": power_groups(C)} if options is None else dict(options)


def table(arch, norms, sizes, dtypes, emit=print):
    gpu = triton_grid.PLANNED_GPUS[arch]
    emit(f"Compiled for sm_{arch} ({gpu.name}, {gpu.multiprocessors} multiprocessors); times are "
         f"bytes / {H100_BANDWIDTH / 1e12:.2f} TB/s, estimates, not measurements.")
    emit("| dtype | N×C | norm | launch | MB | merge MB | programs | warps | regs | spill B | resident warps/SM | est. µs |")
    emit("|---|---|---|---|---|---|---|---|---|---|---|---|")
    worst = []
    for dtype in dtypes:
        for N, C in sizes:
            size = f"{N}×{C}"
            ln = layer_norm_launches(N, C, dtype)
            ln_us = sum(b for _, b in ln) / H100_BANDWIDTH * 1e6
            for kernel, nbytes in ln:
                emit(f"| {str(dtype)[6:]} | {size} | layer (torch) | {kernel} | {nbytes / 1e6:.1f} | | | | | | | "
                     f"{nbytes / H100_BANDWIDTH * 1e6:.1f} |")
            for name in norms:
                options = norm_options(name, C)
                label = name + "".join(f" {k}={v}" for k, v in options.items())
                try:
                    launches = step_launches(name, options, N, C, dtype, arch)
                except Exception as err:  # noqa: BLE001 (a refused width is a row of the table)
                    emit(f"| {str(dtype)[6:]} | {size} | {label} | refused | {str(err).splitlines()[0]} |")
                    continue
                total = 0.0
                for launch in launches:
                    us = launch.bytes / H100_BANDWIDTH * 1e6
                    total += us
                    warps = launch.resident_warps(gpu)
                    emit(f"| {str(dtype)[6:]} | {size} | {label} | {launch.kernel} | {launch.bytes / 1e6:.1f} | "
                         f"{launch.merge_bytes / 1e6:.1f} | "
                         f"{launch.programs} | {launch.warps} | {launch.registers} | {launch.spill_bytes} | "
                         f"{warps if launch.streams else '-'} | {us:.1f} |")
                    worst.append((launch.spill_bytes, label, size, launch.kernel))
                emit(f"| {str(dtype)[6:]} | {size} | {label} | **step** | | | {len(launches)} launches | | | | | "
                     f"{total:.1f} = {total / ln_us:.2f} × LayerNorm's {ln_us:.1f} |")
    spills = [w for w in worst if w[0]]
    emit(f"launches that spill: {len(spills)} of {len(worst)}" + (f" (first: {spills[0]})" if spills else ""))
    return worst


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, choices=sorted(triton_grid.PLANNED_GPUS), default=90)
    parser.add_argument("--norms", default="batch,power,layer_simple,rms")
    parser.add_argument("--dtypes", default="float16")
    parser.add_argument("--sizes", default=",".join(f"{n}x{c}" for n, c in SIZES),
                        help="N×C, comma-separated (N a multiple of 128)")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET"):
        sys.exit("kernel_plan.py compiles kernels: run it without TRITON_INTERPRET")
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]
    table(args.arch, args.norms.split(","), sizes, [DTYPES[d] for d in args.dtypes.split(",")])


if __name__ == "__main__":
    main()
