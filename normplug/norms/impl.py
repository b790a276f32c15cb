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

# The widest rows the fused kernels hold in registers, so that none spills on sm_80 or sm_90
# (tests/test_kernel_plan.py compiles them there): a token of a per-token norm, a group of
# PowerNorm's channels. Wider ones are refused with impl="triton" and run on torch with "auto".
MAX_ROW_CHANNELS = 8192
MAX_GROUP_CHANNELS = 4096


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


def check_width(norm: str, impl: str, channels: int, limit: int, held: str) -> None:
    """With impl="triton", a NormConfigError if the kernels would hold more than ``limit``
    channels in registers (``held``: what they hold, and what sets ``channels``)."""
    if impl == "triton" and channels > limit:
        raise NormConfigError(f"norm {norm!r}: impl='triton' holds {held} in registers, at most {limit} "
                              f"channels, got {channels}; use impl='torch' (fairseq: --norm-impl torch)")


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET, read as Triton reads it)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")


def use_triton(impl: str, x: torch.Tensor, norm: str, fits: bool = True) -> bool:
    """Whether norm ``norm`` runs its Triton kernels on ``x``: decided by ``impl``, the device
    and the environment, never by tensor values; "auto" also needs ``fits`` (the channels the
    kernels hold in registers within their limit). impl="triton" on a tensor the kernels cannot
    run on is a NormplugError, raised before any launch (Triton's own is "0 active drivers")."""
    if impl == "triton":
        if not x.is_cuda and not interpreting():
            raise NormplugError(f"norm {norm!r}: --norm-impl triton runs Triton kernels on CUDA tensors, "
                                f"got a {x.device.type} tensor; use --norm-impl torch "
                                f"(or TRITON_INTERPRET=1, Triton's slow CPU interpreter)")
        return True
    return impl == "auto" and fits and norm in GPU_VERIFIED and x.is_cuda and triton_available()
