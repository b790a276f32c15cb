"""PowerNorm against a float64 transcription of the released code.

The reference below never calls normplug. It transcribes ``PowerFunction`` and
``MaskPowerNorm`` of sIncerass/powernorm (commit 9ea6226,
fairseq/modules/norms/mask_powernorm.py, lines 17-180): group scaling, σ²_B over the
real tokens, the forward with σ²_B while t <= T_w and the previous ψ² after, the ψ²
update (a cumulative-mean step while t < T_w, then the EMA step on every training
forward, no else) and the approximate backward with ν. The release counts training
forwards from t = 1; normplug counts updates, t = updates done + 1 (one forward per
update). One deliberate difference is transcribed as normplug's: ν is averaged over
the real tokens (the release averages over every position, padding included).
"""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from normplug.norms import BatchStatNorm, Discrepancy, NormConfigError, create_norm, norm_options
from normplug.norms.power import PowerNorm

EPS = 1e-5
GROUP_EPS = 1e-5
F64 = torch.float64

SETTINGS = settings(max_examples=25, deadline=None)


# --------------------------------------------------------------------------- #
# references (float64)
# --------------------------------------------------------------------------- #


def ref_group_scale(x, groups):
    """Group scaling on n×C: each token's group over sqrt(mean of squares + 1e-5)."""
    n, c = x.shape
    d = c // groups
    out = []
    for g in range(groups):
        part = x[:, g * d:(g + 1) * d]
        out.append(part / torch.sqrt((part ** 2).mean(dim=1, keepdim=True) + GROUP_EPS))
    return torch.cat(out, dim=1)


def real_rows(x, pad):
    """Real tokens of x (T×B×C) as n×C, row order (t, b) t-major; pad is B×T."""
    keep = ~pad.t()
    return x[keep]


class RefPowerNorm:
    """The released PowerNorm, one training step at a time, in float64."""

    def __init__(self, c, groups, warmup, alpha_fwd=0.9, alpha_bkw=0.9, gamma=None, beta=None):
        self.groups = groups
        self.warmup = warmup
        self.af = alpha_fwd
        self.ab = alpha_bkw
        self.gamma = torch.ones(c, dtype=F64) if gamma is None else gamma.clone().to(F64)
        self.beta = torch.zeros(c, dtype=F64) if beta is None else beta.clone().to(F64)
        self.psi2 = torch.ones(c, dtype=F64)  # running_phi
        self.nu = torch.zeros(c, dtype=F64)  # ema_gz

    def train_step(self, xr, num_updates, gy):
        """xr: n×C real tokens; gy: ∂L/∂y at those tokens. Returns y, ∂L/∂x, ∂L/∂γ, ∂L/∂β."""
        t = num_updates + 1  # current_iter
        x = xr.detach().to(F64).requires_grad_(True)
        z = ref_group_scale(x, self.groups)
        zd = z.detach()
        var = (zd ** 2).mean(0)  # x2 = (mask_x * mask_x).mean(dim=0)
        if t <= self.warmup:
            xhat = zd / (var + EPS).sqrt()
        else:
            xhat = zd / (self.psi2 + EPS).sqrt()
        if t < self.warmup:
            self.psi2 = self.psi2 * (t - 1) / t + var / t
        self.psi2 = self.af * self.psi2 + (1 - self.af) * var
        y = self.gamma * xhat + self.beta
        gy = gy.to(F64)
        g = gy * self.gamma
        approx_grad_g = g - (1 - self.ab) * self.nu * xhat
        self.nu = self.nu + (approx_grad_g * xhat).mean(0)
        dz = approx_grad_g / torch.sqrt(var + EPS)
        (dx,) = torch.autograd.grad(z, x, dz)  # through the group scaling (autograd in the release too)
        self.last_sigma2 = var
        return y, dx, (gy * xhat).sum(0), gy.sum(0)

    def eval_forward(self, xr):
        z = ref_group_scale(xr.to(F64), self.groups)
        return self.gamma * z / torch.sqrt(self.psi2 + EPS) + self.beta


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #


def make_pad(lengths, T):
    """B×T mask, True at padding, from per-sentence lengths."""
    return torch.arange(T)[None, :] >= torch.tensor(lengths)[:, None]


def norm_f64(c, groups, warmup, seed=0, **kw):
    pn = PowerNorm(c, groups=groups, warmup_updates=warmup, **kw).double()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        if pn.affine:
            pn.weight.copy_(1 + 0.5 * torch.randn(c, generator=gen, dtype=F64))
            pn.bias.copy_(0.5 * torch.randn(c, generator=gen, dtype=F64))
    return pn


def run_step(pn, x, pad, gy, num_updates):
    """One training forward/backward of the module; returns y, x.grad, γ.grad, β.grad."""
    pn.train()
    pn.set_num_updates(num_updates)
    x = x.clone().requires_grad_(True)
    for p in pn.parameters():
        p.grad = None
    y = pn(x, pad)
    y.backward(gy)
    return y.detach(), x.grad, pn.weight.grad, pn.bias.grad


shapes = st.tuples(
    st.integers(1, 5),  # T
    st.integers(1, 4),  # B
    st.sampled_from([1, 2, 4]),  # groups
    st.integers(1, 3),  # channels per group
    st.integers(0, 2 ** 31 - 1),  # seed
)


def draw_batch(T, B, C, seed, min_real=1):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, T + 1, (B,), generator=gen).tolist()
    if sum(lengths) < min_real:
        lengths[0] = T
    pad = make_pad(lengths, T)
    x = 2.0 * torch.randn(T, B, C, generator=gen, dtype=F64) + 0.3
    return x, pad, gen


# --------------------------------------------------------------------------- #
# forward
# --------------------------------------------------------------------------- #


@SETTINGS
@given(shapes)
def test_training_steps_match_reference(shape):
    """Forward, ∂L/∂x, ∂L/∂γ, ∂L/∂β, ψ² and ν over steps that cross the warm-up."""
    T, B, G, D, seed = shape
    C = G * D
    warmup = 2
    pn = norm_f64(C, G, warmup, seed)
    ref = RefPowerNorm(C, G, warmup, gamma=pn.weight.detach(), beta=pn.bias.detach())
    for step in range(5):  # updates 0, 1 in warm-up; 2, 3, 4 after
        x, pad, gen = draw_batch(T, B, C, seed + step)
        gy = torch.randn(T, B, C, generator=gen, dtype=F64)
        y, dx, dw, db = run_step(pn, x, pad, gy, step)
        keep = ~pad.t()
        ry, rdx, rdw, rdb = ref.train_step(x[keep], step, gy[keep])
        torch.testing.assert_close(y[keep], ry, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(dx[keep], rdx, rtol=1e-8, atol=1e-9)
        torch.testing.assert_close(dw, rdw, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(db, rdb, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(pn.running_psi2, ref.psi2, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(pn.nu, ref.nu, rtol=1e-9, atol=1e-10)
        # padding: zero output, zero gradient
        assert torch.all(y[~keep] == 0)
        assert torch.all(dx[~keep] == 0)


def test_float32_module_matches_float64_reference():
    T, B, G, C = 6, 5, 4, 16
    pn = PowerNorm(C, groups=G, warmup_updates=1)
    ref = RefPowerNorm(C, G, 1)
    gen = torch.Generator().manual_seed(3)
    for step in range(3):
        x = torch.randn(T, B, C, generator=gen) * 3
        pad = make_pad([6, 2, 4, 1, 5], T)
        gy = torch.randn(T, B, C, generator=gen)
        y, dx, dw, db = run_step(pn, x, pad, gy, step)
        keep = ~pad.t()
        ry, rdx, rdw, rdb = ref.train_step(x[keep], step, gy[keep])
        assert y.dtype == torch.float32
        torch.testing.assert_close(y[keep].double(), ry, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(dx[keep].double(), rdx, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(dw.double(), rdw, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(pn.nu.double(), ref.nu, rtol=1e-4, atol=1e-6)


@SETTINGS
@given(st.integers(1, 6), st.integers(0, 6), st.floats(0.0, 0.99), st.integers(0, 2 ** 31 - 1))
def test_running_psi2_follows_the_released_rule(k_warm, k_ema, alpha, seed):
    """ψ² over steps that cross the warm-up, against the release's lines 67-69 (float64, 1e-12)."""
    C, G = 6, 3
    pn = PowerNorm(C, groups=G, warmup_updates=k_warm, alpha_fwd=alpha).double()
    gen = torch.Generator().manual_seed(seed)
    psi2 = torch.ones(C, dtype=F64)
    for step in range(k_warm + k_ema):
        T, B = 1 + step % 3, 2
        x = torch.randn(T, B, C, generator=gen, dtype=F64) * (1 + step)
        pn.set_num_updates(step)
        y = pn(x)
        z = ref_group_scale(x.reshape(-1, C), G)
        var = (z ** 2).mean(0)
        t = step + 1
        used = var if t <= k_warm else psi2  # the forward reads ψ² before this step's update
        torch.testing.assert_close(y.reshape(-1, C), z / torch.sqrt(used + EPS), rtol=1e-12, atol=1e-12)
        if t < k_warm:
            psi2 = psi2 * (t - 1) / t + var / t
        psi2 = alpha * psi2 + (1 - alpha) * var
        torch.testing.assert_close(pn.running_psi2, psi2, rtol=1e-12, atol=1e-12)


def test_released_rule_by_hand():
    """T_w = 3: t = 1 takes σ²_1 (cumulative step, then an EMA of σ²_1 with itself); t = 2
    averages, then the EMA; t = 3 only the EMA. A plain cumulative mean over warm-up gives
    another ψ² at the end of warm-up, and the forward after it differs."""
    pn = PowerNorm(2, warmup_updates=3, affine=False).double()
    sig = []
    for step, (a, b) in enumerate([(1.0, 3.0), (2.0, 0.5), (1.0, 1.0)]):
        pn.set_num_updates(step)
        x = torch.tensor([[[a, b]]], dtype=F64)
        pn(x)
        z = x / torch.sqrt((x ** 2).mean() + GROUP_EPS)
        sig.append((z ** 2).reshape(2))
    psi = sig[0]  # t = 1: cumulative step gives σ²_1, the EMA of σ²_1 with itself keeps it
    psi = 0.9 * (psi / 2 + sig[1] / 2) + 0.1 * sig[1]  # t = 2
    psi = 0.9 * psi + 0.1 * sig[2]  # t = 3: no cumulative step (3 < 3 is false)
    torch.testing.assert_close(pn.running_psi2, psi, rtol=1e-12, atol=1e-15)
    plain_mean = torch.stack(sig).mean(0)
    assert (pn.running_psi2 - plain_mean).abs().max() > 1e-3


def test_no_warmup_starts_ema_from_one():
    C = 4
    pn = PowerNorm(C, warmup_updates=0).double()
    x = torch.randn(3, 2, C, dtype=F64, generator=torch.Generator().manual_seed(1))
    y = pn(x)
    z = ref_group_scale(x.reshape(-1, C), 1)
    torch.testing.assert_close(y.reshape(-1, C), z / math.sqrt(1 + EPS))
    torch.testing.assert_close(pn.running_psi2, 0.9 + 0.1 * (z ** 2).mean(0))


# --------------------------------------------------------------------------- #
# group scaling
# --------------------------------------------------------------------------- #


@SETTINGS
@given(shapes)
def test_group_scaling_is_per_token_per_group(shape):
    """Rescaling one token's group leaves every output unchanged (up to the 1e-5)."""
    T, B, G, D, seed = shape
    C = G * D
    x, _, gen = draw_batch(T, B, C, seed)
    x = x + torch.sign(x) * 0.5  # keep every group's RMS well above sqrt(1e-5)
    t = int(torch.randint(0, T, (1,), generator=gen))
    b = int(torch.randint(0, B, (1,), generator=gen))
    g = int(torch.randint(0, G, (1,), generator=gen))
    x2 = x.clone()
    x2[t, b, g * D:(g + 1) * D] *= 7.0
    pn = norm_f64(C, G, warmup=5, seed=seed)
    y1 = pn(x)
    y2 = pn(x2)
    torch.testing.assert_close(y1, y2, rtol=1e-4, atol=1e-4)


def test_groups_change_the_result():
    """groups=2 scales the halves separately, groups=1 scales the whole token."""
    x = torch.tensor([[[1.0, 1.0, 10.0, 10.0]], [[2.0, 2.0, 1.0, 1.0]]], dtype=F64)
    y1 = PowerNorm(4, groups=1, affine=False).double().eval()(x)
    y2 = PowerNorm(4, groups=2, affine=False).double().eval()(x)
    torch.testing.assert_close(y1.reshape(2, 4), ref_group_scale(x.reshape(2, 4), 1) / math.sqrt(1 + EPS))
    torch.testing.assert_close(y2.reshape(2, 4), ref_group_scale(x.reshape(2, 4), 2) / math.sqrt(1 + EPS))
    assert not torch.allclose(y1, y2)


def test_group_scaling_gradient_is_exact():
    """With α_b = 1 (no ν term) and the batch statistic fixed, ∂L/∂x is the true
    gradient of y = γ·gs(x)/sqrt(σ²_B+ε)+β with σ²_B treated as a constant."""
    T, B, C, G = 3, 2, 6, 3
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(T, B, C, generator=gen, dtype=F64)
    gy = torch.randn(T, B, C, generator=gen, dtype=F64)
    pn = norm_f64(C, G, warmup=5, seed=2, alpha_bkw=1.0)
    _, dx, _, _ = run_step(pn, x, None, gy, 0)
    xr = x.reshape(-1, C).clone().requires_grad_(True)
    z = ref_group_scale(xr, G)
    sigma2 = (z.detach() ** 2).mean(0)
    y = pn.weight.detach() * z / torch.sqrt(sigma2 + EPS) + pn.bias.detach()
    y.backward(gy.reshape(-1, C))
    torch.testing.assert_close(dx.reshape(-1, C), xr.grad, rtol=1e-9, atol=1e-10)


def test_groups_must_divide_dim():
    with pytest.raises(NormConfigError) as err:
        PowerNorm(10, groups=4)
    assert "10" in str(err.value) and "4" in str(err.value)
    with pytest.raises(NormConfigError) as err:
        create_norm("power", 512, groups=3)
    assert "512" in str(err.value) and "3" in str(err.value)
    assert PowerNorm(12, groups=4).groups == 4


# --------------------------------------------------------------------------- #
# padding
# --------------------------------------------------------------------------- #


@SETTINGS
@given(shapes, st.sampled_from([float("nan"), 1e30, float("inf"), -3e38]))
def test_padding_garbage_never_leaks(shape, garbage):
    """Garbage at padding changes nothing real: outputs, gradients, ψ², ν, discrepancy."""
    T, B, G, D, seed = shape
    C = G * D
    clean = norm_f64(C, G, warmup=2, seed=seed)
    dirty = norm_f64(C, G, warmup=2, seed=seed)
    packed = norm_f64(C, G, warmup=2, seed=seed)
    for step in range(3):
        x, pad, gen = draw_batch(T, B, C, seed + 11 * step)
        gy = torch.randn(T, B, C, generator=gen, dtype=F64)
        keep = ~pad.t()
        x_dirty = x.clone()
        x_dirty[~keep] = garbage
        gy_dirty = gy.clone()
        gy_dirty[~keep] = garbage  # gradients arriving at padding are ignored too
        y1, dx1, dw1, db1 = run_step(clean, x, pad, gy, step)
        y2, dx2, dw2, db2 = run_step(dirty, x_dirty, pad, gy_dirty, step)
        # the same real tokens with no padding at all, as one sentence of n tokens
        xr = x[keep].unsqueeze(1)
        y3, dx3, dw3, db3 = run_step(packed, xr, None, gy[keep].unsqueeze(1), step)
        assert torch.equal(y1[keep], y2[keep])
        assert torch.equal(dx1[keep], dx2[keep])
        assert torch.all(y2[~keep] == 0) and torch.all(dx2[~keep] == 0)
        assert torch.equal(dw1, dw2) and torch.equal(db1, db2)
        torch.testing.assert_close(y1[keep], y3[:, 0], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(dx1[keep], dx3[:, 0], rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(dw1, dw3, rtol=1e-10, atol=1e-10)
        d1, d2 = clean.discrepancy(), dirty.discrepancy()
        for a, b in zip(d1, d2):
            assert torch.equal(a, b)
            assert torch.isfinite(a)
    for buf in ("running_psi2", "nu"):
        assert torch.equal(getattr(clean, buf), getattr(dirty, buf))
        torch.testing.assert_close(getattr(clean, buf), getattr(packed, buf), rtol=1e-10, atol=1e-12)


def test_padding_mask_shape_is_checked():
    pn = PowerNorm(4)
    with pytest.raises(ValueError, match="B×T"):
        pn(torch.randn(3, 2, 4), torch.zeros(3, 2, dtype=torch.bool))


# --------------------------------------------------------------------------- #
# warm-up counted in updates
# --------------------------------------------------------------------------- #


def test_warmup_counts_updates_not_forward_calls():
    C = 4
    gen = torch.Generator().manual_seed(5)
    pn = PowerNorm(C, warmup_updates=2).double()
    batches = [torch.randn(3, 2, C, generator=gen, dtype=F64) * (i + 1) for i in range(5)]

    def batch_normalised(x):
        z = ref_group_scale(x.reshape(-1, C), 1)
        return (z / torch.sqrt((z ** 2).mean(0) + EPS)).reshape(x.shape)

    pn.set_num_updates(1)  # one update done: still in warm-up ...
    for x in batches[:3]:  # ... however many forwards run
        torch.testing.assert_close(pn(x), batch_normalised(x))
    pn.set_num_updates(2)  # warm-up over: ψ² from now on
    psi_prev = pn.running_psi2.clone()
    y = pn(batches[3])
    z = ref_group_scale(batches[3].reshape(-1, C), 1)
    torch.testing.assert_close(y.reshape(-1, C), z / torch.sqrt(psi_prev + EPS))
    assert not torch.allclose(y, batch_normalised(batches[3]))

    # a module nobody tells about updates stays in warm-up however often it runs
    lazy = PowerNorm(C, warmup_updates=2).double()
    for x in batches:
        torch.testing.assert_close(lazy(x), batch_normalised(x))
    assert lazy.num_updates.item() == 0


# --------------------------------------------------------------------------- #
# state, eval, discrepancy
# --------------------------------------------------------------------------- #


def test_state_dict_round_trip():
    C, G = 8, 2
    gen = torch.Generator().manual_seed(9)
    pn = norm_f64(C, G, warmup=2, seed=4)
    for step in range(4):
        x = torch.randn(4, 3, C, generator=gen, dtype=F64)
        run_step(pn, x, None, torch.randn(4, 3, C, generator=gen, dtype=F64), step)
    pn.set_num_updates(4)
    state = pn.state_dict()
    for key in ("running_psi2", "nu", "num_updates", "weight", "bias"):
        assert key in state
    fresh = PowerNorm(C, groups=G, warmup_updates=2).double()
    assert not torch.equal(fresh.nu, pn.nu)
    fresh.load_state_dict(state)
    assert fresh.num_updates.item() == 4
    for key, value in pn.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key
    # and both continue identically (after warm-up, using the restored ψ² and ν)
    x = torch.randn(4, 3, C, generator=gen, dtype=F64)
    gy = torch.randn(4, 3, C, generator=gen, dtype=F64)
    a = run_step(pn, x, None, gy, 4)
    b = run_step(fresh, x, None, gy, 4)
    for u, v in zip(a, b):
        assert torch.equal(u, v)
    assert torch.equal(pn.nu, fresh.nu) and torch.equal(pn.running_psi2, fresh.running_psi2)


def test_eval_uses_psi2_and_changes_nothing():
    C, G = 6, 2
    pn = norm_f64(C, G, warmup=1, seed=5)
    gen = torch.Generator().manual_seed(2)
    for step in range(3):
        run_step(pn, torch.randn(3, 4, C, generator=gen, dtype=F64), None,
                 torch.randn(3, 4, C, generator=gen, dtype=F64), step)
    pn.eval()
    before = {k: v.clone() for k, v in pn.state_dict().items()}
    x = torch.randn(5, 2, C, generator=gen, dtype=F64)
    pad = make_pad([5, 3], 5)
    y = pn(x, pad)
    keep = ~pad.t()
    z = ref_group_scale(x[keep], G)
    expected = pn.weight.detach() * z / torch.sqrt(before["running_psi2"] + EPS) + pn.bias.detach()
    torch.testing.assert_close(y[keep], expected)
    # per token: one token alone gives the same output as inside the batch
    torch.testing.assert_close(pn(x[:1, :1]), y[:1, :1])
    for k, v in pn.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert pn.discrepancy() is None


def test_discrepancy_terms():
    C, G = 6, 3
    pn = norm_f64(C, G, warmup=1, seed=6)
    assert isinstance(pn, BatchStatNorm) and pn.supports_rbn is False
    gen = torch.Generator().manual_seed(4)
    psi2 = torch.ones(C, dtype=F64)
    for step in range(3):
        x = torch.randn(4, 3, C, generator=gen, dtype=F64) * (1 + step)
        pad = make_pad([4, 2, 3], 4)
        pn.set_num_updates(step)
        pn(x.requires_grad_(), pad)
        z = ref_group_scale(x.detach()[~pad.t()], G)
        sigma2 = (z ** 2).mean(0)
        psi2 = 0.9 * psi2 + 0.1 * sigma2  # T_w = 1: the EMA step alone, from ψ² = 1
    d = pn.discrepancy()  # against ψ² after this step's update
    assert isinstance(d, Discrepancy)
    for term in d:
        assert term.dim() == 0 and not term.requires_grad
    assert d.rbn_mean.item() == 0 and d.tid_mean.item() == 0
    torch.testing.assert_close(d.rbn_var, (psi2 - sigma2).abs().sum(), rtol=1e-10, atol=0)
    torch.testing.assert_close(d.tid_var, (psi2.sqrt() / sigma2.sqrt() - 1).abs().mean(), rtol=1e-10, atol=0)
    assert d.tid_var.item() > 0
    assert pn.discrepancy() is None  # handed out once


# --------------------------------------------------------------------------- #
# dtypes and degenerate batches
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_input(dtype):
    C, G = 16, 4
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(5, 3, C, generator=gen) * 4
    pad = make_pad([5, 2, 4], 5)
    gy = torch.randn(5, 3, C, generator=gen)
    full = PowerNorm(C, groups=G, warmup_updates=1)
    half = PowerNorm(C, groups=G, warmup_updates=1)
    for step in range(3):
        y32, dx32, _, _ = run_step(full, x, pad, gy, step)
        y16, dx16, dw16, _ = run_step(half, x.to(dtype), pad, gy.to(dtype), step)
        assert y16.dtype == dtype and dx16.dtype == dtype
        assert torch.isfinite(y16).all() and torch.isfinite(dx16).all() and torch.isfinite(dw16).all()
        torch.testing.assert_close(y16.float(), y32, rtol=3e-2, atol=3e-2)
        torch.testing.assert_close(dx16.float(), dx32, rtol=5e-2, atol=5e-2)
    # statistics are kept in float32
    assert half.running_psi2.dtype == torch.float32 and half.nu.dtype == torch.float32
    torch.testing.assert_close(half.running_psi2, full.running_psi2, rtol=2e-2, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_module_keeps_float32_statistics(dtype):
    C, G = 8, 2
    gen = torch.Generator().manual_seed(1)
    full = PowerNorm(C, groups=G, warmup_updates=1)
    half = PowerNorm(C, groups=G, warmup_updates=1).to(dtype)
    assert half.weight.dtype == dtype
    assert half.running_psi2.dtype == torch.float32 and half.nu.dtype == torch.float32
    for step in range(3):
        x = torch.randn(4, 3, C, generator=gen) * 3
        gy = torch.randn(4, 3, C, generator=gen)
        y32, _, dw32, _ = run_step(full, x, None, gy, step)
        y16, dx16, dw16, _ = run_step(half, x.to(dtype), None, gy.to(dtype), step)
        assert y16.dtype == dtype and dw16.dtype == dtype
        assert torch.isfinite(dx16).all()
        torch.testing.assert_close(y16.float(), y32, rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(half.running_psi2, full.running_psi2, rtol=2e-2, atol=1e-3)
    torch.testing.assert_close(half.nu, full.nu, rtol=5e-2, atol=5e-2)


def test_single_real_token_is_finite():
    C, G = 8, 2
    pn = PowerNorm(C, groups=G, warmup_updates=1)
    pad = torch.ones(3, 4, dtype=torch.bool)
    pad[1, 2] = False
    x = torch.randn(4, 3, C, generator=torch.Generator().manual_seed(0))
    for step in range(3):
        y, dx, dw, db = run_step(pn, x, pad, torch.ones(4, 3, C), step)
        for t in (y, dx, dw, db, pn.running_psi2, pn.nu):
            assert torch.isfinite(t).all()
        assert y[2, 1].abs().sum() > 0


def test_zero_real_tokens_skip_updates():
    C = 4
    pn = PowerNorm(C, warmup_updates=1)
    run_step(pn, torch.randn(2, 2, C), None, torch.randn(2, 2, C), 0)
    pn.discrepancy()
    before = {k: v.clone() for k, v in pn.state_dict().items()}
    x = torch.full((3, 2, C), float("nan"))
    y, dx, dw, db = run_step(pn, x, torch.ones(2, 3, dtype=torch.bool), torch.randn(3, 2, C), 1)
    assert torch.all(y == 0) and torch.all(dx == 0)
    assert torch.all(dw == 0) and torch.all(db == 0)
    for k, v in pn.state_dict().items():
        if k != "num_updates":
            assert torch.equal(v, before[k]), k


def test_registered_with_options():
    opts = norm_options("power")
    assert opts == {
        "eps": 1e-5,
        "groups": 1,
        "warmup_updates": 8000,
        "alpha_fwd": 0.9,
        "alpha_bkw": 0.9,
        "affine": True,
        "sync_stats": False,
        "impl": "auto",
    }
    pn = create_norm("power", 16, groups=4, warmup_updates=3)
    assert isinstance(pn, PowerNorm) and pn.warmup_updates == 3
    assert "Shen" in PowerNorm.__doc__ and "2020" in PowerNorm.__doc__
    assert PowerNorm(4, affine=False).weight is None
    y = PowerNorm(4, affine=False)(torch.randn(2, 3, 4))
    assert y.shape == (2, 3, 4)
