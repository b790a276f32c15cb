"""PowerNorm (Shen et al., "PowerNorm: Rethinking Batch Normalization in Transformers", ICML 2020).

SPEC §2 ``power``, as released. With ``z`` the group-scaled input (step 1) and
statistics over the real (non-padding) tokens of the batch only:

1. group scaling: each token's ``groups`` channel groups are divided by
   ``sqrt(mean of squares + 1e-5)`` (no parameters; its exact gradient is
   propagated, written out in the backward for speed);
2. σ²_B = Σ_real z² / n, the quadratic mean (no mean subtracted);
3. training, warm-up (``num_updates < warmup_updates``): ẑ = z / sqrt(σ²_B + ε);
   training, after warm-up: ẑ = z / sqrt(ψ² + ε) with ψ² *before* this step's
   update; eval: ẑ = z / sqrt(ψ² + ε). Output γ ⊙ ẑ + β;
4. ψ² (init 1): during warm-up the plain mean of the σ²_B of every training
   forward made in warm-up (``warmup_steps`` counts them; the initial 1 is not
   part of the mean), afterwards ψ² ← α_f ψ² + (1 − α_f) σ²_B per training
   forward;
5. custom backward with the running correction ν (init 0):
   g = γ ⊙ ∂L/∂y, g̃ = g − (1 − α_b) ν ⊙ ẑ, ν ← ν + mean_real(g̃ ⊙ ẑ),
   ∂L/∂z = g̃ / sqrt(σ²_B + ε); nothing flows through σ²_B or ψ²;
6. warm-up is counted in optimizer updates through :meth:`set_num_updates`.

``sync_stats`` (``--bn-sync-stats``; off by default, the released code has no
sync): in distributed training, Σ z² and n are summed over workers in the
forward and Σ ∂L/∂y ⊙ ẑ in the backward, so every worker uses the union σ²_B and
keeps identical ψ², ν and warm-up counter, as one process on the union batch
would. A worker without a real token still takes part in both sums.

Speed: on a CPU the training forward and backward are one fused kernel call
each (csrc/kernels.cpp, :class:`_PowerKernelFunction`). The backward needs no
reduction before it writes (ν is the previous step's), so it is one pass; the
forward is one pass past warm-up (it normalises with ψ² of earlier steps) and
two in warm-up (σ²_B first). Elsewhere the torch-op :class:`_PowerFunction` on
the gathered real rows.

Padding: only real tokens are normalised; padded positions of the output are
0 and receive no gradient, so whatever they held (huge values, NaN) never reaches
a statistic, a buffer, a real output or a real gradient.
"""
import math

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.autograd.function import once_differentiable

from . import cpu_kernels
from .base import BatchStatNorm, Discrepancy, measure_discrepancy, padding_rows, token_rows
from .registry import NormConfigError, register_norm

#: ε of the group scaling (step 1); fixed by the SPEC, independent of ``eps``.
GROUP_EPS = 1e-5


def group_rsqrt(xg: torch.Tensor) -> torch.Tensor:
    """1/sqrt(mean of squares + 1e-5) of each group of an n×G×D tensor, n×G×1.

    In-place on its own temporaries: for use without autograd (see group_scale).
    """
    ms = torch.linalg.vector_norm(xg, dim=-1, keepdim=True).square_().div_(xg.shape[-1])
    return ms.add_(GROUP_EPS).rsqrt_()


def group_scale(x: torch.Tensor, groups: int) -> torch.Tensor:
    """Step 1 on an n×C tensor, with ordinary autograd (eval path)."""
    n, c = x.shape
    xg = x.reshape(n, groups, c // groups)
    ms = torch.linalg.vector_norm(xg, dim=-1, keepdim=True).square() / (c // groups)
    return (xg * torch.rsqrt(ms + GROUP_EPS)).view(n, c)


def _colsum(m: torch.Tensor) -> torch.Tensor:
    """Σ over rows of an n×C matrix (a BLAS matrix–vector product: one pass)."""
    return torch.mv(m.t(), m.new_ones(m.shape[0]))


def _all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Σ over workers of ``t``, computed in float64 (a new tensor)."""
    out = t.to(torch.float64, copy=True)
    dist.all_reduce(out)
    return out


class _PowerFunction(torch.autograd.Function):
    """Steps 1–5 on the real tokens x (n×C, n ≥ 1; n ≥ 0 with ``sync``) of a training forward.

    The group scaling z = x ⊙ r (r = 1/RMS of the token's group) gets its exact
    gradient, written out here rather than left to autograd only because the
    composite autograd graph costs several extra passes over the tensor:
    ∂L/∂x = r ⊙ (∂L/∂z − z ⊙ mean_group(∂L/∂z ⊙ z)).

    The PowerNorm part gets the SPEC's approximate backward. ``inv_fwd`` is
    1/sqrt(σ²_B + ε) in warm-up and 1/sqrt(ψ² + ε) afterwards; the gradient is
    always divided by sqrt(σ²_B + ε) — the released code does so even after
    warm-up, when the forward pass used ψ², and the SPEC keeps that. ν is read
    and updated in place at backward time (the value the previous backward left).
    """

    @staticmethod
    def forward(ctx, x, weight, bias, norm, sync=False):
        n, c = x.shape
        groups = norm.groups
        xg = x.view(n, groups, c // groups)
        r = group_rsqrt(xg)
        z = torch.mul(xg, r).view(n, c)
        y = torch.mul(z, z)  # z², then reused for the output
        has_tokens = None
        if sync:  # union statistics: Σ z² and n summed over workers
            total = _all_reduce_sum(torch.cat([_colsum(y), y.new_full((1,), float(n))]))
            count = total[c]
            has_tokens = count > 0
            n = count.clamp(min=1.0).to(x.dtype)
            sigma2 = (total[:c] / count.clamp(min=1.0)).to(x.dtype)
        else:
            sigma2 = _colsum(y).div_(n)
        inv_fwd, inv_bwd = norm._update_running(sigma2, has_tokens)
        scale = inv_fwd if weight is None else weight * inv_fwd
        if bias is None:
            torch.mul(z, scale, out=y)
        else:
            torch.addcmul(bias, z, scale, out=y)
        ctx.save_for_backward(z, r, weight, inv_fwd, inv_bwd, sigma2)
        ctx.nu = norm.nu
        ctx.alpha_bkw = norm.alpha_bkw
        ctx.groups = groups
        ctx.has_bias = bias is not None
        ctx.sync = sync
        ctx.n = n  # number of real tokens behind σ²_B (all workers' with sync)
        ctx.has_tokens = has_tokens
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, gy):
        z, r, weight, inv_fwd, inv_bwd, sigma2 = ctx.saved_tensors
        rows, c = z.shape
        n = ctx.n  # tokens behind σ²_B: this worker's, or every worker's with sync
        groups = ctx.groups
        k = 1.0 - ctx.alpha_bkw
        nu = ctx.nu.to(z.dtype)
        gamma = torch.ones_like(inv_fwd) if weight is None else weight
        gy = gy.contiguous()

        buf = gy * z
        # Σ_real gy ⊙ ẑ: ∂L/∂γ, and (times γ) the first part of Σ g̃ ⊙ ẑ.
        gy_zhat = _colsum(buf).mul_(inv_fwd)
        # with sync, ν follows the union batch: Σ gy⊙ẑ over every worker's tokens
        gy_zhat_all = _all_reduce_sum(gy_zhat).to(z.dtype) if ctx.sync else gy_zhat
        # ν update of SPEC step 5 with g̃ = γ⊙gy − (1−α_b) ν⊙ẑ, expanded so it needs
        # no pass of its own: Σ g̃⊙ẑ = γ⊙Σ gy⊙ẑ − (1−α_b) ν⊙Σ ẑ², Σ ẑ² = n σ²_B inv_fwd².
        nu_step = gamma * gy_zhat_all / n - k * nu * sigma2 * inv_fwd.square()
        if ctx.has_tokens is not None:  # no real token on any worker: ν unchanged
            nu_step = torch.where(ctx.has_tokens, nu_step, torch.zeros_like(nu_step))
        # ∂L/∂z = g̃ / sqrt(σ²_B + ε) = gy⊙(γ inv_bwd) − z⊙((1−α_b) ν inv_fwd inv_bwd)
        dz = gy * (gamma * inv_bwd)
        dz.addcmul_(z, k * nu * inv_fwd * inv_bwd, value=-1.0)
        # Through the group scaling (exact): ∂L/∂x = r ⊙ (∂L/∂z − z ⊙ mean_g(∂L/∂z ⊙ z)).
        torch.mul(dz, z, out=buf)
        d = c // groups
        q = buf.view(rows, groups, d).sum(-1, keepdim=True).div_(d)
        dxg = dz.view(rows, groups, d)
        dxg.addcmul_(z.view(rows, groups, d), q, value=-1.0).mul_(r)
        ctx.nu.add_(nu_step.to(ctx.nu.dtype))

        grad_w = gy_zhat if weight is not None and ctx.needs_input_grad[1] else None
        grad_b = _colsum(gy) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dz, grad_w, grad_b, None, None


class _PowerKernelFunction(torch.autograd.Function):
    """Steps 1–5 of a training forward through the fused CPU kernels (no sync).

    Same maths as :class:`_PowerFunction` (and :meth:`PowerNorm._update_running`),
    one call each way (``pn_train_fwd`` / ``pn_bwd`` in csrc/kernels.cpp), on the
    whole N×C input with its row mask ``pad`` (True at padding; None if every row
    is real; n ≥ 1 real rows) instead of gathered real rows. Forward: one pass
    for the group scales r and Σ z², the ψ² update, one pass for
    y = z ⊙ (γ·inv_fwd) + β (0 at padding). Backward: one pass for Σ gy ⊙ z and
    Σ gy, the ν update, one pass for ∂L/∂x = r ⊙ (∂L/∂z − z ⊙ mean_group(∂L/∂z ⊙ z))
    with ∂L/∂z = gy ⊙ (γ·inv_bwd) − z ⊙ ((1 − α_b)·ν·inv_fwd·inv_bwd) (0 at padding).
    """

    @staticmethod
    def forward(ctx, x, pad, n, weight, bias, norm):
        rows, c = x.shape
        dt, groups = x.dtype, norm.groups
        warm = int(norm.num_updates) < norm.warmup_updates  # (CPU: reading it costs nothing)
        k = int(norm.warmup_steps) + int(warm)
        psi2 = norm.running_psi2
        psi2 = psi2 if psi2.dtype == dt else psi2.to(dt)
        rg = x.new_empty(rows, groups)
        aux = x.new_empty(4, c)  # σ²_B, inv_fwd, inv_bwd, ψ² after the update
        disc = x.new_empty(2)  # Σ|ψ² − σ²_B|, mean |ψ/σ_B − 1|
        y = torch.empty_like(x)
        cpu_kernels.call("pn_train_fwd", dt, x, pad, rows, c, groups, n, weight, bias, norm.eps, int(warm), k,
                         norm.alpha_fwd, psi2, rg, aux, disc, y)
        if psi2 is not norm.running_psi2:
            norm.running_psi2.copy_(psi2)
        if warm:
            norm.warmup_steps.fill_(k)
        norm.__dict__["_pending"] = lambda: Discrepancy(
            rbn_mean=disc.new_zeros(()), rbn_var=disc[0], tid_mean=disc.new_zeros(()), tid_var=disc[1])
        ctx.save_for_backward(x, pad, rg, weight, aux)
        ctx.norm, ctx.n, ctx.has_bias = norm, n, bias is not None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, gy):
        x, pad, rg, weight, aux = ctx.saved_tensors
        rows, c = x.shape
        dt, norm = x.dtype, ctx.norm
        gy = gy.to(dt).contiguous()
        nu = norm.nu if norm.nu.dtype == dt else norm.nu.to(dt)
        dx = torch.empty_like(x)
        grad_w = x.new_empty(c) if weight is not None and ctx.needs_input_grad[3] else None
        grad_b = x.new_empty(c) if ctx.has_bias and ctx.needs_input_grad[4] else None
        cpu_kernels.call("pn_bwd", dt, gy, x, pad, rg, rows, c, norm.groups, ctx.n, weight, aux,
                         norm.alpha_bkw, nu, dx, grad_w, grad_b)
        if nu is not norm.nu:
            norm.nu.copy_(nu)
        return dx, None, None, grad_w, grad_b, None


@register_norm("power")
class PowerNorm(BatchStatNorm):
    """PowerNorm (Shen et al., ICML 2020) as released: SPEC §2 ``power``."""

    supports_rbn = False
    # ψ² and ν stay float32 when the model is cast to fp16/bf16 (fairseq --fp16 /
    # --bf16): they are statistics, computed in float32 anyway (BatchStatNorm._apply).
    float32_buffers = ("running_psi2", "nu")

    def __init__(
        self,
        dim,
        *,
        eps=1e-5,
        groups=1,
        warmup_updates=8000,
        alpha_fwd=0.9,
        alpha_bkw=0.9,
        affine=True,
        sync_stats=False,
    ):
        super().__init__()
        if not isinstance(dim, int) or isinstance(dim, bool) or dim <= 0:
            raise NormConfigError(f"norm 'power': dim must be a positive int, got {dim!r}")
        if not isinstance(groups, int) or isinstance(groups, bool) or groups <= 0:
            raise NormConfigError(f"norm 'power': groups must be a positive int, got {groups!r}")
        if dim % groups != 0:
            raise NormConfigError(
                f"norm 'power': groups={groups} does not divide dim={dim} "
                f"(group scaling splits the {dim} channels into {groups} equal groups)"
            )
        if not isinstance(warmup_updates, int) or isinstance(warmup_updates, bool) or warmup_updates < 0:
            raise NormConfigError(
                f"norm 'power': warmup_updates must be an int >= 0, got {warmup_updates!r}"
            )
        for name, a in (("alpha_fwd", alpha_fwd), ("alpha_bkw", alpha_bkw)):
            if not isinstance(a, (int, float)) or not 0.0 <= a <= 1.0:
                raise NormConfigError(f"norm 'power': {name} must be in [0, 1], got {a!r}")
        if not isinstance(eps, (int, float)) or not eps > 0 or not math.isfinite(eps):
            raise NormConfigError(f"norm 'power': eps must be a positive number, got {eps!r}")
        if not isinstance(sync_stats, bool):
            raise NormConfigError(f"norm 'power': sync_stats must be True or False, got {sync_stats!r}")

        self.dim = dim
        self.eps = float(eps)
        self.groups = groups
        self.warmup_updates = warmup_updates
        self.alpha_fwd = float(alpha_fwd)
        self.alpha_bkw = float(alpha_bkw)
        self.affine = bool(affine)
        self.sync_stats = sync_stats
        if self.affine:
            self.weight = nn.Parameter(torch.ones(dim))
            self.bias = nn.Parameter(torch.zeros(dim))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        # ψ² (SPEC step 4) and ν (step 5), per channel.
        self.register_buffer("running_psi2", torch.ones(dim))
        self.register_buffer("nu", torch.zeros(dim))
        # Optimizer updates done so far (set by fairseq through set_num_updates).
        self.register_buffer("num_updates", torch.zeros((), dtype=torch.long))
        # Training forwards (with ≥ 1 real token) averaged into ψ² during warm-up.
        self.register_buffer("warmup_steps", torch.zeros((), dtype=torch.long))
        self._pending = None

    def __getstate__(self):
        # the pending discrepancy is a closure over the last forward's tensors
        state = dict(super().__getstate__())
        state["_pending"] = None
        return state

    # --- fairseq hooks -------------------------------------------------------

    def set_num_updates(self, num_updates):
        """Called by fairseq after every update and after loading a checkpoint."""
        self.num_updates.fill_(int(num_updates))

    # --- lazy discrepancy ----------------------------------------------------

    @property
    def _last(self):
        # Built from (ψ² after this step's update, σ²_B) of the last training
        # forward the first time someone asks, so steps nobody logs cost
        # nothing. σ = sqrt(variance) without ε, as in the SPEC's TID. PowerNorm
        # subtracts no mean, so both mean terms are 0 and there is no RBN
        # gradient (supports_rbn is False; rbn_var is detached).
        if self._last_value is None and self._pending is not None:
            pending = self._pending
            self.__dict__["_pending"] = None
            self.__dict__["_last_value"] = pending()
        return self._last_value

    @_last.setter
    def _last(self, value):
        # (plain attributes, set past nn.Module.__setattr__: this runs every forward)
        self.__dict__["_pending"] = None
        self.__dict__["_last_value"] = value

    @torch.no_grad()
    def batch_statistics(self, x, pad_mask=None):
        """(None, σ²_B): quadratic mean of the group-scaled real tokens; no state change."""
        T, B, C = x.shape
        flat = x.reshape(T * B, C)
        if pad_mask is not None:
            flat = flat[~pad_mask.t().reshape(-1).to(torch.bool)]
        z = group_scale(flat.to(torch.float64 if x.dtype == torch.float64 else torch.float32), self.groups)
        return None, z.square().mean(0)

    def population_statistics(self):
        return None, self.running_psi2

    # --- forward -------------------------------------------------------------

    def reset_parameters(self):
        if self.affine:
            nn.init.ones_(self.weight)
            nn.init.zeros_(self.bias)

    def reset_running_stats(self):
        self.running_psi2.fill_(1.0)
        self.nu.zero_()
        self.warmup_steps.zero_()

    def extra_repr(self):
        return (
            f"{self.dim}, eps={self.eps}, groups={self.groups}, "
            f"warmup_updates={self.warmup_updates}, alpha_fwd={self.alpha_fwd}, "
            f"alpha_bkw={self.alpha_bkw}, affine={self.affine}, sync_stats={self.sync_stats}"
        )

    def forward(self, x, pad_mask=None):
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(
                f"PowerNorm({self.dim}) expects x of shape T×B×{self.dim}, got {tuple(x.shape)}"
            )
        T, B, C = x.shape
        flat = x.reshape(T * B, C)
        # Row t*B + b of `flat` is token (t, b).
        idx, _, n = token_rows(pad_mask, T, B, x.device)
        cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
        weight = None if self.weight is None else self.weight.to(cdt)
        bias = None if self.bias is None else self.bias.to(cdt)

        self._last = None
        sync = self._distributed()
        if n > 0 and not sync and cpu_kernels.usable(x):
            needs_graph = torch.is_grad_enabled() and (
                x.requires_grad or (weight is not None and weight.requires_grad))
            if self.training or not needs_graph:
                return self._forward_kernels(flat.to(cdt).contiguous(), padding_rows(pad_mask, T, B, x.device),
                                             n, weight, bias).to(x.dtype).view(T, B, C)

        # Otherwise (GPU, sync_stats, no real token, eval with a graph): on the real rows only.
        xr = flat if idx is None else flat.index_select(0, idx)
        xr = xr.to(cdt).contiguous()
        if self.training and (n > 0 or sync):
            y = _PowerFunction.apply(xr, weight, bias, self, sync)
        else:
            # Eval (or no real token: nothing to learn from, no update).
            inv = torch.rsqrt(self.running_psi2.to(cdt) + self.eps)
            scale = inv if weight is None else weight * inv
            z = group_scale(xr, self.groups)
            y = z * scale if bias is None else torch.addcmul(bias, z, scale)

        y = y.to(x.dtype)
        if idx is not None:
            y = y.new_zeros(T * B, C).index_copy(0, idx, y)
        return y.view(T, B, C)

    def _forward_kernels(self, xf, pad, n, weight, bias):
        """Training or graph-free eval forward through the fused CPU kernels (N×C rows)."""
        if self.training:
            return _PowerKernelFunction.apply(xf, pad, n, weight, bias, self)
        rows, c = xf.shape
        rg = xf.new_empty(rows, self.groups)
        y = torch.empty_like(xf)
        cpu_kernels.call("pn_eval_fwd", xf.dtype, xf, pad, rows, c, self.groups, weight, bias, self.eps,
                         self.running_psi2.to(xf.dtype).contiguous(), rg, y)
        return y

    @torch.no_grad()
    def _update_running(self, sigma2, has_tokens=None):
        """Steps 3–4 for one training forward with batch statistic ``sigma2``.

        ``has_tokens`` (a bool tensor, sync only) False: no worker had a real
        token, so ψ² and the warm-up counter stay as they are.

        Returns (1/sqrt of the forward's statistic + ε, 1/sqrt(σ²_B + ε)) and
        updates ψ² and the warm-up counter. Warm-up is decided on the device
        from the ``num_updates`` buffer, so nothing waits for the host.
        """
        cdt = sigma2.dtype
        inv_bwd = torch.rsqrt(sigma2 + self.eps)
        psi2 = self.running_psi2.to(cdt)
        warm = self.num_updates < self.warmup_updates
        inv_fwd = torch.where(warm, inv_bwd, torch.rsqrt(psi2 + self.eps))
        # ψ²: mean of the σ²_B of the k warm-up forwards so far, then an EMA.
        k = self.warmup_steps + warm.long()
        cum = psi2 + (sigma2 - psi2) / k.clamp(min=1).to(cdt)
        ema = psi2 * self.alpha_fwd + sigma2 * (1.0 - self.alpha_fwd)
        new_psi2 = torch.where(warm, cum, ema)
        if has_tokens is not None:
            new_psi2 = torch.where(has_tokens, new_psi2, psi2)
            k = torch.where(has_tokens, k, self.warmup_steps)
        self.running_psi2.copy_(new_psi2)
        self.warmup_steps.copy_(k)
        self.__dict__["_pending"] = lambda: measure_discrepancy(None, sigma2, None, new_psi2)
        return inv_fwd, inv_bwd
