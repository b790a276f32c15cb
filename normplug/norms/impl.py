"""Which implementation a norm runs: the plain PyTorch equations or fused Triton kernels.

``impl`` is "torch" (the reference, and the CPU path), "triton" (fused kernels; CPU tensors
only under Triton's interpreter, TRITON_INTERPRET=1) or "auto" (Triton for CUDA tensors when
triton imports, torch otherwise).
"""
import functools
import importlib.util

import torch

from .registry import NormConfigError

IMPLS = ("auto", "torch", "triton")


@functools.lru_cache(maxsize=None)
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def check_impl(norm: str, impl) -> str:
    """``impl`` if it is one of IMPLS; a NormConfigError naming the choices otherwise."""
    if impl not in IMPLS:
        raise NormConfigError(f"norm {norm!r}: invalid impl={impl!r}; valid choices: {', '.join(IMPLS)}")
    if impl == "triton" and not triton_available():
        raise NormConfigError(f"norm {norm!r}: impl='triton' needs the triton package "
                              f"(pip install triton); valid choices without it: auto, torch")
    return impl


def use_triton(impl: str, x: torch.Tensor) -> bool:
    """Whether this call runs the Triton kernels (decided by device, never by tensor values)."""
    return impl == "triton" or (impl == "auto" and x.is_cuda and triton_available())
