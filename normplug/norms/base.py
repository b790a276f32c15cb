"""What the rest of normplug may know about a norm that uses batch statistics."""
import weakref
from typing import NamedTuple, Optional, Tuple

import torch
import torch.nn as nn


class Discrepancy(NamedTuple):
    """Batch vs population statistics of one norm layer on its last training batch.

    ``rbn_mean`` and ``rbn_var`` are the Regularized-BN terms (SPEC §2) and keep
    their graph through the batch statistics; ``tid_mean`` and ``tid_var`` are
    the training–inference discrepancy figures, detached. All are 0-dim tensors
    on the layer's device, so reading them costs no host sync.
    """

    rbn_mean: torch.Tensor  # Σ_c (μ̂_c − μ_B,c)²
    rbn_var: torch.Tensor  # Σ_c |σ̂²_c − σ²_B,c|
    tid_mean: torch.Tensor  # mean_c |μ̂_c − μ_B,c| / σ_B,c
    tid_var: torch.Tensor  # mean_c |σ̂_c / σ_B,c − 1|


def measure_discrepancy(batch_mean: Optional[torch.Tensor], batch_var: torch.Tensor,
                        pop_mean: Optional[torch.Tensor], pop_var: torch.Tensor) -> Discrepancy:
    """Discrepancy of per-channel batch statistics against population ones (SPEC §2).

    A norm without a mean (PowerNorm) passes ``None`` for both means; its mean
    terms are then zero. Gradients flow through the batch statistics only.
    """
    pop_var = pop_var.detach()
    sigma_b = batch_var.detach().sqrt()
    if batch_mean is None:
        rbn_mean = tid_mean = batch_var.new_zeros(())
    else:
        gap = pop_mean.detach() - batch_mean
        rbn_mean = gap.pow(2).sum()
        tid_mean = (gap.detach().abs() / sigma_b).mean()
    return Discrepancy(
        rbn_mean=rbn_mean,
        rbn_var=(pop_var - batch_var).abs().sum(),
        tid_mean=tid_mean,
        tid_var=(pop_var.sqrt() / sigma_b - 1).abs().mean(),
    )


# id(pad_mask) -> (weak ref to it, its version, device, rows, padding-row mask).
# A Transformer hands the same mask object to every norm of a stream in one
# forward; finding the rows needs nonzero(), a host sync on a GPU, so it is done
# once per mask, not once per layer. (Tensors compare elementwise, so a
# WeakKeyDictionary cannot hold them.)
_ROWS: dict = {}


def _mask_rows(pad_mask: torch.Tensor, T: int, B: int, device):
    """The cache entry of ``pad_mask`` on ``device``, computed if missing or stale."""
    if pad_mask.shape != (B, T):
        raise ValueError(
            f"pad_mask must be B×T = {(B, T)} for x of shape T×B×C (True at padding), "
            f"got {tuple(pad_mask.shape)}"
        )
    device = torch.device(device)
    cached = _ROWS.get(id(pad_mask))
    if (cached is not None and cached[0]() is pad_mask and cached[1] == pad_mask._version
            and cached[2] == device):
        return cached
    N = T * B
    pad_rows = pad_mask.to(device=device, dtype=torch.bool).t().contiguous().view(N)
    idx = (~pad_rows).nonzero().squeeze(1)
    n = idx.numel()
    if n == N and N > 0:
        rows, pad_rows = (None, None, N), None
    else:
        rows = (idx, pad_rows.nonzero().squeeze(1), n)
    if len(_ROWS) > 32:  # masks of earlier forwards: gone or never asked again
        _ROWS.clear()
    entry = _ROWS[id(pad_mask)] = (weakref.ref(pad_mask), pad_mask._version, device, rows, pad_rows)
    return entry


def token_rows(pad_mask: Optional[torch.Tensor], T: int, B: int, device
               ) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor], int]:
    """Rows of the real and the padded tokens in x.reshape(T*B, C), and n real.

    Both index tensors are None when every token is real (``pad_mask`` None or
    all False). ``pad_mask`` is B×T, True at padding.
    """
    if pad_mask is None:
        return None, None, T * B
    return _mask_rows(pad_mask, T, B, device)[3]


def padding_rows(pad_mask: Optional[torch.Tensor], T: int, B: int, device) -> Optional[torch.Tensor]:
    """Row mask of x.reshape(T*B, C) for the CPU kernels: N bools, True at padding,
    contiguous; None when every token is real."""
    if pad_mask is None:
        return None
    return _mask_rows(pad_mask, T, B, device)[4]


class BatchStatNorm(nn.Module):
    """Base of norms whose training statistics span the batch (BN, PowerNorm).

    Subclasses set ``self._last`` to a :class:`Discrepancy` on every training
    forward (and to None in eval); ``discrepancy()`` hands it out once.
    """

    #: True where the RBN penalty is defined (gradient through batch statistics).
    supports_rbn = False

    #: Floating-point buffers that stay float32 when the module is cast to
    #: float16/bfloat16 (fairseq --fp16/--bf16): in low precision every EMA step of
    #: a running statistic is rounded, and a step below half an ulp is lost.
    float32_buffers: Tuple[str, ...] = ()

    @property
    def uses_batch_stats_in_eval(self) -> bool:
        """True if eval mode normalises with the test batch's own statistics,
        which a decoder cannot do one token at a time (incremental decoding)."""
        return False

    def __init__(self):
        super().__init__()
        self._last: Optional[Discrepancy] = None

    #: Reduce batch statistics over distributed workers (subclasses set it from an option).
    sync_stats = False

    def _distributed(self) -> bool:
        """True when this training forward must sum its statistics over workers."""
        dist = torch.distributed
        return (
            self.sync_stats
            and self.training
            and dist.is_available()
            and dist.is_initialized()
            and dist.get_world_size() > 1
        )

    def batch_statistics(self, x: torch.Tensor, pad_mask: Optional[torch.Tensor] = None
                         ) -> Tuple[Optional[torch.Tensor], torch.Tensor]:
        """Per-channel (mean, variance) of the real tokens of ``x`` as this norm
        computes them in training (mean is None for norms without one).
        Used by the TID analysis tool on held-out data; does not change state."""
        raise NotImplementedError

    def population_statistics(self) -> Tuple[Optional[torch.Tensor], torch.Tensor]:
        """The (mean, variance) this norm uses at inference (mean None if it has none)."""
        raise NotImplementedError

    def _apply(self, fn, *args, **kwargs):
        # Keep the float32 buffers exact through a cast to half precision: restore
        # the pre-cast value (moved to the new device) instead of rounding it.
        before = {name: getattr(self, name) for name in self.float32_buffers}
        super()._apply(fn, *args, **kwargs)
        for name, old in before.items():
            new = getattr(self, name)
            if new.dtype in (torch.float16, torch.bfloat16) and old.dtype == torch.float32:
                setattr(self, name, old.to(device=new.device))
        return self

    def discrepancy(self) -> Optional[Discrepancy]:
        """The terms of the last training forward, or None; clears them."""
        last, self._last = self._last, None
        return last
