"""Per-token norms (SPEC §1): statistics over the channels of one token at a time.

Every norm here takes ``x`` of shape ``(..., C)`` (T×B×C in the model), normalises
each token over its last dimension and ignores ``pad_mask``.

Speed. On a CPU (float32/float64; half precision is computed in float32) the
norms other than ``layer`` run the fused kernels of ``csrc/kernels.cpp``
(:mod:`normplug.norms.cpu_kernels`): per token, one pass for the statistics and
the output forward, one for the row sums and the gradient backward, like torch's
own LayerNorm kernel. Elsewhere (GPUs, or where the kernels cannot be built) each
norm is an ``autograd.Function`` whose passes are torch's fused native kernels,
fed per-token coefficients that make them compute exactly (to float rounding)
the equation of the SPEC:

* ``native_layer_norm`` (run with a negligible ε′) yields per-token mean and
  biased variance together with (x − μ)·rstd′; one in-place per-token multiply
  turns that into (x − μ)/(s + ε).
* ``native_batch_norm_backward`` in training mode, applied to the N×C activations
  viewed as one sample with N channels, is per *token* the map
  ``w·r·(g − mean(g) − u·mean(g·u)·r²)`` with the per-token ``w`` and ``r`` we
  pass; the LayerNorm-simple / AdaNorm backward has this form with
  ``r² = C·D/((C − 1)·s)`` and ``w = 1/(D·r)`` (D = s + ε, u the saved output).
* ``native_layer_norm_backward`` with mean 0 gives the RMSNorm backward up to
  one per-token term, and its weight gradient is RMSNorm's.
* ``_weight_norm_interface`` (g·v/‖v‖ per row) and its backward are ScaleNorm
  for every token with ‖x‖ ≥ ε; the rare tokens below ε are patched.

Forward+backward against ``nn.LayerNorm`` (affine), T×B×C = 32×128×512, float32,
one thread (``benchmarks/norms.py --threads 1 --clock thread``): with the CPU
kernels every norm here is at 0.8–1.0×; the torch-op versions on a CPU cost
layer_simple ≈1.2×, rms ≈1.65×, adanorm ≈1.9× (detach and scale ≈1.0×).

Half precision (fp16/bf16) is computed in float32 and returned in the input
dtype. The custom backwards are first-order only (no double backward).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import cpu_kernels
from .registry import NormConfigError, register_norm

__all__ = ["LayerNorm", "LayerNormSimple", "DetachNorm", "AdaNorm", "RMSNorm", "ScaleNorm"]

_aten = torch.ops.aten
_HALF = (torch.float16, torch.bfloat16)
_DETACH_CHOICES = ("mean", "std", "both")


# ----------------------------------------------------------------------------- helpers


def _check_eps(name, eps):
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not (0 < eps < math.inf):
        raise NormConfigError(f"norm {name!r}: eps must be a positive finite number, got {eps!r}")
    return float(eps)


def _check_dim(name, dim, at_least=1):
    if not isinstance(dim, int) or isinstance(dim, bool) or dim < at_least:
        raise NormConfigError(f"norm {name!r}: dim must be an int >= {at_least}, got {dim!r}")


def _rows(x, dim):
    """``x`` as a contiguous (N, C) float tensor (float32 for fp16/bf16 input)."""
    if x.shape[-1] != dim:
        raise ValueError(f"expected {dim} channels in the last dimension, got shape {tuple(x.shape)}")
    x2 = x.reshape(-1, dim)
    if x2.dtype in _HALF:
        x2 = x2.float()
    return x2.contiguous()


_ONES = {}


def _ones(n, like):
    """A cached ``torch.ones(n)``: LayerNorm's CPU kernel is faster with a weight."""
    key = (n, like.dtype, like.device)
    t = _ONES.get(key)
    if t is None:
        t = _ONES[key] = torch.ones(n, dtype=like.dtype, device=like.device)
    return t


def _stat_eps(eps, dtype):
    """ε′ of the native_layer_norm call that yields the statistics.

    It only keeps rstd′ = 1/sqrt(σ² + ε′) finite on constant tokens: s is taken as
    sqrt(C/(C − 1))/rstd′, off by at most sqrt(ε′·C/(C − 1)), that is 1e-8·ε in
    float32 (1e-16·ε in float64), far below the rounding of D = s + ε ≥ ε.
    """
    if dtype == torch.float64:
        return max((eps * 1e-16) ** 2, 1e-300)
    return max((eps * 1e-8) ** 2, 1e-36)


def _simple_forward(x2, eps, mult):
    """``y = mult·(x − μ)/(s + ε)`` (a new tensor), and per token ``rstd′`` and
    ``q = (s + ε)·rstd′`` (N×1), from which the backward derives its coefficients."""
    n_ch = x2.shape[1]
    k = math.sqrt(n_ch / (n_ch - 1))
    y, _mean, rstd = _aten.native_layer_norm(x2, [n_ch], _ones(n_ch, x2), None, _stat_eps(eps, x2.dtype))
    # y = (x − μ)·rstd′ and s = k/rstd′, so (x − μ)/(s + ε) = y/q with q = k + ε·rstd′
    q = rstd.mul(eps).add_(k)
    y.mul_(q.reciprocal().mul_(mult) if mult != 1.0 else q.reciprocal())
    return y, rstd, q


def _simple_backward(g2, u, rstd, q, mult):
    """Input gradient of ``u = mult·(x − μ)/(s + ε)`` (the saved output) for ``g2``.

    Exactly ``mult·(g − mean g)/D − u·Σ(g·u)/(mult·(C − 1)·s)`` with D = s + ε: the
    derivative through μ and through the unbiased std s. As the training-mode
    batch-norm backward of the N×C rows seen as N channels, that is
    ``w·r·(g − mean g) − w·r³·u·Σ(g·u)/C`` with per-token ``w·r = mult/D`` and
    ``r² = C·D/(mult²·(C − 1)·s) = k·q/mult²``. At s = 0 (u = 0) the std term is 0,
    as in torch's own ``std`` backward.
    """
    n, n_ch = u.shape
    k = math.sqrt(n_ch / (n_ch - 1))
    r = q.mul(k).sqrt_()
    w = rstd.div(q * r)  # mult/D / r, with D = q/rstd′
    if mult != 1.0:
        r.div_(mult)
        w.mul_(mult * mult)
    zeros = torch.zeros(n, dtype=u.dtype, device=u.device)
    return _aten.native_batch_norm_backward(
        g2.view(1, n, n_ch), u.view(1, n, n_ch), w.view(n), None, None, zeros, r.view(n),
        True, 0.0, [True, False, False],
    )[0].view(n, n_ch)


# ------------------------------------------------------------- autograd functions


class _SimpleFn(torch.autograd.Function):
    """LayerNorm-simple, DetachNorm and AdaNorm: forward and a fused backward."""

    @staticmethod
    def forward(ctx, x, dim, eps, mode, k, scale):
        # mode: "full" (layer_simple), "mean"/"std"/"both" (what is detached), "ada"
        x2 = _rows(x, dim)
        ctx.shape, ctx.dtype, ctx.mode, ctx.k, ctx.scale = x.shape, x.dtype, mode, k, scale
        y, rstd, q = _simple_forward(x2, eps, scale if mode == "ada" else 1.0)
        if mode == "ada":
            # z = C·(1 − k·y)·y; with y' = C·y: z = y' − (k/C)·y'²
            z = torch.addcmul(y, y, y, value=-k / scale)
            ctx.save_for_backward(y, rstd, q)
            return z.view(x.shape).to(x.dtype)
        if mode == "both":
            ctx.save_for_backward(rstd, q)
        else:
            ctx.save_for_backward(y, rstd, q)
        return y.view(x.shape).to(x.dtype)

    @staticmethod
    def backward(ctx, gz):
        mode = ctx.mode
        n_ch = ctx.shape[-1]
        g2 = gz.reshape(-1, n_ch)
        if g2.dtype in _HALF:
            g2 = g2.float()
        g2 = g2.contiguous()
        if mode == "both":
            rstd, q = ctx.saved_tensors
            gx = g2 * rstd.div(q)  # g/D
        else:
            y, rstd, q = ctx.saved_tensors
            if mode == "full":
                gx = _simple_backward(g2, y, rstd, q, 1.0)
            elif mode == "ada":
                # the factor C·(1 − k·y) is a constant: g̃ = g·(1 − k·y), then the
                # LayerNorm-simple backward of C·y applied to g̃
                gt = torch.addcmul(g2, g2, y, value=-ctx.k / ctx.scale)
                gx = _simple_backward(gt, y, rstd, q, ctx.scale)
            elif mode == "mean":
                # μ constant: the full backward plus the mean(g)/D it subtracts
                gx = _simple_backward(g2, y, rstd, q, 1.0)
                gx.add_(g2.sum(1, keepdim=True).mul_(rstd.div(q)).div_(n_ch))
            else:  # "std": s constant, gx = (g − mean g)/D in one pass
                n = g2.shape[0]
                gx = _aten._native_batch_norm_legit_no_training(
                    g2.view(1, n, n_ch), rstd.div(q).view(n), None,
                    g2.mean(1), torch.ones(n, dtype=g2.dtype, device=g2.device), 0.0, 0.0,
                )[0].view(n, n_ch)
        return gx.view(ctx.shape).to(ctx.dtype), None, None, None, None, None


class _RMSFn(torch.autograd.Function):
    """y = w ⊙ x / sqrt(mean(x²) + ε)."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        n_ch = weight.shape[0]
        x2 = _rows(x, n_ch)
        w = weight.to(x2.dtype)
        r = torch.linalg.vector_norm(x2, dim=1, keepdim=True).square_().div_(n_ch).add_(eps).rsqrt_()  # N×1
        y = torch.mul(x2, r).mul_(w)
        ctx.save_for_backward(x2, r, w)
        ctx.shape, ctx.dtype, ctx.wdtype = x.shape, x.dtype, weight.dtype
        return y.view(x.shape).to(x.dtype)

    @staticmethod
    def backward(ctx, gy):
        x2, r, w = ctx.saved_tensors
        n, n_ch = x2.shape
        g2 = gy.reshape(-1, n_ch)
        if g2.dtype != x2.dtype:
            g2 = g2.to(x2.dtype)
        g2 = g2.contiguous()
        need_w = ctx.needs_input_grad[1]
        # LayerNorm's backward with mean 0 and rstd r is
        #   r·(h − mean h) − r³·x·Σ(h·x)/C,  h = g ⊙ w,
        # RMSNorm's lacks the −r·mean(h) term; its weight gradient Σ g·x·r matches.
        gx, gw, _ = _aten.native_layer_norm_backward(
            g2, x2, [n_ch], torch.zeros_like(r), r, w, None, [True, need_w, False]
        )
        gx.add_(torch.mv(g2, w).view(n, 1).mul_(r).div_(n_ch))  # (addcmul_ broadcasting is slow)
        return (
            gx.view(ctx.shape).to(ctx.dtype),
            gw.to(ctx.wdtype) if need_w else None,
            None,
        )


class _ScaleFn(torch.autograd.Function):
    """y = g · x / max(‖x‖₂, ε), g a scalar."""

    @staticmethod
    def forward(ctx, x, g, eps):
        n_ch = x.shape[-1]
        x2 = _rows(x, n_ch)
        n = x2.shape[0]
        grow = g.detach().to(x2.dtype).reshape(1, 1).expand(n, 1).contiguous()
        # weight norm per row: y = grow · x / ‖x‖ (fused norm + scale)
        y, norms = _aten._weight_norm_interface(x2, grow, 0)
        small = norms < eps  # there y = g·x/ε (‖x‖ = 0 gave NaN above)
        if x2.device.type == "cpu":
            if bool(small.any()):
                idx = small.view(n).nonzero().view(-1)
                y[idx] = x2[idx] * (grow[idx] / eps)
        else:  # no host sync on accelerators
            y = torch.where(small, x2 * (grow / eps), y)
        ctx.save_for_backward(x2, grow, norms, small)
        ctx.shape, ctx.dtype, ctx.eps, ctx.gdtype = x.shape, x.dtype, eps, g.dtype
        return y.view(x.shape).to(x.dtype)

    @staticmethod
    def backward(ctx, gy):
        x2, grow, norms, small = ctx.saved_tensors
        eps = ctx.eps
        n, n_ch = x2.shape
        g2 = gy.reshape(-1, n_ch)
        if g2.dtype != x2.dtype:
            g2 = g2.to(x2.dtype)
        g2 = g2.contiguous()
        # (g/‖x‖)·(gy − x·Σ(gy·x)/‖x‖²) and Σ(gy·x)/‖x‖ per row
        gx, gg = _aten._weight_norm_interface_backward(g2, x2, grow, norms, 0)
        # below ε the denominator is the constant ε: gx = g·gy/ε, ∂/∂g = Σ gy·x/ε
        if x2.device.type == "cpu":
            if bool(small.any()):
                idx = small.view(n).nonzero().view(-1)
                gx[idx] = g2[idx] * (grow[idx] / eps)
                gg[idx] = (g2[idx] * x2[idx]).sum(1, keepdim=True) / eps
        else:
            gx = torch.where(small, g2 * (grow / eps), gx)
            gg = torch.where(small, (g2 * x2).sum(1, keepdim=True) / eps, gg)
        dg = gg.sum().to(ctx.gdtype) if ctx.needs_input_grad[1] else None
        return gx.view(ctx.shape).to(ctx.dtype), dg, None


# ------------------------------------------------- fused CPU kernels (cpu_kernels)

_MODES = {"full": 0, "mean": 1, "std": 2, "both": 3, "ada": 4}


def _grad_rows(g, like):
    """The upstream gradient as a contiguous (N, C) tensor of ``like``'s dtype."""
    g2 = g.reshape(like.shape)
    return g2.to(like.dtype).contiguous()


class _SimpleKernelFn(torch.autograd.Function):
    """LayerNorm-simple, DetachNorm and AdaNorm through the fused CPU kernels.

    Forward: per token μ, s, D = s + ε and ŷ = (x − μ)/D (AdaNorm: C·(1 − kŷ)·ŷ) in
    one pass; saves the input and per token μ, 1/D, 1/((C − 1)s). Backward
    (``simple_bwd`` in csrc/kernels.cpp): (g − mean g)/D − ŷ·Σ(gŷ)/((C − 1)s),
    without the first mean when μ is detached, without the second term when s
    is; AdaNorm applies it to g·C·(1 − kŷ).
    """

    @staticmethod
    def forward(ctx, x, dim, eps, mode, k, scale):
        x2 = _rows(x, dim)
        n = x2.shape[0]
        y = torch.empty_like(x2)
        stats = x2.new_empty(3, n)  # μ, 1/D, 1/((C − 1)s)
        cpu_kernels.call("simple_fwd", x2.dtype, x2, y, stats[0], stats[1], stats[2], n, dim, eps,
                         int(mode == "ada"), k, scale)
        ctx.save_for_backward(x2, stats)
        ctx.shape, ctx.dtype, ctx.mode, ctx.k, ctx.scale = x.shape, x.dtype, _MODES[mode], k, scale
        return y.view(x.shape).to(x.dtype)

    @staticmethod
    def backward(ctx, gz):
        x2, stats = ctx.saved_tensors
        n, n_ch = x2.shape
        g2 = _grad_rows(gz, x2)
        gx = torch.empty_like(x2)
        cpu_kernels.call("simple_bwd", x2.dtype, g2, x2, stats[0], stats[1], stats[2], gx, n, n_ch,
                         ctx.mode, ctx.k, ctx.scale)
        return gx.view(ctx.shape).to(ctx.dtype), None, None, None, None, None


class _RMSKernelFn(torch.autograd.Function):
    """RMSNorm through the fused CPU kernels: y = w ⊙ x·r, r = 1/sqrt(mean x² + ε);
    ∂/∂x = r·(w⊙g) − x·r³·Σ(w⊙g⊙x)/C, ∂/∂w = Σ_tokens g⊙x·r."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        n_ch = weight.shape[0]
        x2 = _rows(x, n_ch)
        n = x2.shape[0]
        w = weight.detach().to(x2.dtype).contiguous()
        y = torch.empty_like(x2)
        r = x2.new_empty(n)
        cpu_kernels.call("rms_fwd", x2.dtype, x2, w, y, r, n, n_ch, eps)
        ctx.save_for_backward(x2, w, r)
        ctx.shape, ctx.dtype, ctx.wdtype = x.shape, x.dtype, weight.dtype
        return y.view(x.shape).to(x.dtype)

    @staticmethod
    def backward(ctx, gy):
        x2, w, r = ctx.saved_tensors
        n, n_ch = x2.shape
        g2 = _grad_rows(gy, x2)
        gx = torch.empty_like(x2)
        gw = torch.empty(n_ch, dtype=torch.float64) if ctx.needs_input_grad[1] else None
        cpu_kernels.call("rms_bwd", x2.dtype, g2, x2, w, r, gx, gw, n, n_ch)
        return (
            gx.view(ctx.shape).to(ctx.dtype),
            gw.to(ctx.wdtype) if gw is not None else None,
            None,
        )


class _ScaleKernelFn(torch.autograd.Function):
    """ScaleNorm through the fused CPU kernels: y = g·x/max(‖x‖, ε);
    ∂/∂x = (g/‖x‖)·(gy − x·Σ(gy⊙x)/‖x‖²) (g·gy/ε below ε), ∂/∂g = Σ Σ(gy⊙x)/max(‖x‖, ε)."""

    @staticmethod
    def forward(ctx, x, g, eps):
        n_ch = x.shape[-1]
        x2 = _rows(x, n_ch)
        n = x2.shape[0]
        gval = float(g.detach())
        y = torch.empty_like(x2)
        coef = x2.new_empty(2, n)  # 1/max(‖x‖, ε) and its square (0 below ε)
        cpu_kernels.call("scale_fwd", x2.dtype, x2, gval, y, coef[0], coef[1], n, n_ch, eps)
        ctx.save_for_backward(x2, coef)
        ctx.shape, ctx.dtype, ctx.g, ctx.gdtype = x.shape, x.dtype, gval, g.dtype
        return y.view(x.shape).to(x.dtype)

    @staticmethod
    def backward(ctx, gy):
        x2, coef = ctx.saved_tensors
        n, n_ch = x2.shape
        g2 = _grad_rows(gy, x2)
        gx = torch.empty_like(x2)
        dg = torch.empty((), dtype=torch.float64)
        cpu_kernels.call("scale_bwd", x2.dtype, g2, x2, ctx.g, coef[0], coef[1], gx, dg, n, n_ch)
        return (
            gx.view(ctx.shape).to(ctx.dtype),
            dg.to(ctx.gdtype) if ctx.needs_input_grad[1] else None,
            None,
        )


# ----------------------------------------------------------------------- modules


@register_norm("layer")
class LayerNorm(nn.LayerNorm):
    """Stock LayerNorm (Ba, Kiros & Hinton 2016), parameters named like fairseq's."""

    def __init__(self, dim, *, eps=1e-5):
        _check_dim("layer", dim)
        super().__init__(dim, eps=_check_eps("layer", eps))

    def forward(self, x, pad_mask=None):
        if x.dtype in _HALF and self.weight is not None and self.weight.dtype != x.dtype:
            # mixed dtypes: normalise in float32 and hand back the input dtype
            return F.layer_norm(x.float(), self.normalized_shape, self.weight.float(),
                                self.bias.float(), self.eps).to(x.dtype)
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


@register_norm("layer_simple")
class LayerNormSimple(nn.Module):
    """LayerNorm-simple of Xu et al., "Understanding and Improving Layer Normalization", NeurIPS 2019."""

    def __init__(self, dim, *, eps=1e-5):
        super().__init__()
        _check_dim("layer_simple", dim, at_least=2)  # the unbiased std needs C >= 2
        self.dim = dim
        self.eps = _check_eps("layer_simple", eps)

    def extra_repr(self):
        return f"{self.dim}, eps={self.eps}"

    def forward(self, x, pad_mask=None):
        if x.numel() == 0:  # (some native kernels crash on zero rows)
            return x.clone()
        fn = _SimpleKernelFn if cpu_kernels.usable(x) else _SimpleFn
        return fn.apply(x, self.dim, self.eps, "full", 0.0, 1.0)


@register_norm("detach")
class DetachNorm(nn.Module):
    """DetachNorm of Xu et al., "Understanding and Improving Layer Normalization", NeurIPS 2019."""

    def __init__(self, dim, *, detach="both", eps=1e-5):
        super().__init__()
        _check_dim("detach", dim, at_least=2)
        if detach not in _DETACH_CHOICES:
            raise NormConfigError(
                f"norm 'detach': invalid detach={detach!r}; valid choices: {', '.join(_DETACH_CHOICES)}"
            )
        self.dim = dim
        self.detach = detach
        self.eps = _check_eps("detach", eps)

    def extra_repr(self):
        return f"{self.dim}, detach={self.detach!r}, eps={self.eps}"

    def forward(self, x, pad_mask=None):
        if x.numel() == 0:  # (some native kernels crash on zero rows)
            return x.clone()
        fn = _SimpleKernelFn if cpu_kernels.usable(x) else _SimpleFn
        return fn.apply(x, self.dim, self.eps, self.detach, 0.0, 1.0)


@register_norm("adanorm")
class AdaNorm(nn.Module):
    """AdaNorm of Xu et al., "Understanding and Improving Layer Normalization", NeurIPS 2019."""

    def __init__(self, dim, *, k=0.1, scale=1.0, eps=1e-5):
        super().__init__()
        _check_dim("adanorm", dim, at_least=2)
        if isinstance(k, bool) or not isinstance(k, (int, float)) or not (0 <= k < math.inf):
            raise NormConfigError(f"norm 'adanorm': k must be a finite number >= 0, got {k!r}")
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (0 < scale < math.inf):
            raise NormConfigError(f"norm 'adanorm': scale (C) must be a finite number > 0, got {scale!r}")
        self.dim = dim
        self.k = float(k)
        self.scale = float(scale)
        self.eps = _check_eps("adanorm", eps)

    def extra_repr(self):
        return f"{self.dim}, k={self.k}, scale={self.scale}, eps={self.eps}"

    def forward(self, x, pad_mask=None):
        if x.numel() == 0:  # (some native kernels crash on zero rows)
            return x.clone()
        fn = _SimpleKernelFn if cpu_kernels.usable(x) else _SimpleFn
        return fn.apply(x, self.dim, self.eps, "ada", self.k, self.scale)


@register_norm("rms")
class RMSNorm(nn.Module):
    """RMSNorm of Zhang & Sennrich, "Root Mean Square Layer Normalization", NeurIPS 2019."""

    def __init__(self, dim, *, eps=1e-8):
        super().__init__()
        _check_dim("rms", dim)
        self.eps = _check_eps("rms", eps)
        self.weight = nn.Parameter(torch.ones(dim))

    def extra_repr(self):
        return f"{self.weight.shape[0]}, eps={self.eps}"

    def forward(self, x, pad_mask=None):
        if x.numel() == 0:
            return x * self.weight.to(x.dtype)
        fn = _RMSKernelFn if cpu_kernels.usable(x) else _RMSFn
        return fn.apply(x, self.weight, self.eps)


@register_norm("scale")
class ScaleNorm(nn.Module):
    """ScaleNorm of Nguyen & Salazar, "Transformers without Tears", IWSLT 2019."""

    def __init__(self, dim, *, eps=1e-5):
        super().__init__()
        _check_dim("scale", dim)
        self.eps = _check_eps("scale", eps)
        self.g = nn.Parameter(torch.tensor(math.sqrt(dim)))

    def extra_repr(self):
        return f"eps={self.eps}"

    def forward(self, x, pad_mask=None):
        if x.numel() == 0:
            return x * self.g.to(x.dtype)
        fn = _ScaleKernelFn if cpu_kernels.usable(x) else _ScaleFn
        return fn.apply(x, self.g, self.eps)
