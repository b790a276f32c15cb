"""How the fused norms' launches are sized for the GPU they run on.

A launch that streams N×C elements is memory-bound: it is as fast as the loads it keeps in
flight, so every multiprocessor should hold as many of its programs as its registers allow.
That number depends on the compiled kernel: ``resident_programs`` compiles the kernel for the
launch's arguments (Triton compiles it once per specialisation and keeps it; the count is
cached) and divides the multiprocessor's registers by the kernel's; the grid then gives every
multiprocessor that many programs. Under Triton's CPU interpreter nothing is compiled: a launch
plans for a nominal H100 and NOMINAL_REGISTERS, so that the CPU tests run the code a GPU runs.
The same code plans for an sm_80 or sm_90 GPU without one when benchmarks/kernel_plan.py points
Triton at that target and CPU tensors stand in for CUDA ones.

Imports torch only (triton is imported by the kernel modules that call it).
"""
import functools
from typing import NamedTuple

import torch

NOMINAL_REGISTERS = 64  # a thread's registers assumed where no kernel is compiled (the interpreter)


# triton.cdiv and triton.next_power_of_2 cost microseconds a call on the host (constexpr functions)
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The least power of 2 >= n (n >= 1)."""
    return 1 << (n - 1).bit_length()


class Gpu(NamedTuple):
    """What a multiprocessor holds: the limits that decide how many programs stay resident."""

    name: str
    multiprocessors: int
    registers: int = 65536  # 32-bit registers of a multiprocessor
    warps: int = 64  # resident warps of a multiprocessor at most
    programs: int = 32  # resident programs (thread blocks) of a multiprocessor at most
    shared: int = 228 * 1024  # shared memory of a multiprocessor, bytes


H100 = Gpu("H100 SXM (sm_90)", 132)
A100 = Gpu("A100 SXM (sm_80)", 108, shared=164 * 1024)
PLANNED_GPUS = {90: H100, 80: A100}
# the GPU that launches on CPU tensors plan for (benchmarks/kernel_plan.py sets A100 for sm_80)
planned_gpu = H100


@functools.lru_cache(maxsize=None)
def _cuda_gpu(index: int) -> Gpu:
    props = torch.cuda.get_device_properties(index)
    return Gpu(props.name, props.multi_processor_count,
               registers=getattr(props, "regs_per_multiprocessor", 65536),
               warps=getattr(props, "max_threads_per_multi_processor", 2048) // 32,
               shared=getattr(props, "shared_memory_per_multiprocessor", 228 * 1024))


def gpu_of(device: torch.device) -> Gpu:
    """The GPU of a CUDA ``device``; ``planned_gpu`` for any other device."""
    if device.type == "cuda":
        return _cuda_gpu(device.index if device.index is not None else torch.cuda.current_device())
    return planned_gpu


def programs_per_multiprocessor(registers: int, warps: int, shared: int, gpu: Gpu) -> int:
    """How many programs of ``warps`` warps, each thread using ``registers`` registers and the
    program ``shared`` bytes of shared memory, a multiprocessor of ``gpu`` keeps resident (at
    least 1). Registers are allocated to a warp in units of 256 (8 a thread)."""
    per_warp = -(-registers * 32 // 256) * 256
    fit = min(gpu.programs, gpu.warps // warps, gpu.registers // (per_warp * warps),
              gpu.shared // (shared + 1024))  # the driver reserves 1 KB of a program's shared memory
    return max(1, fit)


_resident = {}


def resident_programs(kernel, args, options, device: torch.device) -> int:
    """Programs of ``kernel`` that ``device``'s GPU keeps resident (on all its multiprocessors)
    when launched on ``args`` with ``options`` (its constexprs and num_warps; a dtype in
    ``args`` stands for a tensor of that dtype). The kernel is compiled for these arguments (and
    kept by Triton for the launch); its registers are read once per kernel, options, dtype of
    the first argument and what Triton specialises an int on (divisible by 16, equal to 1: an
    unaligned channel count compiles to a different kernel). The interpreter compiles nothing:
    NOMINAL_REGISTERS."""
    ints = tuple((a % 16 == 0, a == 1) for a in args if isinstance(a, int) and not isinstance(a, bool))
    key = (kernel, device, planned_gpu, getattr(args[0], "dtype", None), ints, *options.values())
    if key not in _resident:
        from triton.runtime import JITFunction

        gpu = gpu_of(device)
        registers, shared = NOMINAL_REGISTERS, 0
        if isinstance(kernel, JITFunction):  # compiled by Triton, not run by its interpreter
            compiled = kernel.warmup(*args, grid=(1,), **options)
            compiled._init_handles()  # loads the binary, which reports its registers
            registers, shared = compiled.n_regs, compiled.metadata.shared
        per_multiprocessor = programs_per_multiprocessor(registers, options.get("num_warps", 4), shared, gpu)
        _resident[key] = per_multiprocessor * gpu.multiprocessors
    return _resident[key]


def traced(op, launches):
    """``op`` where torch.compile traces (it sees the buffers the op declares it updates), else
    ``launches``, the op's Python body: eager mode skips the dispatcher's cost."""
    return op if torch.compiler.is_compiling() else launches
