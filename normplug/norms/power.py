"""PowerNorm as released with Shen et al. (sIncerass/powernorm, ``PowerFunction``)."""
import torch
import torch.nn as nn

from .base import BatchStatNorm, check_pad_mask, masked_sum, masked_sum_and_count, real_tokens
from .impl import MAX_GROUP_CHANNELS, check_impl, check_width, use_triton
from .per_token import upcast
from .registry import NormConfigError, check_choice, check_option, register_norm

GROUP_EPS = 1e-5  # ε of the group scaling, fixed in the release
GROUP_HELD = "a group of channels (dim / groups)"  # what the fused kernels hold in registers


class _ApproximateBackward(torch.autograd.Function):
    """ẑ = z·inv_fwd forward; PowerNorm's approximate backward (Shen et al., Algorithm 1):
    g̃ = g − (1 − α_b)·ν⊙ẑ, ν ← ν + mean(g̃⊙ẑ), ∂L/∂z = g̃ / sqrt(σ²_B + ε).
    Nothing flows through σ²_B or ψ². ν is updated here, when the gradient exists."""

    @staticmethod
    def forward(ctx, z, inv_fwd, inv_bwd, nu, n, alpha_bkw, sync):
        zhat = z * inv_fwd
        ctx.save_for_backward(zhat, inv_bwd, n)
        ctx.nu, ctx.alpha_bkw, ctx.sync = nu, alpha_bkw, sync
        return zhat

    @staticmethod
    def backward(ctx, g):
        zhat, inv_bwd, n = ctx.saved_tensors
        g_tilde = g - (1 - ctx.alpha_bkw) * ctx.nu * zhat
        # ẑ is 0 at padding, so this is the mean over real tokens
        ctx.nu.add_(masked_sum(g_tilde * zhat, ctx.sync) / n)
        return g_tilde * inv_bwd, None, None, None, None, None, None


@register_norm("power")
class PowerNorm(BatchStatNorm):
    """PowerNorm of Shen et al., "PowerNorm: Rethinking Batch Normalization in Transformers", ICML 2020.

    Group scaling, then division by the quadratic mean of the real tokens (σ²_B) during
    the first ``warmup_updates`` updates and by its running value ψ² afterwards and at
    inference; ψ² follows the released update rule. The warm-up counts updates:
    fairseq calls ``set_num_updates`` with the updates done before every training step.
    ``impl`` picks the plain torch code below or the fused Triton kernels of triton_power.py.
    """

    float32_buffers = ("running_psi2", "nu")

    def __init__(self, dim, *, eps=1e-5, groups=1, warmup_updates=8000, alpha_fwd=0.9,
                 alpha_bkw=0.9, affine=True, sync_stats=False, impl="auto"):
        super().__init__()
        check_option("power", "eps", eps, "a number > 0", lambda v: v > 0)
        check_option("power", "groups", groups, "a positive int", lambda v: isinstance(v, int) and v > 0)
        if dim % groups:
            raise NormConfigError(f"norm 'power': groups={groups} does not divide dim={dim} "
                                  f"(group scaling splits the channels into equal groups)")
        check_option("power", "warmup_updates", warmup_updates, "an int >= 0",
                     lambda v: isinstance(v, int) and v >= 0)
        for name, alpha in (("alpha_fwd", alpha_fwd), ("alpha_bkw", alpha_bkw)):
            check_option("power", name, alpha, "in [0, 1]", lambda v: 0 <= v <= 1)
        check_choice("power", "affine", affine, (True, False))
        check_choice("power", "sync_stats", sync_stats, (True, False))
        self.eps, self.groups, self.warmup_updates = float(eps), groups, warmup_updates
        self.alpha_fwd, self.alpha_bkw = float(alpha_fwd), float(alpha_bkw)
        self.affine, self.sync_stats = affine, sync_stats
        self.impl = check_impl("power", impl)
        check_width("power", self.impl, dim // groups, MAX_GROUP_CHANNELS, GROUP_HELD)
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if affine else None
        self.register_buffer("running_psi2", torch.ones(dim))  # ψ²
        self.register_buffer("nu", torch.zeros(dim))  # ν, the backward's running correction
        self.register_buffer("num_updates", torch.tensor(0, dtype=torch.long))

    def extra_repr(self):
        return (f"{self.nu.shape[0]}, eps={self.eps}, groups={self.groups}, "
                f"warmup_updates={self.warmup_updates}, alpha_fwd={self.alpha_fwd}, "
                f"alpha_bkw={self.alpha_bkw}, affine={self.affine}, sync_stats={self.sync_stats}, "
                f"impl={self.impl!r}")

    def set_num_updates(self, num_updates):
        self.num_updates.fill_(num_updates)

    def population_statistics(self):
        return None, self.running_psi2

    @torch.no_grad()
    def batch_statistics(self, x, pad_mask=None):
        real = real_tokens(x, pad_mask)
        z = self._group_scale(torch.where(real, upcast(x), 0))
        total, count = masked_sum_and_count(z.square(), real, sync=False)
        return None, total / count.clamp(min=1)

    def _group_scale(self, h):
        # each token's channel groups divided by their root mean square (no parameters)
        T, B, C = h.shape
        g = h.reshape(T, B, self.groups, C // self.groups)
        return (g * torch.rsqrt(g.square().mean(-1, keepdim=True) + GROUP_EPS)).reshape(T, B, C)

    def forward(self, x, pad_mask=None):
        if use_triton(self.impl, x, self.norm_name, fits=x.shape[-1] // self.groups <= MAX_GROUP_CHANNELS):
            return self._forward_fused(x, pad_mask)
        real = real_tokens(x, pad_mask)
        z = self._group_scale(torch.where(real, upcast(x), 0))  # 0 at padding
        if self.training:
            sync = self._sync()
            total, count = masked_sum_and_count(z.detach().square(), real, sync)  # one all-reduce
            n = count.clamp(min=1)
            sigma2 = total / n  # σ²_B: quadratic mean, no mean removed
            inv_bwd = torch.rsqrt(sigma2 + self.eps)
            step = self.num_updates + 1  # the release's training-step counter t
            warm = step <= self.warmup_updates
            inv_fwd = torch.where(warm, inv_bwd, torch.rsqrt(self.running_psi2 + self.eps))
            self._update_psi2(sigma2, step, count > 0)
            zhat = _ApproximateBackward.apply(z, inv_fwd, inv_bwd, self.nu, n, self.alpha_bkw, sync)
        else:
            zhat = z * torch.rsqrt(self.running_psi2 + self.eps)
        self._batch_stats = (None, sigma2) if self.training else None
        y = zhat * self.weight + self.bias if self.affine else zhat
        return torch.where(real, y, 0).to(x.dtype)

    def _forward_fused(self, x, pad_mask):
        from .triton_power import power_norm  # imports triton, which the torch path never needs
        check_pad_mask(x, pad_mask)
        y, sigma2 = power_norm(
            x, pad_mask, self.weight, self.bias, self.running_psi2, self.nu, self.num_updates,
            eps=self.eps, groups=self.groups, group_eps=GROUP_EPS,
            warmup_updates=self.warmup_updates, alpha_fwd=self.alpha_fwd,
            alpha_bkw=self.alpha_bkw, training=self.training, sync=self._sync())
        self._batch_stats = (None, sigma2) if self.training else None
        return y

    @torch.no_grad()
    def _update_psi2(self, sigma2, step, has_tokens):
        # released rule: while t < T_w a cumulative-mean step, then on every training
        # forward (no else) ψ² ← α_f ψ² + (1 − α_f) σ²_B; no update without real tokens
        psi2 = self.running_psi2
        sigma2 = sigma2.to(psi2.dtype)
        t = step.to(psi2.dtype)
        new = torch.where(step < self.warmup_updates, psi2 * (t - 1) / t + sigma2 / t, psi2)
        new = self.alpha_fwd * new + (1 - self.alpha_fwd) * sigma2
        # a new tensor, not copy_: torch.compile may recompute inv_fwd in the backward
        # from the buffer it was read from, and would then read the updated ψ²
        self.running_psi2 = torch.where(has_tokens, new, psi2)
