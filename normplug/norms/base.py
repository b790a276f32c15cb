"""What BN and PowerNorm share: masked batch statistics, the discrepancy they report, fp16 buffers.

Masked statistics use the padding mask as weights (sums over real tokens divided by
their count), so a forward has no host synchronisation and no data-dependent shape.
"""
from typing import NamedTuple, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.nn.functional import all_reduce


class Discrepancy(NamedTuple):
    """Batch vs population statistics of one layer on its last training batch.

    ``rbn_mean``/``rbn_var`` are the two terms of the Regularized-BN penalty (Wang, Wu &
    Huang 2022), with their graph through the batch statistics; ``tid_mean``/``tid_var``
    are the training–inference discrepancy, detached. All are 0-dim tensors on the device.
    """

    rbn_mean: torch.Tensor  # Σ_c (μ̂_c − μ_B,c)²
    rbn_var: torch.Tensor  # Σ_c |σ̂²_c − σ²_B,c|
    tid_mean: torch.Tensor  # mean_c |μ̂_c − μ_B,c| / σ_B,c
    tid_var: torch.Tensor  # mean_c |σ̂_c / σ_B,c − 1|


def measure_discrepancy(batch_mean: Optional[torch.Tensor], batch_var: torch.Tensor,
                        pop_mean: Optional[torch.Tensor], pop_var: torch.Tensor) -> Discrepancy:
    """Discrepancy of batch statistics against population ones; population statistics
    are constants. A norm without a mean (PowerNorm) passes None for both means."""
    pop_var = pop_var.detach()
    sigma_b = batch_var.detach().sqrt()
    if batch_mean is None:
        rbn_mean = tid_mean = batch_var.new_zeros(())
    else:
        gap = pop_mean.detach() - batch_mean
        rbn_mean = gap.square().sum()
        tid_mean = (gap.detach().abs() / sigma_b).mean()
    return Discrepancy(rbn_mean, (pop_var - batch_var).abs().sum(), tid_mean,
                       (pop_var.sqrt() / sigma_b - 1).abs().mean())


def real_tokens(x: torch.Tensor, pad_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """T×B×1 bool, True at real tokens, for x of shape T×B×C and a B×T ``pad_mask``."""
    T, B, _ = x.shape
    if pad_mask is None:
        return torch.ones(T, B, 1, dtype=torch.bool, device=x.device)
    check_pad_mask(x, pad_mask)
    return ~pad_mask.t().unsqueeze(-1).to(torch.bool).contiguous()


def check_pad_mask(x: torch.Tensor, pad_mask: Optional[torch.Tensor]) -> None:
    """A ValueError unless ``pad_mask`` is None or B×T for x of shape T×B×C."""
    T, B, _ = x.shape
    if pad_mask is not None and pad_mask.shape != (B, T):
        raise ValueError(f"pad_mask must be B×T = {(B, T)} for x of shape T×B×C "
                         f"(True at padding), got {tuple(pad_mask.shape)}")


def masked_sum(t: torch.Tensor, sync: bool) -> torch.Tensor:
    """Σ over tokens (dims 0, 1) of ``t``, also over distributed workers when ``sync``."""
    total = t.sum((0, 1))
    return all_reduce(total) if sync else total


def masked_sum_and_count(t: torch.Tensor, real: torch.Tensor, sync: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """(Σ over tokens of ``t``, the number of real tokens as a 0-dim tensor of t's dtype), over every
    worker when ``sync``: one all-reduce for both, the count riding as one more channel. ``t`` must
    be 0 at padding; ``real`` is :func:`real_tokens`'s mask."""
    sums = torch.cat([t.sum((0, 1)), real.to(t.dtype).sum((0, 1))])
    if sync:
        sums = all_reduce(sums)
    return sums[:-1], sums[-1]


class BatchStatNorm(nn.Module):
    """Base of norms whose training statistics span the batch (BN, PowerNorm).

    A training forward leaves its batch statistics in ``self._batch_stats``;
    :meth:`discrepancy` turns them into a :class:`Discrepancy` once and clears them.
    """

    #: True where the RBN penalty applies (gradient through batch statistics).
    supports_rbn = False
    #: Buffers kept in float32 when the model is cast to fp16/bf16: an EMA step below
    #: half an ulp of a half-precision statistic would be lost.
    float32_buffers: Tuple[str, ...] = ()
    #: Sum statistics over distributed workers (subclasses set it from an option).
    sync_stats = False

    def __init__(self):
        super().__init__()
        self._batch_stats = None

    @property
    def uses_batch_stats_in_eval(self) -> bool:
        """True if eval normalises with the test batch's statistics, which a decoder
        cannot do one token at a time (incremental decoding)."""
        return False

    def _sync(self) -> bool:
        """True when this training forward sums its statistics over workers."""
        return (self.sync_stats and self.training and dist.is_available()
                and dist.is_initialized() and dist.get_world_size() > 1)

    def batch_statistics(self, x, pad_mask=None) -> Tuple[Optional[torch.Tensor], torch.Tensor]:
        """(mean or None, variance) of the real tokens of ``x`` as a training forward
        computes them; changes nothing. Used by the TID tool on held-out data."""
        raise NotImplementedError

    def population_statistics(self) -> Tuple[Optional[torch.Tensor], torch.Tensor]:
        """The (mean or None, variance) used at inference."""
        raise NotImplementedError

    def discrepancy(self) -> Optional[Discrepancy]:
        """The discrepancy of the last training forward against the population
        statistics after its update, or None; clears it."""
        stats, self._batch_stats = self._batch_stats, None
        if stats is None:
            return None
        return measure_discrepancy(*stats, *self.population_statistics())

    def __getstate__(self):
        # the saved statistics carry an autograd graph: copies and pickles drop them
        state = dict(super().__getstate__())
        state["_batch_stats"] = None
        return state

    def _apply(self, fn, *args, **kwargs):
        # keep the float32 buffers exact through a cast to half precision
        before = {name: getattr(self, name) for name in self.float32_buffers}
        super()._apply(fn, *args, **kwargs)
        for name, old in before.items():
            new = getattr(self, name)
            if new.dtype in (torch.float16, torch.bfloat16) and old.dtype == torch.float32:
                setattr(self, name, old.to(device=new.device))
        return self
