"""Float64 references of the fused norms, written from the papers' equations, for the GPU check.

They are not the plugin's torch path run in float64: each statistic is written as its
equation (sums over real tokens divided by their count, the unbiased std as a square root of
a sum), PowerNorm's backward is written out step by step from Shen et al.'s Algorithm 1, and
the running statistics follow the update rules as the papers and releases state them.
Gradients elsewhere are autograd's, through these float64 equations. ``real`` is T×B×1,
True at real tokens.
"""
import torch

GROUP_EPS = 1e-5  # PowerNorm's group scaling, fixed in the release


def per_token(name, opts, x, param, eps):
    """Output of a per-token norm at float64 ``x`` (its graph included); ``param`` is RMSNorm's
    gain vector or ScaleNorm's scalar g."""
    C = x.shape[-1]
    if name == "rms":  # Zhang & Sennrich: g ⊙ x / sqrt(mean(x²) + ε)
        return param * x / torch.sqrt((x * x).sum(-1, keepdim=True) / C + eps)
    if name == "scale":  # Nguyen & Salazar: g · x / max(‖x‖₂, ε)
        return param * x / torch.sqrt((x * x).sum(-1, keepdim=True)).clamp(min=eps)
    # Xu et al.: y = (x − μ)/(s + ε), s the unbiased std; DetachNorm stops the gradient of μ, s or both
    mu = x.sum(-1, keepdim=True) / C
    s = torch.sqrt(((x - mu) ** 2).sum(-1, keepdim=True) / (C - 1))
    mode = opts.get("detach", "both") if name == "detach" else None
    if mode in ("mean", "both"):
        mu = mu.detach()
    if mode in ("std", "both"):
        s = s.detach()
    y = (x - mu) / (s + eps)
    if name == "adanorm":  # z = C·(1 − k·sg(y)) ⊙ y
        return opts.get("scale", 1.0) * (1 - opts.get("k", 0.1) * y.detach()) * y
    return y


def _token_count(real):
    n = int(real.sum())
    return n, max(n, 1)


def batch_step(x, real, gy, weight, bias, state, eps, momentum, penalty):
    """One training step of masked BN (Wang, Wu & Huang 2022) on float64 ``x``.

    ``state``: dict of running_mean, running_var, num_batches_tracked, updated in place.
    Returns {"y", "dx", "dweight", "dbias", "dx_rbn"}: the output, the gradients of Σ y·gy,
    and the input gradient of λ_μ Σ(μ̂ − μ_B)² + λ_σ Σ|σ̂² − σ²_B| with ``penalty`` = (λ_μ, λ_σ),
    μ̂ and σ̂² after this step's update as constants."""
    x = x.detach().requires_grad_(True)
    weight, bias = weight.detach().requires_grad_(True), bias.detach().requires_grad_(True)
    n, denom = _token_count(real)
    mu = torch.where(real, x, 0).sum((0, 1)) / denom
    var = torch.where(real, (x - mu) ** 2, 0).sum((0, 1)) / denom
    y = torch.where(real, (x - mu) / torch.sqrt(var + eps) * weight + bias, 0)
    if n:  # μ̂ ← (1 − ρ)μ̂ + ρ μ_B, σ̂² ← (1 − ρ)σ̂² + ρ σ²_B; a batch without real tokens changes nothing
        state["running_mean"] = (1 - momentum) * state["running_mean"] + momentum * mu.detach()
        state["running_var"] = (1 - momentum) * state["running_var"] + momentum * var.detach()
        state["num_batches_tracked"] += 1
    dx, dweight, dbias = torch.autograd.grad((y * gy).sum(), [x, weight, bias], retain_graph=True)
    rbn = (penalty[0] * ((state["running_mean"] - mu) ** 2).sum()
           + penalty[1] * (state["running_var"] - var).abs().sum())
    dx_rbn, = torch.autograd.grad(rbn, [x], allow_unused=True)
    return {"y": y.detach(), "dx": dx, "dweight": dweight, "dbias": dbias,
            "dx_rbn": torch.zeros_like(x) if dx_rbn is None else dx_rbn}


def batch_eval(x, real, weight, bias, state, eps):
    """Inference with the population statistics."""
    x_hat = (x - state["running_mean"]) / torch.sqrt(state["running_var"] + eps)
    return torch.where(real, x_hat * weight + bias, 0)


def group_scale(h, groups):
    """Each token's channel groups divided by the root of their mean square (+ 1e-5)."""
    T, B, C = h.shape
    g = h.reshape(T, B, groups, C // groups)
    return (g / torch.sqrt((g * g).sum(-1, keepdim=True) / (C // groups) + GROUP_EPS)).reshape(T, B, C)


def power_step(x, real, gy, weight, bias, state, step, eps, groups, warmup, alpha_fwd, alpha_bkw):
    """One training step of PowerNorm as released (Shen et al. 2020, ``PowerFunction``) at the
    release's step counter ``step`` = t (1, 2, ...). ``state``: running_psi2 (ψ²) and nu (ν),
    updated in place. Returns {"y", "dx", "dweight", "dbias"} of Σ y·gy."""
    x = x.detach().requires_grad_(True)
    z = group_scale(torch.where(real, x, 0), groups)
    n, denom = _token_count(real)
    zd = z.detach()
    sigma2 = (zd * zd).sum((0, 1)) / denom  # σ²_B: quadratic mean over real tokens, no mean removed
    psi2 = state["running_psi2"]
    # forward: σ²_B while t ≤ T_w, the running ψ² of the previous step afterwards
    x_hat = zd / torch.sqrt((sigma2 if step <= warmup else psi2) + eps)
    y = torch.where(real, x_hat * weight + bias, 0)
    if n:  # while t < T_w a cumulative mean first; then, on every step, the EMA
        if step < warmup:
            psi2 = psi2 * (step - 1) / step + sigma2 / step
        state["running_psi2"] = alpha_fwd * psi2 + (1 - alpha_fwd) * sigma2
    # backward (Algorithm 1): g = γ ⊙ ∂L/∂y; g̃ = g − (1 − α_b) ν ⊙ x̂; ν ← ν + mean(g̃ ⊙ x̂);
    # ∂L/∂z = g̃ / sqrt(σ²_B + ε), then through the group scaling
    g_y = torch.where(real, gy, 0)
    g_tilde = g_y * weight - (1 - alpha_bkw) * state["nu"] * x_hat
    state["nu"] = state["nu"] + (g_tilde * x_hat).sum((0, 1)) / denom
    dx, = torch.autograd.grad(z, [x], g_tilde / torch.sqrt(sigma2 + eps))
    return {"y": y, "dx": dx, "dweight": (g_y * x_hat).sum((0, 1)), "dbias": g_y.sum((0, 1))}


def power_eval(x, real, weight, bias, state, eps, groups):
    """Inference: x̂ = z / sqrt(ψ² + ε)."""
    z = group_scale(torch.where(real, x, 0), groups)
    return torch.where(real, z / torch.sqrt(state["running_psi2"] + eps) * weight + bias, 0)
