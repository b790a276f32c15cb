"""How many programs a fused norm's reduction spreads over: a few per multiprocessor of the GPU.

Imports torch only. Under Triton's CPU interpreter the kernels plan for a nominal H100, so the
CPU tests run the same split-and-merge code that a GPU runs.
"""
import functools

import torch

NOMINAL_MULTIPROCESSORS = 132  # an H100 SXM's streaming multiprocessors


@functools.lru_cache(maxsize=None)
def _cuda_multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def multiprocessor_count(device: torch.device) -> int:
    """The multiprocessors of a CUDA ``device``; NOMINAL_MULTIPROCESSORS for any other device."""
    if device.type == "cuda":
        return _cuda_multiprocessors(device.index if device.index is not None else torch.cuda.current_device())
    return NOMINAL_MULTIPROCESSORS
