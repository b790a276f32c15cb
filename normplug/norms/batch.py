"""Masked BatchNorm: per-channel statistics over the real tokens of a T×B×C batch."""
import torch
import torch.nn as nn

from .base import BatchStatNorm, check_pad_mask, masked_sum, masked_sum_and_count, real_tokens
from .impl import check_impl, use_triton
from .per_token import upcast
from .registry import check_choice, check_option, register_norm


@register_norm("batch")
class MaskedBatchNorm(BatchStatNorm):
    """Masked BatchNorm (Ioffe & Szegedy 2015) as used for NMT by Wang, Wu & Huang, "Understanding the Failure of Batch Normalization for Transformers in NLP", NeurIPS 2022.

    Training normalises with the biased mean and variance of the real tokens and
    updates the running statistics by EMA with ``momentum``; eval normalises with the
    running statistics, or with the test batch's own (``test_stats="batch"``, the
    paper's ablation). ``sync_stats`` sums the statistics over distributed workers.
    Padded positions output 0 and never enter a statistic. ``impl`` picks the plain torch
    code below or the fused Triton kernels of triton_batch.py (see impl.py).
    """

    supports_rbn = True
    float32_buffers = ("running_mean", "running_var")

    def __init__(self, dim, *, eps=1e-5, momentum=0.05, affine=True, test_stats="population",
                 sync_stats=False, impl="auto"):
        super().__init__()
        check_option("batch", "eps", eps, "a number > 0", lambda v: v > 0)
        check_option("batch", "momentum", momentum, "in the range (0, 1]", lambda v: 0 < v <= 1)
        check_choice("batch", "test_stats", test_stats, ("population", "batch"))
        check_choice("batch", "affine", affine, (True, False))
        check_choice("batch", "sync_stats", sync_stats, (True, False))
        self.eps, self.momentum = float(eps), float(momentum)
        self.affine, self.test_stats, self.sync_stats = affine, test_stats, sync_stats
        self.impl = check_impl("batch", impl)
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if affine else None
        self.register_buffer("running_mean", torch.zeros(dim))
        self.register_buffer("running_var", torch.ones(dim))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def extra_repr(self):
        return (f"{self.running_mean.shape[0]}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, test_stats={self.test_stats!r}, sync_stats={self.sync_stats}, "
                f"impl={self.impl!r}")

    @property
    def uses_batch_stats_in_eval(self):
        return self.test_stats == "batch"

    def population_statistics(self):
        return self.running_mean, self.running_var

    @torch.no_grad()
    def batch_statistics(self, x, pad_mask=None):
        real = real_tokens(x, pad_mask)
        return self._moments(torch.where(real, upcast(x), 0), real, sync=False)[:2]

    @staticmethod
    def _moments(h, real, sync):
        """Biased mean and variance over the real tokens of ``h`` (0 at padding), and their count."""
        # Σx and n in one all-reduce; the variance's second pass needs the mean of every worker
        total, count = masked_sum_and_count(h, real, sync)
        n = count.clamp(min=1)
        mean = total / n
        var = masked_sum(torch.where(real, h - mean, 0).square(), sync) / n
        return mean, var, count

    def forward(self, x, pad_mask=None):
        if use_triton(self.impl, x, self.norm_name):
            return self._forward_fused(x, pad_mask)
        real = real_tokens(x, pad_mask)
        h = torch.where(real, upcast(x), 0)  # whatever padding holds never reaches a statistic
        if self.training or self.test_stats == "batch":
            mean, var, count = self._moments(h, real, self._sync())
        else:
            mean, var = self.running_mean, self.running_var
        if self.training:
            self._update_running(mean.detach(), var.detach(), count)
        self._batch_stats = (mean, var) if self.training else None
        y = (h - mean) * torch.rsqrt(var + self.eps)
        if self.affine:
            y = y * self.weight + self.bias
        return torch.where(real, y, 0).to(x.dtype)

    def _forward_fused(self, x, pad_mask):
        from .triton_batch import batch_norm  # imports triton, which the torch path never needs
        check_pad_mask(x, pad_mask)
        y, mean, var = batch_norm(
            x, pad_mask, self.weight, self.bias, self.running_mean, self.running_var,
            self.num_batches_tracked, eps=self.eps, momentum=self.momentum,
            batch_stats=self.training or self.test_stats == "batch",
            update_running=self.training, sync=self._sync())
        self._batch_stats = (mean, var) if self.training else None
        return y

    @torch.no_grad()
    def _update_running(self, mean, var, count):
        # μ̂ ← (1 − ρ)μ̂ + ρ μ_B and σ̂² ← (1 − ρ)σ̂² + ρ σ²_B; ρ = 0 for a batch without real tokens
        rho = self.momentum * (count > 0).to(self.running_mean.dtype)
        self.running_mean.lerp_(mean.to(self.running_mean.dtype), rho)
        self.running_var.lerp_(var.to(self.running_var.dtype), rho)
        self.num_batches_tracked.add_((count > 0).long())
