"""Masked BatchNorm for T×B×C activations: statistics over real tokens only (SPEC §2).

Layout. ``x`` is T×B×C and is handled as the N×C matrix ``x.reshape(T*B, C)``;
row ``t*B + b`` is token (t, b). ``pad_mask`` is B×T, True at padding.

How padding is kept out. The real rows are gathered with ``index_select`` into a
compact n×C matrix and every statistic (forward) and every gradient reduction
(backward) is taken over that matrix only, so whatever sits in padded positions
(huge values, inf, NaN) never reaches a statistic or a real token's output or
gradient. Padded positions of the output, and of the gradient w.r.t. ``x``, are
set to exactly 0 (they are computed with the normalisation affine map and then
overwritten, never multiplied by a mask).

Speed. On a CPU a training forward is one call of the fused kernel
``bn_train_fwd`` (csrc/kernels.cpp): one pass over the real rows for the
moments (shifted sums, accumulated in double), then the running-statistics
update and the TID figures on the per-channel numbers, and one pass writing
``scale ⊙ x + shift`` (zeros at padding); the backward is one pass for Σg and
Σg(x − μ) over the real rows and one writing the input gradient. Padding rows
are skipped, never gathered. Two passes each way are the least batch
statistics allow (all of them are needed before the first output), one more
than LayerNorm's row-local kernel: ≈1.1–1.25× ``nn.LayerNorm`` and ≈1.7× the
elementwise floor at 37% padding (``benchmarks/norms.py``).

Elsewhere (GPUs, or no kernels), without padding the fused ATen kernels
``native_batch_norm`` and ``native_batch_norm_backward`` do all the work. With
padding the forward is: gather the real rows, one statistics kernel over them,
one fused affine pass ``shift + scale ⊙ x`` over the whole tensor, zero the
padded rows; the backward gathers the real rows of the incoming gradient, takes
the two per-channel sums with ``native_batch_norm_backward`` and writes the input
gradient in two fused passes. The batch mean and variance are also
differentiable outputs of the same autograd function, so the RBN penalty costs
nothing unless it is used.
"""
from typing import Optional

import torch
import torch.distributed as dist
from torch.autograd import Function

from . import cpu_kernels
from .base import BatchStatNorm, Discrepancy, measure_discrepancy, padding_rows, token_rows
from .registry import NormConfigError, register_norm

_TEST_STATS = ("population", "batch")
_LOW_PRECISION = (torch.float16, torch.bfloat16)
_nbb = torch.ops.aten.native_batch_norm_backward


def _v4(t: torch.Tensor) -> torch.Tensor:
    """An N×C matrix as N×C×1×1 (the layout the CPU batch-norm kernels run fastest on)."""
    return t.view(t.shape[0], t.shape[1], 1, 1)


def _normalize(x, mean, var, weight, bias, eps):
    """γ ⊙ (x − μ)/sqrt(σ² + ε) + β as one fused pass x·scale + shift (per-channel folding)."""
    scale = torch.rsqrt(var + eps)
    if weight is not None:
        scale = scale * weight
    shift = -mean * scale
    if bias is not None:
        shift = shift + bias
    return torch.addcmul(shift, x, scale)


class _MaskedBatchNormFn(Function):
    """(x_flat, real rows, pad rows, weight, bias) -> (y, μ_B, σ²_B), all differentiable.

    ``idx`` None means every row is real. ``xf`` is N×C, contiguous, in the
    compute dtype; n = number of real rows is at least 1.
    """

    @staticmethod
    def forward(ctx, xf, idx, pidx, weight, bias, eps):
        ctx.set_materialize_grads(False)
        n_rows, channels = xf.shape
        if idx is None:
            # No padding: one fused kernel. Its running-variance update uses the
            # unbiased variance; fed zero buffers with momentum 1 it hands that back,
            # and the biased σ²_B follows exactly (up to one rounding).
            tmp_mean = xf.new_zeros(channels)
            tmp_var = xf.new_zeros(channels)
            out, mean, invstd = torch.native_batch_norm(
                _v4(xf), weight, bias, tmp_mean, tmp_var, True, 1.0, eps
            )
            out = out.view(n_rows, channels)
            if n_rows > 1:
                var = tmp_var.mul_((n_rows - 1) / n_rows)
            else:
                var = tmp_var.zero_()
            xr = xf
        else:
            xr = xf.index_select(0, idx)
            mean, var = torch.batch_norm_update_stats(xr, None, None, 0.0)
            invstd = torch.rsqrt(var + eps)
            scale = invstd if weight is None else invstd * weight
            shift = -mean * scale
            if bias is not None:
                shift = shift + bias
            out = torch.addcmul(shift, xf, scale)
            out.index_fill_(0, pidx, 0.0)
        ctx.eps = eps
        ctx.save_for_backward(xf, xr, weight, mean, invstd, pidx, idx)
        return out, mean, var

    @staticmethod
    def backward(ctx, g_out, g_mean, g_var):
        xf, xr, weight, mean, invstd, pidx, idx = ctx.saved_tensors
        n = xr.shape[0]
        need_x, _, _, need_w, need_b, _ = ctx.needs_input_grad
        grad_x = grad_w = grad_b = None

        # Extra gradient from the statistics outputs (RBN):
        # ∂μ_B/∂x = 1/n, ∂σ²_B/∂x = 2(x − μ_B)/n, at real rows only.
        a = c = None
        if g_var is not None:
            a = g_var * (2.0 / n)
            c = -a * mean
        if g_mean is not None:
            c = g_mean / n if c is None else c + g_mean / n

        if idx is None:
            if g_out is not None:
                go = g_out.contiguous()
                gx, gw, gb = _nbb(
                    _v4(go), _v4(xr), weight, None, None, mean, invstd, True, ctx.eps,
                    [need_x, need_w, need_b],
                )
                grad_w, grad_b = gw, gb
                if need_x:
                    grad_x = gx.view(xr.shape)
                    if a is not None:
                        grad_x.addcmul_(xr, a)
                    if c is not None:
                        grad_x.add_(c)
            elif need_x and (a is not None or c is not None):
                grad_x = torch.addcmul(
                    c if c is not None else torch.zeros_like(mean),
                    xr,
                    a if a is not None else torch.zeros_like(mean),
                )
            return grad_x, None, None, grad_w, grad_b, None

        # With padding: gx = k1 ⊙ g + k2 ⊙ x + k3 at real rows, 0 at padded rows, where
        # gx = w·invstd·(g − Σg/n − x̂·Σ(g x̂)/n) plus the statistics terms above.
        k1 = None
        k2 = a
        k3 = c
        if g_out is not None:
            gr = g_out.index_select(0, idx)
            _, gwh, gb = _nbb(
                _v4(gr), _v4(xr), None, None, None, mean, invstd, True, ctx.eps,
                [False, True, True],
            )
            if weight is not None:
                grad_w = gwh if need_w else None
                grad_b = gb if need_b else None
            k1 = invstd if weight is None else invstd * weight
            b2 = -k1 * invstd * gwh / n
            b3 = -k1 * gb / n - b2 * mean
            k2 = b2 if k2 is None else k2 + b2
            k3 = b3 if k3 is None else k3 + b3
        if need_x and k2 is not None:
            k3 = torch.zeros_like(mean) if k3 is None else k3
            grad_x = torch.addcmul(k3, xf, k2)
            if k1 is not None:
                grad_x.addcmul_(g_out, k1)
            grad_x.index_fill_(0, pidx, 0.0)
        elif need_x and k3 is not None:
            grad_x = k3.expand_as(xf).clone()
            grad_x.index_fill_(0, pidx, 0.0)
        return grad_x, None, None, grad_w, grad_b, None


class _MaskedBatchNormKernelFn(Function):
    """A training forward of :class:`MaskedBatchNorm` through the fused CPU kernels.

    (x_flat, pad rows, n, weight, bias, eps, ρ, running mean, running var) ->
    (y, μ_B, σ²_B, aux, tid). Same maths as :class:`_MaskedBatchNormFn` plus the
    running-statistics update, in one call each way (``bn_train_fwd`` and
    ``bn_bwd`` in csrc/kernels.cpp): forward, one pass for the moments of the
    real rows and one for y = γ·(x − μ_B)·invstd + β (0 at padding); backward,
    one pass for Σg and Σg(x − μ_B) over the real rows and one for
    gx = γ·invstd·(g − Σg/n − x̂·Σ(g x̂)/n) + ∂μ_B/∂x·ḡ_μ + ∂σ²_B/∂x·ḡ_σ² (0 at padding).
    ``pad`` is the N-byte row mask (True at padding) or None; n ≥ 1. The
    running statistics (compute dtype) are updated in place. ``aux`` (3×C:
    invstd, running mean and variance after the update) and ``tid`` (the two TID
    figures against them) are not differentiable.
    """

    @staticmethod
    def forward(ctx, xf, pad, n, weight, bias, eps, momentum, run_mean, run_var):
        ctx.set_materialize_grads(False)
        n_rows, channels = xf.shape
        mean, var = xf.new_empty(channels), xf.new_empty(channels)
        aux, tid = xf.new_empty(3, channels), xf.new_empty(2)
        out = torch.empty_like(xf)
        cpu_kernels.call("bn_train_fwd", xf.dtype, xf, pad, n_rows, channels, weight, bias, eps, momentum,
                         run_mean, run_var, mean, var, aux, tid, out)
        ctx.n = n
        ctx.save_for_backward(xf, pad, weight, mean, aux)
        ctx.mark_non_differentiable(aux, tid)
        return out, mean, var, aux, tid

    @staticmethod
    def backward(ctx, g_out, g_mean, g_var, _g_aux, _g_tid):
        xf, pad, weight, mean, aux = ctx.saved_tensors
        n_rows, channels = xf.shape
        dt = xf.dtype
        need_x, _, _, need_w, need_b = ctx.needs_input_grad[:5]
        g = None if g_out is None else g_out.to(dt).contiguous()
        with_g = g is not None
        grad_x = torch.empty_like(xf) if need_x else None
        grad_w = xf.new_empty(channels) if need_w and with_g else None
        grad_b = xf.new_empty(channels) if need_b and with_g else None
        g_mean = None if g_mean is None else g_mean.to(dt).contiguous()
        g_var = None if g_var is None else g_var.to(dt).contiguous()
        cpu_kernels.call("bn_bwd", dt, g, xf, pad, n_rows, channels, ctx.n, mean, aux[0], weight,
                         g_mean, g_var, grad_x, grad_w, grad_b)
        return grad_x, None, None, grad_w, grad_b, None, None, None, None


class _AllReduceSum(Function):
    """Sum over workers; the gradient is again summed over workers."""

    @staticmethod
    def forward(ctx, t):
        out = t.clone()
        dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        dist.all_reduce(g)
        return g


class _SavedStats:
    """Batch statistics of the last training forward, turned into a Discrepancy on demand."""

    __slots__ = ("mean", "var", "run_mean", "run_var")

    def __init__(self, mean, var, run_mean, run_var):
        self.mean, self.var, self.run_mean, self.run_var = mean, var, run_mean, run_var

    def discrepancy(self) -> Discrepancy:
        return measure_discrepancy(self.mean, self.var, self.run_mean, self.run_var)


class _KernelSavedStats:
    """Batch statistics and TID figures of the last kernel training forward."""

    __slots__ = ("mean", "var", "aux", "tid")

    def __init__(self, mean, var, aux, tid):
        self.mean, self.var, self.aux, self.tid = mean, var, aux, tid

    def discrepancy(self) -> Discrepancy:
        # the RBN terms of measure_discrepancy (graph through μ_B, σ²_B), the TID
        # figures as the kernel computed them with the same formulas
        return Discrepancy(
            rbn_mean=(self.aux[1] - self.mean).pow(2).sum(),
            rbn_var=(self.aux[2] - self.var).abs().sum(),
            tid_mean=self.tid[0],
            tid_var=self.tid[1],
        )


@register_norm("batch")
class MaskedBatchNorm(BatchStatNorm):
    """Masked BatchNorm over real tokens (Ioffe & Szegedy 2015; for NMT: Wang, Wu & Huang 2022).

    Options: ``eps`` (> 0), ``momentum`` ρ of the running-statistics EMA (in
    (0, 1]), ``affine`` (learned γ, β), ``test_stats`` ("population": running
    statistics in eval, the default; "batch": the test batch's own real-token
    statistics in eval, which leaves the running statistics alone), and
    ``sync_stats`` (in training with torch.distributed initialised and more than
    one worker, Σx, Σx², n are summed over workers, with gradient, so every
    worker normalises with the union statistics and keeps identical running
    statistics; off by default, as in the papers).

    Output at padded positions is exactly 0. A batch without a single real
    token gives an all-zero output and leaves the running statistics untouched.
    Statistics are computed in float32 for float16/bfloat16 input, and the
    running statistics stay float32 when the module is cast to half precision;
    the output has the input's dtype.
    """

    supports_rbn = True
    float32_buffers = ("running_mean", "running_var")

    def __init__(
        self,
        dim,
        *,
        eps=1e-5,
        momentum=0.05,
        affine=True,
        test_stats="population",
        sync_stats=False,
    ):
        super().__init__()
        if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
            raise NormConfigError(f"norm 'batch': dim must be a positive int, got {dim!r}")
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
            raise NormConfigError(f"norm 'batch': eps must be a number > 0, got {eps!r}")
        if (
            isinstance(momentum, bool)
            or not isinstance(momentum, (int, float))
            or not 0 < momentum <= 1
        ):
            raise NormConfigError(
                f"norm 'batch': momentum must be in the range (0, 1], got {momentum!r}"
            )
        if test_stats not in _TEST_STATS:
            raise NormConfigError(
                f"norm 'batch': test_stats {test_stats!r} is invalid; "
                f"valid choices: {', '.join(_TEST_STATS)}"
            )
        for name, value in (("affine", affine), ("sync_stats", sync_stats)):
            if not isinstance(value, bool):
                raise NormConfigError(
                    f"norm 'batch': {name} must be True or False, got {value!r}"
                )
        self.dim = dim
        self.eps = float(eps)
        self.momentum = float(momentum)
        self.affine = affine
        self.test_stats = test_stats
        self.sync_stats = sync_stats
        if affine:
            self.weight = torch.nn.Parameter(torch.ones(dim))
            self.bias = torch.nn.Parameter(torch.zeros(dim))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.register_buffer("running_mean", torch.zeros(dim))
        self.register_buffer("running_var", torch.ones(dim))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    # -- the Discrepancy of the last training batch, built lazily ------------------
    @property
    def _last(self) -> Optional[Discrepancy]:
        saved = self.__dict__.get("_saved")
        if isinstance(saved, (_SavedStats, _KernelSavedStats)):
            saved = saved.discrepancy()
            self.__dict__["_saved"] = saved
        return saved

    @_last.setter
    def _last(self, value: Optional[Discrepancy]) -> None:
        self.__dict__["_saved"] = value

    def __getstate__(self):
        # The saved statistics carry an autograd graph; copies and pickles drop them.
        state = dict(super().__getstate__())
        state["_saved"] = None
        return state

    @property
    def uses_batch_stats_in_eval(self) -> bool:
        return self.test_stats == "batch"

    @torch.no_grad()
    def batch_statistics(self, x, pad_mask=None):
        """(μ_B, σ²_B) of the real tokens of ``x`` (biased), without changing state."""
        T, B, C = x.shape
        xf = x.reshape(T * B, C).to(torch.float32 if x.dtype in _LOW_PRECISION else x.dtype)
        idx, _, _ = token_rows(pad_mask, T, B, x.device)
        xr = xf if idx is None else xf.index_select(0, idx)
        var, mean = torch.var_mean(xr, dim=0, correction=0)
        return mean, var

    def population_statistics(self):
        return self.running_mean, self.running_var

    def extra_repr(self) -> str:
        return (
            f"{self.dim}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
            f"test_stats={self.test_stats!r}, sync_stats={self.sync_stats}"
        )

    # -- forward ------------------------------------------------------------------
    def forward(self, x: torch.Tensor, pad_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"expected x of shape T×B×{self.dim}, got {tuple(x.shape)}")
        T, B, C = x.shape
        cdtype = torch.float32 if x.dtype in _LOW_PRECISION else x.dtype
        xf = x.reshape(T * B, C).to(cdtype).contiguous()
        weight = self.weight.to(cdtype) if self.weight is not None else None
        bias = self.bias.to(cdtype) if self.bias is not None else None
        idx, pidx, n = token_rows(pad_mask, T, B, x.device)
        kernels = cpu_kernels.usable(xf)
        pad = padding_rows(pad_mask, T, B, x.device) if kernels else None

        if not self.training:
            self._last = None
            if self.test_stats == "population":
                mean, var = self.running_mean.to(cdtype), self.running_var.to(cdtype)
                needs_graph = torch.is_grad_enabled() and (
                    xf.requires_grad or (weight is not None and weight.requires_grad))
                if kernels and not needs_graph:  # inference: one fused pass
                    scale = torch.rsqrt(var + self.eps)
                    scale = scale if weight is None else scale * weight
                    shift = -mean * scale if bias is None else bias - mean * scale
                    out = torch.empty_like(xf)
                    cpu_kernels.call("affine_rows", cdtype, xf, pad, scale, shift, out, T * B, C)
                else:
                    out = _normalize(xf, mean, var, weight, bias, self.eps)
                    if pidx is not None:
                        out.index_fill_(0, pidx, 0.0)
            elif n == 0:
                out = self._zeros_like(xf)
            elif kernels:  # (running statistics untouched: the kernel updates copies)
                stats = self.running_mean.to(cdtype, copy=True), self.running_var.to(cdtype, copy=True)
                out = _MaskedBatchNormKernelFn.apply(xf, pad, n, weight, bias, self.eps, 0.0, *stats)[0]
            else:
                out, _, _ = _MaskedBatchNormFn.apply(xf, idx, pidx, weight, bias, self.eps)
            return out.view(T, B, C).to(x.dtype)

        if self._distributed():
            out, mean, var, has_tokens = self._synced(xf, idx, n, weight, bias)
        elif n == 0:
            self._last = None
            return self._zeros_like(xf).view(T, B, C).to(x.dtype)
        elif kernels:
            return self._train_kernels(xf, pad, n, weight, bias).view(T, B, C).to(x.dtype)
        else:
            out, mean, var = _MaskedBatchNormFn.apply(xf, idx, pidx, weight, bias, self.eps)
            has_tokens = None

        with torch.no_grad():  # μ̂ ← (1 − ρ)μ̂ + ρ μ_B, σ̂² ← (1 − ρ)σ̂² + ρ σ²_B
            rho = self.momentum
            rm, rv = self.running_mean, self.running_var
            if has_tokens is None:
                rm.mul_(1.0 - rho).add_(mean.detach().to(rm.dtype), alpha=rho)
                rv.mul_(1.0 - rho).add_(var.detach().to(rv.dtype), alpha=rho)
                self.num_batches_tracked.add_(1)
            else:  # no host sync: keep the old values when no worker had a real token
                new_mean = rm * (1.0 - rho) + rho * mean.detach().to(rm.dtype)
                new_var = rv * (1.0 - rho) + rho * var.detach().to(rv.dtype)
                rm.copy_(torch.where(has_tokens, new_mean, rm))
                rv.copy_(torch.where(has_tokens, new_var, rv))
                self.num_batches_tracked.add_(has_tokens.long())
        self.__dict__["_saved"] = _SavedStats(
            mean,
            var,
            self.running_mean.detach().to(cdtype, copy=True),
            self.running_var.detach().to(cdtype, copy=True),
        )
        return out.view(T, B, C).to(x.dtype)

    def _train_kernels(self, xf, pad, n, weight, bias):
        """Training forward on CPU: statistics, output and running-statistics update in one kernel."""
        rm, rv = self.running_mean, self.running_var
        run = (rm, rv) if rm.dtype == xf.dtype else (rm.to(xf.dtype), rv.to(xf.dtype))
        out, mean, var, aux, tid = _MaskedBatchNormKernelFn.apply(
            xf, pad, n, weight, bias, self.eps, self.momentum, *run)
        if run[0] is not rm:
            with torch.no_grad():
                rm.copy_(run[0])
                rv.copy_(run[1])
        self.num_batches_tracked.add_(1)
        self.__dict__["_saved"] = _KernelSavedStats(mean, var, aux, tid)
        return out

    @staticmethod
    def _zeros_like(xf: torch.Tensor) -> torch.Tensor:
        # all-zero output that still belongs to the graph (zero gradient, NaN-safe)
        return xf.masked_fill(torch.ones((), dtype=torch.bool, device=xf.device), 0.0)

    def _synced(self, xf, idx, n, weight, bias):
        """Training forward with statistics summed over all workers (sync_stats)."""
        N, C = xf.shape
        if idx is None:
            xr = xf
        else:
            xr = xf.index_select(0, idx)  # may have 0 rows: this worker still takes part
        x64 = xr.to(torch.float64)
        local = torch.cat(
            [
                x64.sum(0),
                (x64 * x64).sum(0),
                torch.full((1,), float(n), dtype=torch.float64, device=xf.device),
            ]
        )
        total = _AllReduceSum.apply(local)
        count = total[2 * C]
        has_tokens = count > 0
        safe = count.clamp(min=1.0)
        mean64 = total[:C] / safe
        var64 = (total[C : 2 * C] / safe - mean64 * mean64).clamp(min=0.0)
        mean = mean64.to(xf.dtype)
        var = var64.to(xf.dtype)
        yr = _normalize(xr, mean, var, weight, bias, self.eps)
        if idx is None:
            out = yr
        else:
            out = xf.new_zeros(N, C).index_copy(0, idx, yr)
        return out, mean, var, has_tokens
