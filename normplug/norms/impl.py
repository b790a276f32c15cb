"""Which implementation a norm runs: the plain PyTorch equations or fused Triton kernels.

``impl`` is "torch" (the reference, and the CPU path), "triton" (the fused kernels: CUDA
tensors, or CPU tensors under Triton's interpreter, TRITON_INTERPRET=1) or "auto" (the
default): the torch path, except for a norm of GPU_VERIFIED on a CUDA tensor.
"""
import functools
import importlib.util
import os

import torch

from ..errors import NormplugError
from .registry import NormConfigError

IMPLS = ("auto", "torch", "triton")

# The norms whose kernels "auto" runs on CUDA tensors. A norm enters only when
# `benchmarks/gpu_check.sh --verify` on a GPU printed `VERDICT <norm> correct=yes` and a
# speed below 1 (faster than its own torch path); the commit quotes that output and names the
# device. Empty: no kernel has run on a GPU yet.
GPU_VERIFIED = frozenset()


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


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET, read as Triton reads it)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")


def use_triton(impl: str, x: torch.Tensor, norm: str) -> bool:
    """Whether norm ``norm`` runs its Triton kernels on ``x``: decided by ``impl``, the device
    and the environment, never by tensor values. impl="triton" on a tensor the kernels cannot
    run on is a NormplugError, raised before any launch (Triton's own is "0 active drivers")."""
    if impl == "triton":
        if not x.is_cuda and not interpreting():
            raise NormplugError(f"norm {norm!r}: --norm-impl triton runs Triton kernels on CUDA tensors, "
                                f"got a {x.device.type} tensor; use --norm-impl torch "
                                f"(or TRITON_INTERPRET=1, Triton's slow CPU interpreter)")
        return True
    return impl == "auto" and norm in GPU_VERIFIED and x.is_cuda and triton_available()
