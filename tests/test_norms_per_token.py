"""Per-token norms against float64 references written from the papers' equations.

The references below are deliberately naive (plain torch ops, float64, autograd for
their gradients) and never call normplug: LayerNorm (Ba et al. 2016), LayerNorm-simple,
DetachNorm and AdaNorm (Xu et al. 2019, as released: unbiased std, ε added to it),
RMSNorm (Zhang & Sennrich 2019), ScaleNorm (Nguyen & Salazar 2019).
"""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from normplug.norms import NormConfigError, create_norm, norm_names, norm_options

PER_TOKEN = ("layer", "layer_simple", "detach", "adanorm", "rms", "scale")

# (name, options) of every configuration checked against its reference
CONFIGS = [
    ("layer", {}),
    ("layer_simple", {}),
    ("layer_simple", {"eps": 1e-2}),
    ("detach", {}),
    ("detach", {"detach": "mean"}),
    ("detach", {"detach": "std"}),
    ("adanorm", {}),
    ("adanorm", {"k": 0.3, "scale": 2.0}),
    ("rms", {}),
    ("rms", {"eps": 1e-2}),
    ("scale", {}),
]
IDS = [name + "".join(f"-{k}={v}" for k, v in opts.items()) for name, opts in CONFIGS]


# --------------------------------------------------------------------------- references


def _mean(x):
    return x.sum(-1, keepdim=True) / x.shape[-1]


def _std_unbiased(x):
    c = x.shape[-1]
    return torch.sqrt(((x - _mean(x)) ** 2).sum(-1, keepdim=True) / (c - 1))


def ref_layer(x, weight, bias, eps=1e-5):
    mu = _mean(x)
    var = _mean((x - mu) ** 2)  # biased
    return weight * (x - mu) / torch.sqrt(var + eps) + bias


def ref_simple(x, eps=1e-5, detach_mean=False, detach_std=False):
    """(x − μ)/(s + ε), s the unbiased std; μ and/or s optionally stop-gradient."""
    mu, s = _mean(x), _std_unbiased(x)
    if detach_mean:
        mu = mu.detach()
    if detach_std:
        s = s.detach()
    return (x - mu) / (s + eps)


def ref_adanorm(x, k=0.1, scale=1.0, eps=1e-5):
    y = ref_simple(x, eps)
    return scale * (1 - k * y.detach()) * y


def ref_rms(x, weight, eps=1e-8):
    return weight * x / torch.sqrt(_mean(x * x) + eps)


def ref_scale(x, g, eps=1e-5):
    norm = torch.sqrt((x * x).sum(-1, keepdim=True))
    return g * x / torch.clamp(norm, min=eps)


def reference(name, opts, x, params):
    """The equation of norm ``name`` applied to float64 ``x`` with ``params``."""
    eps = opts.get("eps")
    kw = {} if eps is None else {"eps": eps}
    if name == "layer":
        return ref_layer(x, params["weight"], params["bias"], **kw)
    if name == "layer_simple":
        return ref_simple(x, **kw)
    if name == "detach":
        which = opts.get("detach", "both")
        return ref_simple(x, detach_mean=which in ("mean", "both"), detach_std=which in ("std", "both"), **kw)
    if name == "adanorm":
        return ref_adanorm(x, k=opts.get("k", 0.1), scale=opts.get("scale", 1.0), **kw)
    if name == "rms":
        return ref_rms(x, params["weight"], **kw)
    if name == "scale":
        return ref_scale(x, params["g"], **kw)
    raise AssertionError(name)


# ------------------------------------------------------------------------------ helpers


def make_norm(name, opts, dim, dtype=torch.float32, seed=0):
    """The norm with its parameters (if any) set to random non-trivial values."""
    norm = create_norm(name, dim, **opts)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in norm.parameters():
            p.copy_(torch.rand(p.shape, generator=gen, dtype=p.dtype) + 0.5)
    return norm.to(dtype)


def ref_grads(name, opts, norm, x, gy):
    """Output and gradients (input, then each parameter) of the float64 reference."""
    xr = x.detach().double().requires_grad_(True)
    params = {k: p.detach().double().requires_grad_(True) for k, p in norm.named_parameters()}
    y = reference(name, opts, xr, params)
    grads = torch.autograd.grad(y, [xr, *params.values()], gy.double())
    return y.detach(), grads


def impl_grads(norm, x, gy):
    xi = x.detach().clone().requires_grad_(True)
    y = norm(xi)
    grads = torch.autograd.grad(y, [xi, *norm.parameters()], gy)
    return y.detach(), grads


def random_input(shape, seed, dtype=torch.float64, offset=0.3, spread=1.5):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    # per-token offsets and scales, so tokens differ in their statistics
    x = x * (spread * torch.rand(shape[:-1] + (1,), generator=gen, dtype=torch.float64) + 0.1)
    x = x + offset * torch.randn(shape[:-1] + (1,), generator=gen, dtype=torch.float64)
    gy = torch.randn(shape, generator=gen, dtype=torch.float64) + 0.2
    return x.to(dtype), gy.to(dtype)


shapes = st.tuples(st.integers(1, 5), st.integers(1, 4), st.integers(2, 40))


# -------------------------------------------------------- forward and backward values


@pytest.mark.parametrize("name,opts", CONFIGS, ids=IDS)
@settings(max_examples=25, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**31 - 1))
def test_matches_reference_float64(name, opts, shape, seed):
    x, gy = random_input(shape, seed)
    norm = make_norm(name, opts, shape[-1], torch.float64, seed)
    y, grads = impl_grads(norm, x, gy)
    y_ref, grads_ref = ref_grads(name, opts, norm, x, gy)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    for got, want in zip(grads, grads_ref):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name,opts", CONFIGS, ids=IDS)
@pytest.mark.parametrize("offset", [0.3, 20.0])
def test_matches_reference_float32(name, opts, offset):
    """The float32 path (fused kernels, derived coefficients) is exact to float32
    rounding, also for tokens whose mean is many standard deviations from 0."""
    shape = (7, 5, 64)
    x, gy = random_input(shape, seed=3, dtype=torch.float32, offset=offset)
    norm = make_norm(name, opts, shape[-1], torch.float32)
    y, grads = impl_grads(norm, x, gy)
    y_ref, grads_ref = ref_grads(name, opts, norm, x, gy)
    tol = 2e-6 * (1 + offset)
    torch.testing.assert_close(y.double(), y_ref, rtol=tol, atol=tol)
    for got, want in zip(grads, grads_ref):
        scale = want.abs().max().item()
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * scale)


def test_layer_is_torch_layernorm():
    """`layer` is nn.LayerNorm: same numbers, same parameter names, same state dict."""
    norm = make_norm("layer", {}, 24)
    ref = torch.nn.LayerNorm(24)
    ref.load_state_dict(norm.state_dict())
    assert set(norm.state_dict()) == {"weight", "bias"}
    assert isinstance(norm, torch.nn.LayerNorm) and norm.eps == 1e-5
    x, _ = random_input((3, 2, 24), 0, torch.float32)
    assert torch.equal(norm(x, pad_mask=None), ref(x))


def test_parameters_and_defaults():
    assert norm_options("layer_simple") == {"eps": 1e-5, "impl": "auto"}
    assert norm_options("detach") == {"detach": "both", "eps": 1e-5, "impl": "auto"}
    assert norm_options("adanorm") == {"k": 0.1, "scale": 1.0, "eps": 1e-5, "impl": "auto"}
    assert norm_options("rms")["impl"] == norm_options("scale")["impl"] == "auto"
    assert norm_options("rms")["eps"] == 1e-8
    assert norm_options("scale")["eps"] == 1e-5
    for name in ("layer_simple", "detach", "adanorm"):
        assert list(create_norm(name, 16).parameters()) == []
    rms = create_norm("rms", 16)
    assert [n for n, _ in rms.named_parameters()] == ["weight"]
    assert torch.equal(rms.weight.detach(), torch.ones(16))
    scale = create_norm("scale", 16)
    assert [n for n, _ in scale.named_parameters()] == ["g"]
    assert scale.g.dim() == 0 and scale.g.item() == pytest.approx(4.0)


@pytest.mark.parametrize("spread", [1e-7, 1e-12])
def test_scale_below_eps_matches_reference(spread):
    """A token with ‖x‖ < ε: ScaleNorm divides by ε there, and its gradient is that of
    g·x/ε."""
    x, gy = random_input((2, 3, 6), seed=12)
    x[1, 2] *= spread
    norm = make_norm("scale", {}, 6, torch.float64)
    y, grads = impl_grads(norm, x, gy)
    y_ref, grads_ref = ref_grads("scale", {}, norm, x, gy)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-12)
    for got, want in zip(grads, grads_ref):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(grads[0][1, 2], norm.g.detach() * gy[1, 2] / 1e-5, rtol=1e-12, atol=0)


# ------------------------------------------------------------ Xu et al. gradient facts


def _grad_x(name, opts, x, gy):
    xi = x.clone().requires_grad_(True)
    (gx,) = torch.autograd.grad(create_norm(name, x.shape[-1], **opts).double()(xi), xi, gy)
    return gx


@settings(max_examples=25, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**31 - 1))
def test_xu_gradient_facts(shape, seed):
    """Xu et al. 2019 on the input gradient of each token, over its C channels.

    * layer_simple: the gradient has zero mean.
    * mean detached (detach="mean"): it does not; its mean is exactly mean(g)/(s + ε)
      (the std term is proportional to y, whose channel mean is 0).
    * std detached (detach="std"): the gradient is (g − mean g)/(s + ε), so its mean is
      0 and its variance is exactly D_g/σ².

    Interpretation: D_g is the variance over the C channels of the upstream gradient
    g = ∂L/∂y of that token, and σ is the (constant, detached) denominator s + ε of
    the forward, not the bare std; the identity holds for any variance estimator used
    on both sides, here the biased one (1/C).
    """
    x, gy = random_input(shape, seed)
    c = shape[-1]
    # upstream gradient with a per-token mean of 1..2, so "not zero" is clear-cut
    g_mean = 1 + torch.rand(shape[:-1] + (1,), generator=torch.Generator().manual_seed(seed), dtype=x.dtype)
    gy = gy - _mean(gy) + g_mean
    denom = _std_unbiased(x) + 1e-5
    g_scale = gy.abs().max() / denom.min()

    gx = _grad_x("layer_simple", {}, x, gy)
    assert _mean(gx).abs().max() <= 1e-12 * g_scale

    gx = _grad_x("detach", {"detach": "mean"}, x, gy)
    torch.testing.assert_close(_mean(gx), g_mean / denom, rtol=1e-10, atol=1e-12 * g_scale)
    assert (_mean(gx) >= 0.5 / denom).all()  # not zero: ≥ 1/(s + ε) here

    gx = _grad_x("detach", {"detach": "std"}, x, gy)
    d_g = _mean((gy - g_mean) ** 2)
    var_gx = _mean((gx - _mean(gx)) ** 2)
    torch.testing.assert_close(var_gx, d_g / denom**2, rtol=1e-9, atol=0)
    assert _mean(gx).abs().max() <= 1e-12 * g_scale
    if c > 2:  # the full gradient's variance differs: it has the std term
        gx_full = _grad_x("layer_simple", {}, x, gy)
        var_full = _mean((gx_full - _mean(gx_full)) ** 2)
        assert not torch.allclose(var_full, d_g / denom**2, rtol=1e-6)

    gx = _grad_x("detach", {}, x, gy)  # both detached: a plain division
    torch.testing.assert_close(gx, gy / denom, rtol=1e-12, atol=0)


def test_xu_facts_hold_in_float32():
    x, gy = random_input((16, 4, 512), seed=5, dtype=torch.float32)
    xi = x.clone().requires_grad_(True)
    (gx,) = torch.autograd.grad(create_norm("layer_simple", 512)(xi), xi, gy)
    assert (gx.mean(-1).abs() <= 1e-6 * gx.abs().amax(-1)).all()
    xi = x.clone().requires_grad_(True)
    (gx,) = torch.autograd.grad(create_norm("detach", 512, detach="std")(xi), xi, gy)
    denom = x.double().std(-1) + 1e-5
    torch.testing.assert_close(gx.double().var(-1, unbiased=False), gy.double().var(-1, unbiased=False) / denom**2,
                               rtol=1e-5, atol=0)


# --------------------------------------------------------------------------- padding


def _padded_batch(T=9, B=4, C=32, seed=0):
    x, gy = random_input((T, B, C), seed, torch.float32)
    lengths = torch.tensor([T, 3, 6, 1])[:B]
    pad_mask = torch.arange(T).unsqueeze(0) >= lengths.unsqueeze(1)  # B×T
    return x, gy, pad_mask


@pytest.mark.parametrize("name,opts", CONFIGS, ids=IDS)
def test_pad_mask_is_ignored(name, opts):
    x, gy, pad_mask = _padded_batch()
    norm = make_norm(name, opts, x.shape[-1])
    assert torch.equal(norm(x, pad_mask=pad_mask), norm(x, pad_mask=None))
    assert torch.equal(norm(x, pad_mask), norm(x))


@pytest.mark.parametrize("name,opts", CONFIGS, ids=IDS)
def test_garbage_in_padding_does_not_reach_real_tokens(name, opts):
    x, gy, pad_mask = _padded_batch()
    real = ~pad_mask.t()  # T×B
    norm = make_norm(name, opts, x.shape[-1])
    y0, (gx0, *_) = impl_grads(norm, x, gy)

    garbage = x.clone()
    pads = pad_mask.t().nonzero()
    for i, (t, b) in enumerate(pads.tolist()):
        garbage[t, b] = [1e4 * torch.randn(x.shape[-1]), torch.zeros(x.shape[-1]),
                         torch.full((x.shape[-1],), 7.0), 1e-30 * torch.randn(x.shape[-1])][i % 4]
    gy_garbage = gy.clone()
    gy_garbage[pad_mask.t()] = 1e3
    y1, (gx1, *_) = impl_grads(norm, garbage, gy_garbage)
    torch.testing.assert_close(y1[real], y0[real], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gx1[real], gx0[real], rtol=1e-6, atol=1e-6)
    assert torch.isfinite(y1).all() and torch.isfinite(gx1).all()

    nan = x.clone()
    nan[pad_mask.t()] = float("nan")
    with torch.no_grad():
        y2 = norm(nan, pad_mask)
    torch.testing.assert_close(y2[real], y0[real], rtol=0, atol=0)


# ------------------------------------------------------------------------ edge cases


@pytest.mark.parametrize("name,opts", CONFIGS, ids=IDS)
def test_single_token(name, opts):
    x, gy = random_input((1, 1, 10), seed=11)
    norm = make_norm(name, opts, 10, torch.float64)
    y, grads = impl_grads(norm, x, gy)
    y_ref, grads_ref = ref_grads(name, opts, norm, x, gy)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    for got, want in zip(grads, grads_ref):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name,opts", CONFIGS, ids=IDS)
def test_constant_token_is_finite(name, opts, dtype):
    """All channels of a token equal (also all zero): finite output and gradient."""
    c = 16
    x = torch.randn(4, 2, c, dtype=dtype)
    x[0, 0] = 3.7
    x[1, 1] = 0.0
    x[2, 0] = -1e-3
    x[3, 1] = 0.1
    norm = make_norm(name, opts, c, dtype)
    gy = torch.randn_like(x)
    y, grads = impl_grads(norm, x, gy)
    assert torch.isfinite(y).all()
    assert all(torch.isfinite(g).all() for g in grads)
    const = y[[0, 1, 2, 3], [0, 1, 0, 1]]
    if name in ("layer_simple", "detach", "adanorm"):
        # x − μ is the rounding error of the mean: 0 up to a few ulp of x, divided by s + ε ≈ ε
        ulp = torch.finfo(dtype).eps * 3.7
        assert const.abs().max() <= max(1e-4, 8 * ulp / 1e-5) * opts.get("scale", 1.0)
    if name == "layer":
        torch.testing.assert_close(const, norm.bias.detach().expand_as(const))
    if name == "scale":  # g·x/‖x‖ = ±g/sqrt(C) (0 for the zero token)
        g = norm.g.item()
        torch.testing.assert_close(const[0], torch.full((c,), g / math.sqrt(c), dtype=dtype))
        assert torch.equal(const[1], torch.zeros(c, dtype=dtype))
    if name == "rms":
        w = norm.weight.detach()
        want = w * 3.7 / math.sqrt(3.7**2 + opts.get("eps", 1e-8))
        torch.testing.assert_close(const[0], want.to(dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name,opts", CONFIGS, ids=IDS)
def test_half_precision_input(name, opts, dtype):
    """fp16/bf16 input (float32 parameters) on CPU: finite, dtype kept, close to float32."""
    x32, gy32 = random_input((5, 3, 64), seed=2, dtype=torch.float32)
    x = x32.to(dtype)
    norm = make_norm(name, opts, 64)
    xi = x.clone().requires_grad_(True)
    y = norm(xi)
    assert y.dtype == dtype
    (gx,) = torch.autograd.grad(y, xi, gy32.to(dtype))
    assert gx.dtype == dtype
    assert torch.isfinite(y.float()).all() and torch.isfinite(gx.float()).all()
    y_ref, (gx_ref, *_) = impl_grads(norm, x.float(), gy32.to(dtype).float())
    tol = 1e-2 if dtype is torch.float16 else 3e-2
    torch.testing.assert_close(y.float(), y_ref, rtol=tol, atol=tol * y_ref.abs().max().item())
    torch.testing.assert_close(gx.float(), gx_ref, rtol=tol, atol=tol * gx_ref.abs().max().item())


@pytest.mark.parametrize("name", ["layer", "rms", "scale"])
def test_module_in_bfloat16(name):
    """The whole module cast to bf16 (fairseq's --bf16): finite, bf16 in and out."""
    norm = make_norm(name, {}, 64).to(torch.bfloat16)
    x = (torch.randn(4, 3, 64) * 3).to(torch.bfloat16).requires_grad_(True)
    y = norm(x)
    assert y.dtype == torch.bfloat16 and torch.isfinite(y.float()).all()
    grads = torch.autograd.grad(y.float().square().sum(), [x, *norm.parameters()])
    assert all(g.dtype == torch.bfloat16 and torch.isfinite(g.float()).all() for g in grads)


# --------------------------------------------------------------------- config errors


def test_all_registered():
    assert set(PER_TOKEN) <= set(norm_names())


def test_unknown_name_lists_valid_names():
    with pytest.raises(NormConfigError) as err:
        create_norm("nonexistent", 8)
    msg = str(err.value)
    assert "nonexistent" in msg
    for name in PER_TOKEN:
        assert name in msg


@pytest.mark.parametrize("name", PER_TOKEN)
def test_unknown_option_lists_valid_options(name):
    with pytest.raises(NormConfigError) as err:
        create_norm(name, 8, nonexistent_option=1)
    msg = str(err.value)
    assert "nonexistent_option" in msg
    for opt in norm_options(name):
        assert opt in msg


@pytest.mark.parametrize(
    "name,opts,needles",
    [
        ("detach", {"detach": "neither"}, ["neither", "mean", "std", "both"]),
        ("detach", {"detach": "MEAN"}, ["MEAN", "mean", "std", "both"]),
        ("adanorm", {"k": -0.1}, ["k", "-0.1"]),
        ("adanorm", {"scale": 0.0}, ["scale", "0.0"]),
        ("adanorm", {"scale": -2}, ["scale", "-2"]),
        ("layer_simple", {"eps": 0.0}, ["eps"]),
        ("detach", {"eps": -1e-5}, ["eps"]),
        ("adanorm", {"eps": float("nan")}, ["eps"]),
        ("rms", {"eps": 0}, ["eps"]),
        ("scale", {"eps": -1.0}, ["eps"]),
        ("layer", {"eps": 0.0}, ["eps"]),
    ],
)
def test_invalid_option_values(name, opts, needles):
    with pytest.raises(NormConfigError) as err:
        create_norm(name, 8, **opts)
    for needle in needles:
        assert needle in str(err.value)


@pytest.mark.parametrize("name", ["layer_simple", "detach", "adanorm"])
def test_unbiased_std_needs_two_channels(name):
    with pytest.raises(NormConfigError):
        create_norm(name, 1)


@pytest.mark.parametrize("name,opts", [c for c in CONFIGS if c[0] in ("layer_simple", "detach", "adanorm")],
                         ids=[i for c, i in zip(CONFIGS, IDS) if c[0] in ("layer_simple", "detach", "adanorm")])
def test_tokens_with_tiny_spread(name, opts):
    """Tokens whose std is far below ε (down to 1e-10·ε): the std term of the gradient
    is then small but not zero, and must still match the reference. (Centred at 0:
    around an offset μ ≫ s the output is ill-conditioned, x − μ losing digits, in the
    reference as much as in the implementation.)"""
    c = 12
    gen = torch.Generator().manual_seed(4)
    spread = torch.tensor([1e-4, 1e-6, 1e-8, 1e-10, 1e-12, 1e-15], dtype=torch.float64).view(6, 1, 1)
    x = spread * torch.randn(6, 2, c, generator=gen, dtype=torch.float64)
    gy = torch.randn(6, 2, c, generator=gen, dtype=torch.float64)
    norm = make_norm(name, opts, c, torch.float64)
    y, grads = impl_grads(norm, x, gy)
    y_ref, grads_ref = ref_grads(name, opts, norm, x, gy)
    torch.testing.assert_close(y, y_ref, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(grads[0], grads_ref[0], rtol=1e-9, atol=1e-9 * grads_ref[0].abs().max().item())


@pytest.mark.parametrize("name,opts", CONFIGS, ids=IDS)
def test_empty_and_non_contiguous_input(name, opts):
    norm = make_norm(name, opts, 8)
    for shape in [(0, 2, 8), (3, 0, 8)]:
        x = torch.randn(shape, requires_grad=True)
        y = norm(x)
        assert y.shape == shape
        y.sum().backward()
    # a transposed (non-contiguous) input gives what its contiguous copy gives
    x, gy = random_input((8, 5, 3), seed=9, dtype=torch.float32)
    x = x.transpose(0, 2)
    gy = gy.transpose(0, 2)
    assert not x.is_contiguous()
    y, grads = impl_grads(norm, x, gy)
    y_c, grads_c = impl_grads(norm, x.contiguous(), gy.contiguous())
    torch.testing.assert_close(y, y_c)
    for got, want in zip(grads, grads_c):
        torch.testing.assert_close(got, want)
