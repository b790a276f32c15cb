"""Masked BatchNorm (``batch``) against float64 references written from the equations of Wang, Wu & Huang 2022.

Conventions of the references below: x is T×B×C, pad is B×T (True = padding),
token (t, b) is real iff not pad[b, t]. Statistics are over real tokens only:
μ_B = Σ m x / n, σ²_B = Σ m x² / n − μ_B² (biased).
"""
import math
import os
import tempfile

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from normplug.norms import NormConfigError, create_norm, norm_names
from normplug.norms.batch import MaskedBatchNorm

EPS = 1e-5
HYP = settings(max_examples=25, deadline=None)


# --------------------------------------------------------------------------- references
def real_of(pad):
    """T×B bool, True at real tokens."""
    return ~pad.t()


def ref_stats(x, pad):
    """μ_B, σ²_B over real tokens, in float64, as the equations write them."""
    x = x.double()
    m = real_of(pad).double().unsqueeze(-1)  # T×B×1
    keep = real_of(pad).unsqueeze(-1).expand_as(x)
    xz = torch.where(keep, x, torch.zeros_like(x))  # garbage never multiplied
    n = m.sum()
    mu = xz.sum((0, 1)) / n
    dev = torch.where(keep, x - mu, torch.zeros_like(x))  # σ² = Σ (x − μ)²/n: E[x²] − μ² cancels
    var = (dev * dev).sum((0, 1)) / n
    return mu, var


def ref_normalize(x, pad, mu, var, w=None, b=None, eps=EPS):
    """γ ⊙ (x − μ)/sqrt(σ² + ε) + β at real tokens; 0 at padding."""
    keep = real_of(pad).unsqueeze(-1).expand_as(x)
    xz = torch.where(keep, x.double(), torch.zeros_like(x, dtype=torch.float64))
    y = (xz - mu) / torch.sqrt(var + eps)
    if w is not None:
        y = y * w.double() + b.double()
    return torch.where(keep, y, torch.zeros_like(y))


def ref_rbn(mu_b, var_b, mu_hat, var_hat):
    return ((mu_hat - mu_b) ** 2).sum(), (var_hat - var_b).abs().sum()


def ref_tid(mu_b, var_b, mu_hat, var_hat):
    sigma_b = var_b.sqrt()
    return (
        ((mu_hat - mu_b).abs() / sigma_b).mean(),
        (var_hat.sqrt() / sigma_b - 1).abs().mean(),
    )


def fill_pad(x, pad, value):
    """x with every padded position set to ``value`` (garbage)."""
    keep = real_of(pad).unsqueeze(-1).expand_as(x)
    return torch.where(keep, x, torch.full_like(x, value))


def make_norm(C, dtype=torch.float64, seed=0, **opts):
    norm = create_norm("batch", C, **opts)
    if norm.weight is not None:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            norm.weight.copy_(torch.randn(C, generator=g) * 0.5 + 1)
            norm.bias.copy_(torch.randn(C, generator=g) * 0.5)
    return norm.to(dtype)


@st.composite
def batches(draw, min_real=1, max_t=7, max_b=5, max_c=6):
    """(x, pad): random shape, random per-sequence lengths, left or right padding."""
    T = draw(st.integers(1, max_t))
    B = draw(st.integers(1, max_b))
    C = draw(st.integers(1, max_c))
    lens = draw(st.lists(st.integers(0, T), min_size=B, max_size=B))
    left = draw(st.booleans())
    pad = torch.zeros(B, T, dtype=torch.bool)
    for i, L in enumerate(lens):
        if left:
            pad[i, : T - L] = True
        else:
            pad[i, L:] = True
    if int((~pad).sum()) < min_real:
        pad[0, 0] = False
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    scale = draw(st.sampled_from([0.1, 1.0, 30.0]))
    shift = draw(st.sampled_from([0.0, 5.0]))
    x = torch.randn(T, B, C, generator=g, dtype=torch.float64) * scale + shift
    return x, pad


# --------------------------------------------------------------------------- registry / options
def test_registered_with_paper_docstring():
    assert "batch" in norm_names()
    norm = create_norm("batch", 4)
    assert isinstance(norm, MaskedBatchNorm) and norm.supports_rbn
    doc = MaskedBatchNorm.__doc__.splitlines()[0]
    assert "Wang" in doc and "Ioffe" in doc
    assert norm.running_mean.tolist() == [0.0] * 4
    assert norm.running_var.tolist() == [1.0] * 4
    assert norm.momentum == 0.05 and norm.eps == 1e-5 and norm.test_stats == "population"


@pytest.mark.parametrize(
    "opts, words",
    [
        ({"momentum": 0.0}, ["momentum", "0.0", "(0, 1]"]),
        ({"momentum": 1.5}, ["momentum", "1.5", "(0, 1]"]),
        ({"momentum": -0.1}, ["momentum", "-0.1"]),
        ({"eps": 0.0}, ["eps", "0.0", "> 0"]),
        ({"eps": -1e-5}, ["eps", "-1e-05"]),
        ({"test_stats": "running"}, ["'running'", "population", "batch"]),
        ({"affine": "yes"}, ["affine", "'yes'"]),
        ({"sync_stats": 1}, ["sync_stats"]),
    ],
)
def test_invalid_options(opts, words):
    with pytest.raises(NormConfigError) as err:
        create_norm("batch", 8, **opts)
    for word in words:
        assert word in str(err.value)


def test_valid_edge_options_accepted():
    create_norm("batch", 8, momentum=1.0)
    create_norm("batch", 8, test_stats="batch", affine=False, sync_stats=True, eps=1e-3)


# --------------------------------------------------------------------------- forward
@HYP
@given(batches(), st.booleans())
def test_forward_matches_reference(batch, affine):
    x, pad = batch
    C = x.shape[-1]
    norm = make_norm(C, affine=affine).train()
    y = norm(fill_pad(x, pad, float("nan")), pad)
    mu, var = ref_stats(x, pad)
    w, b = (norm.weight, norm.bias) if affine else (None, None)
    ref = ref_normalize(x, pad, mu, var, w, b)
    torch.testing.assert_close(y, ref.to(y.dtype), rtol=1e-9, atol=1e-9)
    assert (y[real_of(pad).logical_not()] == 0).all()
    # one EMA step from μ̂ = 0, σ̂² = 1 with ρ = 0.05, biased σ²_B
    torch.testing.assert_close(norm.running_mean, 0.05 * mu, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(norm.running_var, 0.95 + 0.05 * var, rtol=1e-9, atol=1e-12)
    assert int(norm.num_batches_tracked) == 1


def test_forward_float32_no_pad_and_pad_paths():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 4, 5, generator=g) * 3 + 1
    pad = torch.zeros(4, 6, dtype=torch.bool)
    pad[1, 4:] = True
    for p in (pad, torch.zeros_like(pad)):
        norm = make_norm(5, dtype=torch.float32).train()
        y = norm(x, p)
        mu, var = ref_stats(x, p)
        ref = ref_normalize(x, p, mu, var, norm.weight, norm.bias)
        torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(norm.running_var.double(), 0.95 + 0.05 * var, rtol=1e-6, atol=1e-6)


def test_no_mask_equals_all_false_mask():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 3, 4, generator=g, requires_grad=True)
    grads = []
    outs = []
    stats = []
    for mask in (None, torch.zeros(3, 5, dtype=torch.bool)):
        norm = make_norm(4, dtype=torch.float32).train()
        x.grad = None
        y = norm(x, mask)
        d = norm.discrepancy()
        (y * torch.arange(y.numel()).view_as(y).sin()).sum().backward()
        outs.append(y.detach())
        grads.append(x.grad.clone())
        stats.append((norm.running_mean.clone(), norm.running_var.clone(), d.rbn_mean.detach()))
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)
    for a, b in zip(*stats):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_single_real_token_is_finite():
    x = torch.randn(3, 2, 4, dtype=torch.float64, requires_grad=True)
    pad = torch.ones(2, 3, dtype=torch.bool)
    pad[1, 2] = False
    norm = make_norm(4).train()
    y = norm(x, pad)
    assert torch.isfinite(y).all()
    # x − μ_B = 0 for the only token: output is β there
    torch.testing.assert_close(y[2, 1], norm.bias.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(norm.running_var, torch.full((4,), 0.95, dtype=torch.float64))
    torch.testing.assert_close(norm.running_mean, 0.05 * x[2, 1].detach())
    y.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_batch_without_real_tokens():
    x = torch.randn(3, 2, 4, requires_grad=True)
    pad = torch.ones(2, 3, dtype=torch.bool)
    norm = make_norm(4, dtype=torch.float32).train()
    y = norm(fill_pad(x, pad, float("nan")), pad)
    assert (y == 0).all()
    assert norm.running_mean.eq(0).all() and norm.running_var.eq(1).all()
    assert int(norm.num_batches_tracked) == 0
    # no host sync decides it away: the discrepancy exists, but nothing reaches x through it
    d = norm.discrepancy()
    (y.sum() + d.rbn_mean + d.rbn_var).backward()
    assert (x.grad == 0).all()
    norm.eval()
    assert (norm(x, pad) == 0).all()


# --------------------------------------------------------------------------- gradients
@HYP
@given(batches(), st.floats(0.0, 2.0), st.floats(0.0, 2.0))
def test_gradients_match_reference(batch, lam_mu, lam_var):
    """Task loss + RBN terms: the norm's gradients equal the float64 reference's,
    whose population statistics are constants."""
    x, pad = batch
    C = x.shape[-1]
    g = torch.Generator().manual_seed(4)
    up = torch.randn(x.shape, generator=g, dtype=torch.float64)

    norm = make_norm(C).train()
    xa = fill_pad(x, pad, 1e30).requires_grad_(True)
    y = norm(xa, pad)
    d = norm.discrepancy()
    loss = (y * up).sum() + lam_mu * d.rbn_mean + lam_var * d.rbn_var
    loss.backward()

    ref_norm = make_norm(C)
    w = ref_norm.weight.detach().clone().requires_grad_(True)
    b = ref_norm.bias.detach().clone().requires_grad_(True)
    xr = x.clone().requires_grad_(True)
    mu, var = ref_stats(xr, pad)
    mu_hat = (0.95 * 0 + 0.05 * mu).detach()
    var_hat = (0.95 * 1 + 0.05 * var).detach()
    yr = ref_normalize(xr, pad, mu, var, w, b)
    rm, rv = ref_rbn(mu, var, mu_hat, var_hat)
    (yr * up).sum().add(lam_mu * rm + lam_var * rv).backward()

    keep = real_of(pad).unsqueeze(-1).expand_as(x)
    torch.testing.assert_close(xa.grad[keep], xr.grad[keep], rtol=1e-7, atol=1e-8)
    assert (xa.grad[~keep] == 0).all()
    torch.testing.assert_close(norm.weight.grad, w.grad, rtol=1e-7, atol=1e-8)
    torch.testing.assert_close(norm.bias.grad, b.grad, rtol=1e-7, atol=1e-8)


def test_rbn_gradient_only_through_batch_stats():
    """If the running statistics were differentiated too, the gradient would differ."""
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(6, 3, 4, generator=g, dtype=torch.float64) * 2 + 1).requires_grad_(True)
    pad = torch.zeros(3, 6, dtype=torch.bool)
    pad[2, 3:] = True
    norm = make_norm(4, momentum=0.3).train()
    norm(x, pad)
    d = norm.discrepancy()
    gm, = torch.autograd.grad(d.rbn_mean, x, retain_graph=True)
    gv, = torch.autograd.grad(d.rbn_var, x)

    def grads(detach):
        xr = x.detach().clone().requires_grad_(True)
        mu, var = ref_stats(xr, pad)
        mu_hat = 0.3 * mu
        var_hat = 0.7 + 0.3 * var
        if detach:
            mu_hat, var_hat = mu_hat.detach(), var_hat.detach()
        rm, rv = ref_rbn(mu, var, mu_hat, var_hat)
        return torch.autograd.grad(rm, xr, retain_graph=True)[0], torch.autograd.grad(rv, xr)[0]

    rm_ok, rv_ok = grads(detach=True)
    rm_bad, rv_bad = grads(detach=False)
    torch.testing.assert_close(gm, rm_ok, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(gv, rv_ok, rtol=1e-9, atol=1e-12)
    assert not torch.allclose(gm, rm_bad) and not torch.allclose(gv, rv_bad)
    assert (gm[3:, 2] == 0).all()  # padded tokens get nothing


# --------------------------------------------------------------------------- padding invariance
@HYP
@given(batches(), st.sampled_from([1e30, -3e38, float("inf"), float("-inf"), float("nan")]),
       st.integers(1, 3))
# one real token (σ² = 0, 1/σ = 316) found by hypothesis: the gradient's cancelling terms
@example(batch=(torch.tensor([[[-0.04867807403206825]]], dtype=torch.float64),
                torch.tensor([[False]])), garbage=1e30, extra=1)
def test_padding_garbage_and_extra_padding(batch, garbage, extra):
    """Filling padded positions with garbage, or appending padded time steps and
    fully padded sequences, leaves outputs, gradients and running statistics at
    real tokens unchanged (float32, as in training)."""
    x, pad = batch
    x = x.float()
    T, B, C = x.shape
    g = torch.Generator().manual_seed(6)
    up = torch.randn(T, B, C, generator=g)

    def run(xin, p, upin):
        norm = make_norm(C, dtype=torch.float32).train()
        xin = xin.clone().requires_grad_(True)
        y = norm(xin, p)
        d = norm.discrepancy()
        ((y * upin).sum() + d.rbn_mean + d.rbn_var).backward()
        return y.detach(), xin.grad, norm.running_mean, norm.running_var

    y0, g0, m0, v0 = run(fill_pad(x, pad, 0.0), pad, up)
    y1, g1, m1, v1 = run(fill_pad(x, pad, garbage), pad, up)

    # bigger batch: `extra` padded steps at the end and one fully padded sequence
    x2 = torch.full((T + extra, B + 1, C), garbage)
    x2[:T, :B] = fill_pad(x, pad, garbage)
    pad2 = torch.ones(B + 1, T + extra, dtype=torch.bool)
    pad2[:B, :T] = pad
    up2 = torch.randn(T + extra, B + 1, C, generator=g)
    up2[:T, :B] = up
    y2, g2, m2, v2 = run(x2, pad2, up2)

    keep = real_of(pad).unsqueeze(-1).expand_as(x)
    # float32 rounding of the fused affine map y = x·(γ/σ) + (β − μγ/σ) grows with |x|/σ
    # (as in torch's own BatchNorm kernels); different kernels may round differently.
    # The padded path's input gradient is k1·g + k2·x + k3 with k3 ∋ −k1·Σg/n: terms of
    # size |γ|/σ·|g| cancel (one real token, σ² = 0: 316·|g| each, ulps of 3e-5), where
    # torch's unpadded kernel subtracts the mean of g first.
    mu, var = ref_stats(x, pad)
    invstd = (var + EPS).rsqrt()
    ratio = float((x.double()[keep].view(-1, C).abs() * invstd).max()) + 1.0
    cancel = float((invstd * make_norm(C).weight.detach().abs()).max()) * float(up.abs().max())
    tol_y = 1e-6 * ratio * 3
    tol_g = 1e-6 * (ratio * (float(g0.abs().max()) + 1.0) + cancel) * 3
    for y, gr, m, v in ((y1, g1, m1, v1), (y2[:T, :B], g2[:T, :B], m2, v2)):
        torch.testing.assert_close(y[keep], y0[keep], rtol=1e-5, atol=tol_y)
        torch.testing.assert_close(gr[keep], g0[keep], rtol=1e-4, atol=tol_g)
        torch.testing.assert_close(m, m0, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(v, v0, rtol=1e-5, atol=1e-6)
    for y, gr, p in ((y1, g1, pad), (y2, g2, pad2)):
        padded = (~real_of(p)).unsqueeze(-1).expand_as(y)
        assert torch.isfinite(y).all() and torch.isfinite(gr).all()
        assert (y[padded] == 0).all() and (gr[padded] == 0).all()


# --------------------------------------------------------------------------- running statistics
@pytest.mark.parametrize("rho", [0.05, 0.3])
def test_running_stats_closed_form_ema(rho):
    g = torch.Generator().manual_seed(7)
    C, k = 5, 6
    norm = make_norm(C, momentum=rho).train()
    batch_stats = []
    for step in range(k):
        T, B = 3 + step, 2 + step % 3
        x = torch.randn(T, B, C, generator=g, dtype=torch.float64) * (1 + step) + step
        pad = torch.rand(B, T, generator=g) < 0.3
        pad[0, 0] = False
        norm(fill_pad(x, pad, float("nan")), pad)
        batch_stats.append(ref_stats(x, pad))
    # μ̂_k = (1−ρ)^k μ̂_0 + Σ_j ρ (1−ρ)^{k−j} μ_j, with μ̂_0 = 0 and σ̂²_0 = 1
    mu_k = sum(rho * (1 - rho) ** (k - j) * mu for j, (mu, _) in enumerate(batch_stats, 1))
    var_k = (1 - rho) ** k + sum(
        rho * (1 - rho) ** (k - j) * var for j, (_, var) in enumerate(batch_stats, 1)
    )
    torch.testing.assert_close(norm.running_mean, mu_k, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(norm.running_var, var_k, rtol=1e-10, atol=1e-12)
    assert int(norm.num_batches_tracked) == k


def _trained_norm(C=4, steps=3, **opts):
    g = torch.Generator().manual_seed(8)
    norm = make_norm(C, **opts).train()
    for _ in range(steps):
        norm(torch.randn(5, 3, C, generator=g, dtype=torch.float64) * 2 + 3)
    return norm


def test_state_dict_round_trip_and_eval_uses_population():
    norm = _trained_norm()
    sd = norm.state_dict()
    assert {"running_mean", "running_var", "num_batches_tracked", "weight", "bias"} <= set(sd)
    fresh = make_norm(4, seed=99)
    fresh.load_state_dict(sd)
    for name in ("running_mean", "running_var", "weight", "bias", "num_batches_tracked"):
        torch.testing.assert_close(getattr(fresh, name), getattr(norm, name), rtol=0, atol=0)
    assert not fresh.running_mean.eq(0).all()

    fresh.eval()
    g = torch.Generator().manual_seed(9)
    x = torch.randn(4, 2, 4, generator=g, dtype=torch.float64)
    pad = torch.zeros(2, 4, dtype=torch.bool)
    pad[0, 2:] = True
    before = fresh.running_mean.clone(), fresh.running_var.clone()
    y = fresh(fill_pad(x, pad, float("inf")), pad)
    ref = ref_normalize(x, pad, norm.running_mean, norm.running_var, norm.weight, norm.bias)
    torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(fresh.running_mean, before[0], rtol=0, atol=0)
    torch.testing.assert_close(fresh.running_var, before[1], rtol=0, atol=0)
    assert fresh.discrepancy() is None
    assert fresh.uses_batch_stats_in_eval is False
    # eval output does not depend on the batch: one token alone gives the same value
    y1 = fresh(x[:1, 1:2], None)
    torch.testing.assert_close(y1[0, 0], y[0, 1], rtol=1e-12, atol=1e-12)


def test_eval_with_test_batch_stats():
    norm = _trained_norm(test_stats="batch").eval()
    assert norm.uses_batch_stats_in_eval is True
    before = norm.running_mean.clone(), norm.running_var.clone(), norm.num_batches_tracked.clone()
    g = torch.Generator().manual_seed(10)
    x = torch.randn(4, 3, 4, generator=g, dtype=torch.float64) * 4 - 2
    pad = torch.zeros(3, 4, dtype=torch.bool)
    pad[2, 1:] = True
    y = norm(fill_pad(x, pad, float("nan")), pad)
    mu, var = ref_stats(x, pad)
    ref = ref_normalize(x, pad, mu, var, norm.weight, norm.bias)
    torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-10)
    for a, b in zip(before, (norm.running_mean, norm.running_var, norm.num_batches_tracked)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert norm.discrepancy() is None


# --------------------------------------------------------------------------- RBN / TID
@HYP
@given(batches(min_real=2), st.sampled_from([0.05, 0.5]))
def test_discrepancy_terms_match_formula(batch, rho):
    x, pad = batch
    C = x.shape[-1]
    norm = make_norm(C, momentum=rho).train()
    norm(fill_pad(x, pad, -1e30).requires_grad_(True), pad)
    d = norm.discrepancy()
    assert norm.discrepancy() is None  # handed out once
    mu, var = ref_stats(x, pad)
    mu_hat = rho * mu
    var_hat = (1 - rho) + rho * var
    torch.testing.assert_close(norm.running_mean, mu_hat, rtol=1e-10, atol=1e-12)
    rm, rv = ref_rbn(mu, var, mu_hat, var_hat)
    assert d.rbn_mean.dim() == 0 and d.tid_var.dim() == 0
    assert d.rbn_mean.requires_grad and d.rbn_var.requires_grad
    assert not d.tid_mean.requires_grad and not d.tid_var.requires_grad
    torch.testing.assert_close(d.rbn_mean, rm, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(d.rbn_var, rv, rtol=1e-8, atol=1e-10)
    if (var > 1e-12).all():
        tm, tv = ref_tid(mu, var, mu_hat, var_hat)
        torch.testing.assert_close(d.tid_mean, tm, rtol=1e-6, atol=1e-9)
        torch.testing.assert_close(d.tid_var, tv, rtol=1e-6, atol=1e-9)


def test_discrepancy_zero_when_stats_agree():
    g = torch.Generator().manual_seed(11)
    norm = make_norm(3, momentum=1.0).train()  # population stats become this batch's
    x = torch.randn(4, 2, 3, generator=g, dtype=torch.float64) * 3 + 2
    norm(x)
    d = norm.discrepancy()
    for v in d:
        assert abs(float(v.detach())) < 1e-12
    # and with ρ < 1 they are not zero
    norm = make_norm(3, momentum=0.5).train()
    norm(x)
    assert all(float(v.detach()) > 1e-3 for v in norm.discrepancy())


def test_tid_and_rbn_on_hand_built_batch():
    # T=2, B=2, C=2; token (t=1, b=1) is padding and holds garbage.
    # Real tokens: channel 0: 1, 2, 3 → μ_B = 2, σ²_B = 2/3; channel 1: 0, 2, 4 → μ_B = 2, σ²_B = 8/3
    x = torch.tensor(
        [[[1.0, 0.0], [2.0, 2.0]],
         [[3.0, 4.0], [float("nan"), 1e30]]], dtype=torch.float64
    )
    pad = torch.tensor([[False, False], [False, True]])  # B×T
    # ρ = 0.5 from μ̂ = 0, σ̂² = 1: μ̂ = (1, 1), σ̂² = (5/6, 11/6)
    norm = make_norm(2, momentum=0.5).train()
    norm(x, pad)
    d = norm.discrepancy()
    f64 = torch.float64
    var_hat = torch.tensor([0.5 + 1 / 3, 0.5 + 4 / 3], dtype=f64)
    sigma = torch.tensor([math.sqrt(2 / 3), math.sqrt(8 / 3)], dtype=f64)
    tid_mean = (1 / sigma).mean()
    tid_var = (var_hat.sqrt() / sigma - 1).abs().mean()
    assert float(d.tid_mean) == pytest.approx(float(tid_mean), rel=1e-12)
    assert float(d.tid_var) == pytest.approx(float(tid_var), rel=1e-12)
    assert float(d.rbn_mean.detach()) == pytest.approx(2.0, rel=1e-12)  # (1 − 2)² twice
    assert float(d.rbn_var.detach()) == pytest.approx(abs(5 / 6 - 2 / 3) + abs(11 / 6 - 8 / 3), rel=1e-12)


# --------------------------------------------------------------------------- low precision
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_input(dtype):
    g = torch.Generator().manual_seed(12)
    x = (torch.randn(8, 6, 16, generator=g) * 4 + 20).to(dtype)
    pad = torch.rand(6, 8, generator=g) < 0.3
    pad[0, 0] = False
    xg = fill_pad(x, pad, float("nan")).requires_grad_(True)
    norm = make_norm(16, dtype=torch.float32).train()
    y = norm(xg, pad)
    assert y.dtype == dtype and torch.isfinite(y).all()
    y.float().sum().backward()
    assert xg.grad.dtype == dtype and torch.isfinite(xg.grad).all()
    # statistics are computed in float32 from the (exact) low-precision values
    mu, var = ref_stats(x.double(), pad)
    torch.testing.assert_close(norm.running_mean.double(), 0.05 * mu, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(norm.running_var.double(), 0.95 + 0.05 * var, rtol=1e-5, atol=1e-5)
    ref = ref_normalize(x.double(), pad, mu, var, norm.weight, norm.bias)
    keep = real_of(pad).unsqueeze(-1).expand_as(y)
    tol = 2e-2 if dtype == torch.bfloat16 else 3e-3
    torch.testing.assert_close(y.double()[keep], ref[keep], rtol=tol, atol=tol)


# --------------------------------------------------------------------------- sync_stats
def test_sync_stats_without_process_group_is_single_worker():
    g = torch.Generator().manual_seed(13)
    x = torch.randn(5, 3, 4, generator=g)
    pad = torch.zeros(3, 5, dtype=torch.bool)
    pad[1, 2:] = True
    a = make_norm(4, dtype=torch.float32, sync_stats=True).train()
    b = make_norm(4, dtype=torch.float32).train()
    torch.testing.assert_close(a(x, pad), b(x, pad), rtol=0, atol=0)
    torch.testing.assert_close(a.running_var, b.running_var, rtol=0, atol=0)


def _sync_data():
    """Per-scenario, per-rank (x, pad, upstream grad); rank 1 of scenario 1 has no real token."""
    g = torch.Generator().manual_seed(14)
    C = 3
    out = []
    for scenario in range(2):
        ranks = []
        for rank in range(2):
            T, B = 4 + rank, 3 - rank
            x = torch.randn(T, B, C, generator=g, dtype=torch.float64) * (1 + 2 * rank) + rank
            pad = torch.rand(B, T, generator=g) < 0.4
            pad[0, 0] = False
            if scenario == 1 and rank == 1:
                pad[:] = True
            up = torch.randn(T, B, C, generator=g, dtype=torch.float64)
            ranks.append((x, pad, up))
        out.append(ranks)
    return out


def _sync_worker(rank, port, folder):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    try:
        results = []
        for ranks in _sync_data():
            x, pad, up = ranks[rank]
            norm = make_norm(x.shape[-1], sync_stats=True).train()
            xin = fill_pad(x, pad, float("nan")).requires_grad_(True)
            for _ in range(2):  # two steps: running statistics must stay identical
                xin.grad = None
                norm.zero_grad()
                y = norm(xin, pad)
                d = norm.discrepancy()
                ((y * up).sum() + 0.5 * d.rbn_mean + 0.25 * d.rbn_var).backward()
            results.append({
                "y": y.detach(), "grad": xin.grad, "rm": norm.running_mean,
                "rv": norm.running_var, "nbt": norm.num_batches_tracked,
                "wgrad": norm.weight.grad,
            })
        torch.save(results, os.path.join(folder, f"rank{rank}.pt"))
    finally:
        torch.distributed.destroy_process_group()


def test_sync_stats_two_gloo_workers():
    import torch.multiprocessing as mp

    from conftest import free_port

    with tempfile.TemporaryDirectory() as folder:
        # forked workers share this process's imports: spawned ones paid ~3.5 s CPU each
        mp.start_processes(_sync_worker, args=(free_port(), folder), nprocs=2, join=True, start_method="fork")
        res = [torch.load(os.path.join(folder, f"rank{r}.pt")) for r in range(2)]

    for s, ranks in enumerate(_sync_data()):
        # reference: both workers' real tokens as one batch, losses summed over workers
        xs = [x.clone().requires_grad_(True) for x, _, _ in ranks]
        real = [x[real_of(p)] for x, (_, p, _) in zip(xs, ranks)]
        allr = torch.cat(real)
        n = allr.shape[0]
        mu = allr.sum(0) / n
        var = (allr * allr).sum(0) / n - mu * mu
        # population statistics after two identical steps (the gradients are the second step's)
        mu_hat2 = 0.95 * (0.05 * mu.detach()) + 0.05 * mu.detach()
        var_hat2 = 0.95 * (0.95 + 0.05 * var.detach()) + 0.05 * var.detach()
        norm = make_norm(xs[0].shape[-1])
        loss = 0
        for x, (_, p, up) in zip(xs, ranks):
            loss = loss + (ref_normalize(x, p, mu, var, norm.weight, norm.bias) * up).sum()
        rm, rv = ref_rbn(mu, var, mu_hat2, var_hat2)
        loss = loss + 2 * (0.5 * rm + 0.25 * rv)  # each worker adds its own penalty
        loss.backward()
        for r in range(2):
            out = res[r][s]
            _, p, _ = ranks[r]
            ref_y = ref_normalize(ranks[r][0], p, mu.detach(), var.detach(), norm.weight, norm.bias)
            torch.testing.assert_close(out["y"], ref_y.detach(), rtol=1e-9, atol=1e-9)
            torch.testing.assert_close(out["rm"], mu_hat2, rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(out["rv"], var_hat2, rtol=1e-10, atol=1e-12)
            assert int(out["nbt"]) == 2
            keep = real_of(p).unsqueeze(-1).expand_as(out["grad"])
            torch.testing.assert_close(out["grad"][keep], xs[r].grad[keep], rtol=1e-7, atol=1e-9)
            assert (out["grad"][~keep] == 0).all()
        torch.testing.assert_close(res[0][s]["rm"], res[1][s]["rm"], rtol=0, atol=0)
        torch.testing.assert_close(res[0][s]["rv"], res[1][s]["rv"], rtol=0, atol=0)
        # the worker without real tokens gets no weight gradient from its own loss
        if s == 1:
            assert (res[1][s]["wgrad"] == 0).all()


def test_copy_after_training_step_and_bad_mask_shape():
    import copy

    norm = make_norm(4, dtype=torch.float32).train()
    x = torch.randn(3, 2, 4, requires_grad=True)
    norm(x)
    clone = copy.deepcopy(norm)  # the saved statistics (with graph) are not copied
    assert clone.discrepancy() is None and norm.discrepancy() is not None
    torch.testing.assert_close(clone.running_mean, norm.running_mean, rtol=0, atol=0)
    with pytest.raises(ValueError, match="B×T"):
        norm(x, torch.zeros(3, 2, dtype=torch.bool))
