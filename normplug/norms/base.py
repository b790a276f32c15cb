"""What the rest of normplug may know about a norm that uses batch statistics."""
from typing import NamedTuple, Optional

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


class BatchStatNorm(nn.Module):
    """Base of norms whose training statistics span the batch (BN, PowerNorm).

    Subclasses set ``self._last`` to a :class:`Discrepancy` on every training
    forward (and to None in eval); ``discrepancy()`` hands it out once.
    """

    #: True where the RBN penalty is defined (gradient through batch statistics).
    supports_rbn = False

    @property
    def uses_batch_stats_in_eval(self) -> bool:
        """True if eval mode normalises with the test batch's own statistics,
        which a decoder cannot do one token at a time (incremental decoding)."""
        return False

    def __init__(self):
        super().__init__()
        self._last: Optional[Discrepancy] = None

    def discrepancy(self) -> Optional[Discrepancy]:
        """The terms of the last training forward, or None; clears them."""
        last, self._last = self._last, None
        return last
