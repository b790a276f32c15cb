"""Per-token norms: each token is normalised over its C channels; ``pad_mask`` is ignored.

Half-precision input is normalised in float32 and returned in its own dtype. Every norm here
but ``layer`` (torch's own fused kernel) takes ``impl``: the code below is the "torch" path
and the reference; "triton" runs the fused kernels of triton_token.py on the same equations.
"""
import math

import torch
import torch.nn as nn

from .impl import MAX_ROW_CHANNELS, check_impl, check_width, use_triton
from .registry import check_choice, check_option, register_norm

_HALF = (torch.float16, torch.bfloat16)


def upcast(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32 if it is half precision: statistics of fp16 values overflow."""
    return x.float() if x.dtype in _HALF else x


def _check_eps(norm, eps):
    check_option(norm, "eps", eps, "a positive finite number", lambda v: v > 0)
    return float(eps)


def _check_impl(norm, impl, dim):
    """``impl`` checked, and with impl="triton" a token within the kernels' registers."""
    impl = check_impl(norm, impl)
    check_width(norm, impl, dim, MAX_ROW_CHANNELS, "a token (dim)")
    return impl


def _fused_here(module, x):
    """Whether ``module`` runs its fused kernels on ``x`` (impl.use_triton)."""
    return use_triton(module.impl, x, module.norm_name, fits=x.shape[-1] <= MAX_ROW_CHANNELS)


def fused(x, norm, eps, **options):
    """Norm ``norm`` of ``x`` by the fused Triton kernels (triton is imported on the first call)."""
    from .triton_token import per_token_norm
    return per_token_norm(x, norm, eps, **options)


def _check_channels(norm, dim):
    # the unbiased std of one channel divides by C − 1 = 0
    check_option(norm, "dim", dim, "an int >= 2 (the unbiased std needs two channels)",
                 lambda v: isinstance(v, int) and v >= 2)


@register_norm("identity")
class Identity(nn.Module):
    """No normalization: the "w/o Norm" row of Xu et al., "Understanding and Improving Layer Normalization", NeurIPS 2019."""

    def __init__(self, dim):
        super().__init__()

    def forward(self, x, pad_mask=None):
        return x


@register_norm("layer")
class LayerNorm(nn.LayerNorm):
    """LayerNorm of Ba, Kiros & Hinton, "Layer Normalization", 2016 (torch's own, named like fairseq's)."""

    def __init__(self, dim, *, eps=1e-5):
        super().__init__(dim, eps=_check_eps("layer", eps))

    def forward(self, x, pad_mask=None):
        return super().forward(x)


@register_norm("layer_simple")
class LayerNormSimple(nn.Module):
    """LayerNorm-simple of Xu et al., "Understanding and Improving Layer Normalization", NeurIPS 2019."""

    def __init__(self, dim, *, eps=1e-5, impl="auto"):
        super().__init__()
        _check_channels("layer_simple", dim)
        self.eps = _check_eps("layer_simple", eps)
        self.impl = _check_impl("layer_simple", impl, dim)

    def extra_repr(self):
        return f"eps={self.eps}"

    def forward(self, x, pad_mask=None):
        # y = (x − μ) / (s + ε), s the unbiased std, as in the released code
        if _fused_here(self, x):
            return fused(x, "layer_simple", self.eps)
        h = upcast(x)
        y = (h - h.mean(-1, keepdim=True)) / (h.std(-1, keepdim=True) + self.eps)
        return y.to(x.dtype)


@register_norm("detach")
class DetachNorm(nn.Module):
    """DetachNorm of Xu et al., "Understanding and Improving Layer Normalization", NeurIPS 2019."""

    def __init__(self, dim, *, detach="both", eps=1e-5, impl="auto"):
        super().__init__()
        _check_channels("detach", dim)
        check_choice("detach", "detach", detach, ("mean", "std", "both"))
        self.detach = detach
        self.eps = _check_eps("detach", eps)
        self.impl = _check_impl("detach", impl, dim)

    def extra_repr(self):
        return f"detach={self.detach!r}, eps={self.eps}"

    def forward(self, x, pad_mask=None):
        # y = (x − sg(μ)) / (sg(s) + ε): the detached statistics are constants in backward
        if _fused_here(self, x):
            return fused(x, "detach", self.eps, mean_grad=self.detach == "std", std_grad=self.detach == "mean")
        h = upcast(x)
        mean, std = h.mean(-1, keepdim=True), h.std(-1, keepdim=True)
        if self.detach != "std":
            mean = mean.detach()
        if self.detach != "mean":
            std = std.detach()
        return ((h - mean) / (std + self.eps)).to(x.dtype)


@register_norm("adanorm")
class AdaNorm(nn.Module):
    """AdaNorm of Xu et al., "Understanding and Improving Layer Normalization", NeurIPS 2019."""

    def __init__(self, dim, *, k=0.1, scale=1.0, eps=1e-5, impl="auto"):
        super().__init__()
        _check_channels("adanorm", dim)
        check_option("adanorm", "k", k, "a finite number >= 0", lambda v: v >= 0)
        check_option("adanorm", "scale", scale, "a finite number > 0 (C)", lambda v: v > 0)
        self.k, self.scale = float(k), float(scale)
        self.eps = _check_eps("adanorm", eps)
        self.impl = _check_impl("adanorm", impl, dim)

    def extra_repr(self):
        return f"k={self.k}, scale={self.scale}, eps={self.eps}"

    def forward(self, x, pad_mask=None):
        # z = C·(1 − k·sg(y)) ⊙ y with y the LayerNorm-simple output: only the factor is detached
        if _fused_here(self, x):
            return fused(x, "adanorm", self.eps, k=self.k, scale=self.scale)
        h = upcast(x)
        y = (h - h.mean(-1, keepdim=True)) / (h.std(-1, keepdim=True) + self.eps)
        return (self.scale * (1 - self.k * y.detach()) * y).to(x.dtype)


@register_norm("rms")
class RMSNorm(nn.Module):
    """RMSNorm of Zhang & Sennrich, "Root Mean Square Layer Normalization", NeurIPS 2019."""

    def __init__(self, dim, *, eps=1e-8, impl="auto"):
        super().__init__()
        self.eps = _check_eps("rms", eps)
        self.impl = _check_impl("rms", impl, dim)
        self.weight = nn.Parameter(torch.ones(dim))

    def extra_repr(self):
        return f"{self.weight.shape[0]}, eps={self.eps}"

    def forward(self, x, pad_mask=None):
        # y = g ⊙ x / sqrt(mean(x²) + ε)
        if _fused_here(self, x):
            return fused(x, "rms", self.eps, param=self.weight)
        h = upcast(x)
        return (h * torch.rsqrt(h.square().mean(-1, keepdim=True) + self.eps) * self.weight).to(x.dtype)


@register_norm("scale")
class ScaleNorm(nn.Module):
    """ScaleNorm of Nguyen & Salazar, "Transformers without Tears", IWSLT 2019."""

    def __init__(self, dim, *, eps=1e-5, impl="auto"):
        super().__init__()
        self.eps = _check_eps("scale", eps)
        self.impl = _check_impl("scale", impl, dim)
        self.g = nn.Parameter(torch.tensor(math.sqrt(dim)))

    def extra_repr(self):
        return f"eps={self.eps}"

    def forward(self, x, pad_mask=None):
        # y = g · x / max(‖x‖₂, ε), one scalar g per layer
        if _fused_here(self, x):
            return fused(x, "scale", self.eps, param=self.g)
        h = upcast(x)
        norm = torch.linalg.vector_norm(h, dim=-1, keepdim=True).clamp(min=self.eps)
        return (h * (self.g / norm)).to(x.dtype)
