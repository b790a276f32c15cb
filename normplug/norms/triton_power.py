"""Fused Triton kernels for PowerNorm (Shen et al. 2020), forward and the released backward (the
torch code in power.py is the reference they are tested against). Rows, padding and grids as in
triton_batch.py; group scaling needs whole rows, so the row-wise kernel leaves partial column
sums that a small kernel adds up. This module imports triton: power.py imports it only when a
norm runs with impl="triton".
"""
from typing import Tuple

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from .triton_batch import (REDUCE_COLS, REDUCE_ROWS, ROW_TILE_ELEMENTS, TILE_COLS, TILE_ROWS, _pad_args,
                           _real_rows, _reduce_grid, _tile_grid)


@triton.jit
def _group_scale_tile(h, cols, C, G: tl.constexpr, group_eps):
    """The scale s = 1/sqrt(mean over its group of h² + ε) of each row's group, broadcast to
    each element of h (z = h·s is the group-scaled row)."""
    D = C // G
    scale = tl.zeros_like(h)
    for g in tl.static_range(G):
        in_g = ((cols >= g * D) & (cols < (g + 1) * D))[None, :]
        s = tl.rsqrt(tl.sum(tl.where(in_g, h * h, 0.0), 1) / D + group_eps)
        scale = tl.where(in_g, s[:, None], scale)
    return scale


@triton.jit
def _power_scale_kernel(x_ptr, pad_ptr, z_ptr, part_ptr, cnt_ptr, N, C, B, pad_sb, pad_st,
                        group_eps, G: tl.constexpr, HAS_PAD: tl.constexpr, TRAINING: tl.constexpr,
                        BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    # group scaling of whole rows (0 at padding); in training each program also leaves its
    # rows' Σ z² per channel and its count of real tokens in a partial-sum row
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    in_c = cols < C
    real = _real_rows(rows, N, B, pad_ptr, pad_sb, pad_st, HAS_PAD)
    ok = real[:, None] & in_c[None, :]
    offs = rows[:, None] * C + cols[None, :]
    h = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    z = h * _group_scale_tile(h, cols, C, G, group_eps)
    tl.store(z_ptr + offs, z, mask=(rows < N)[:, None] & in_c[None, :])
    if TRAINING:
        tl.store(part_ptr + tl.program_id(0) * C + cols, tl.sum(z * z, 0), mask=in_c)
        tl.store(cnt_ptr + tl.program_id(0), tl.sum(real.to(tl.float32), 0))


@triton.jit
def _power_stats_kernel(part_ptr, cnt_ptr, R, C, psi2_ptr, step_ptr, sigma2_ptr, inv_fwd_ptr,
                        inv_bwd_ptr, count_ptr, eps, warmup, alpha_fwd, TRAINING: tl.constexpr,
                        BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    # σ²_B = Σ m z² / n from R partial rows; the forward's 1/sqrt(σ²_B + ε) during warm-up
    # (t ≤ T_w), 1/sqrt(ψ² + ε) after; then the released ψ² update (none without real tokens)
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    in_c = cols < C
    psi2 = tl.load(psi2_ptr + cols, mask=in_c, other=1.0)
    inv_psi = tl.rsqrt(psi2 + eps)
    if TRAINING:
        acc = tl.zeros([BLOCK_C], dtype=tl.float32)
        cnt = tl.zeros([BLOCK_R], dtype=tl.float32)
        for r0 in range(0, R, BLOCK_R):
            prow = r0 + tl.arange(0, BLOCK_R)
            in_r = prow < R
            acc += tl.sum(tl.load(part_ptr + prow[:, None] * C + cols[None, :],
                                  mask=in_r[:, None] & in_c[None, :], other=0.0), 0)
            cnt += tl.load(cnt_ptr + prow, mask=in_r, other=0.0)
        n = tl.sum(cnt, 0)
        sigma2 = acc / tl.maximum(n, 1.0)
        inv_bwd = tl.rsqrt(sigma2 + eps)
        step = tl.load(step_ptr) + 1  # the release's training-step counter t
        inv_fwd = tl.where(step <= warmup, inv_bwd, inv_psi)
        t = step.to(tl.float32)
        new = tl.where(step < warmup, psi2 * (t - 1) / t + sigma2 / t, psi2)
        new = alpha_fwd * new + (1 - alpha_fwd) * sigma2
        tl.store(psi2_ptr + cols, tl.where(n > 0, new, psi2), mask=in_c)
        tl.store(sigma2_ptr + cols, sigma2, mask=in_c)
        if tl.program_id(0) == 0:
            tl.store(count_ptr, n)
    else:
        inv_fwd = inv_psi
        inv_bwd = inv_psi
    tl.store(inv_fwd_ptr + cols, inv_fwd, mask=in_c)
    tl.store(inv_bwd_ptr + cols, inv_bwd, mask=in_c)


@triton.jit
def _power_apply_kernel(z_ptr, pad_ptr, y_ptr, inv_ptr, w_ptr, b_ptr, N, C, B, pad_sb, pad_st,
                        HAS_PAD: tl.constexpr, AFFINE: tl.constexpr,
                        BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    in_c = cols < C
    real = _real_rows(rows, N, B, pad_ptr, pad_sb, pad_st, HAS_PAD)
    ok = real[:, None] & in_c[None, :]
    offs = rows[:, None] * C + cols[None, :]
    y = tl.load(z_ptr + offs, mask=ok, other=0.0) * tl.load(inv_ptr + cols, mask=in_c, other=0.0)[None, :]
    if AFFINE:
        w = tl.load(w_ptr + cols, mask=in_c, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=in_c, other=0.0).to(tl.float32)
        y = y * w[None, :] + b[None, :]
    y = tl.where(ok, y, 0.0)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=(rows < N)[:, None] & in_c[None, :])


@triton.jit
def _power_grad_sums_kernel(gy_ptr, z_ptr, pad_ptr, inv_fwd_ptr, nu_ptr, w_ptr, s_ptr, dw_ptr,
                            db_ptr, N, C, B, pad_sb, pad_st, nu_scale, HAS_PAD: tl.constexpr,
                            AFFINE: tl.constexpr, TRAINING: tl.constexpr,
                            BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    # dγ = Σ m·gy·ẑ, dβ = Σ m·gy and, in training, Σ g̃·ẑ for ν (g̃ = γ·gy − (1 − α_b)·ν·ẑ)
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    in_c = cols < C
    inv = tl.load(inv_fwd_ptr + cols, mask=in_c, other=0.0)
    if AFFINE:
        w = tl.load(w_ptr + cols, mask=in_c, other=0.0).to(tl.float32)
    else:
        w = tl.full([BLOCK_C], 1.0, dtype=tl.float32)
    coef = nu_scale * tl.load(nu_ptr + cols, mask=in_c, other=0.0)
    s = tl.zeros([BLOCK_C], dtype=tl.float32)
    dw = tl.zeros([BLOCK_C], dtype=tl.float32)
    db = tl.zeros([BLOCK_C], dtype=tl.float32)
    for r0 in range(0, N, BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        real = _real_rows(rows, N, B, pad_ptr, pad_sb, pad_st, HAS_PAD)
        ok = real[:, None] & in_c[None, :]
        offs = rows[:, None] * C + cols[None, :]
        gy = tl.load(gy_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        zhat = tl.load(z_ptr + offs, mask=ok, other=0.0) * inv[None, :]
        db += tl.sum(gy, 0)
        dw += tl.sum(gy * zhat, 0)
        if TRAINING:
            s += tl.sum((gy * w[None, :] - coef[None, :] * zhat) * zhat, 0)
    if AFFINE:
        tl.store(dw_ptr + cols, dw, mask=in_c)
        tl.store(db_ptr + cols, db, mask=in_c)
    if TRAINING:
        tl.store(s_ptr + cols, s, mask=in_c)


@triton.jit
def _power_grad_input_kernel(gy_ptr, x_ptr, pad_ptr, dx_ptr, inv_fwd_ptr, inv_bwd_ptr, nu_ptr,
                             w_ptr, N, C, B, pad_sb, pad_st, nu_scale, group_eps, G: tl.constexpr,
                             HAS_PAD: tl.constexpr, AFFINE: tl.constexpr,
                             BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    # ∂L/∂z = g̃ / sqrt(σ²_B + ε) (with nu_scale = 0 and the forward's scale in eval), then back
    # through the group scaling z = h·s: ∂L/∂h = s·(∂L/∂z − z·mean over the group of ∂L/∂z·z)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    in_c = cols < C
    real = _real_rows(rows, N, B, pad_ptr, pad_sb, pad_st, HAS_PAD)
    ok = real[:, None] & in_c[None, :]
    offs = rows[:, None] * C + cols[None, :]
    h = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    scale = _group_scale_tile(h, cols, C, G, group_eps)
    z = h * scale
    gy = tl.load(gy_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    if AFFINE:
        gy = gy * tl.load(w_ptr + cols, mask=in_c, other=0.0).to(tl.float32)[None, :]
    zhat = z * tl.load(inv_fwd_ptr + cols, mask=in_c, other=0.0)[None, :]
    coef = nu_scale * tl.load(nu_ptr + cols, mask=in_c, other=0.0)
    dz = (gy - coef[None, :] * zhat) * tl.load(inv_bwd_ptr + cols, mask=in_c, other=0.0)[None, :]
    D = C // G
    dot = tl.zeros_like(dz)
    for g in tl.static_range(G):
        in_g = ((cols >= g * D) & (cols < (g + 1) * D))[None, :]
        dot = tl.where(in_g, (tl.sum(tl.where(in_g, dz * z, 0.0), 1) / D)[:, None], dot)
    dx = tl.where(ok, scale * (dz - z * dot), 0.0)
    tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=(rows < N)[:, None] & in_c[None, :])


def _row_block(C):
    """(rows, padded width) of a row-wise tile holding whole rows of C channels."""
    width = triton.next_power_of_2(C)
    return max(1, min(TILE_ROWS, ROW_TILE_ELEMENTS // width)), width


class _PowerNormFunction(torch.autograd.Function):
    """PowerNorm's released forward and its approximate backward (Shen et al. 2020, Algorithm 1)
    in training; in eval the forward with ψ² and its exact backward. Returns (y, σ²_B)."""

    @staticmethod
    def forward(ctx, x, pad_mask, weight, bias, running_psi2, nu, num_updates, eps, groups,
                group_eps, warmup, alpha_fwd, alpha_bkw, training, sync):
        T, B, C = x.shape
        N = T * B
        x2 = x.contiguous().view(N, C)
        pad_t, sb, st = _pad_args(pad_mask, x2)
        has_pad = pad_mask is not None
        rows, width = _row_block(C)
        R = triton.cdiv(N, rows)
        dev = x.device
        z = torch.empty(N, C, device=dev, dtype=torch.float32)
        part = torch.empty(R if training else 1, C, device=dev, dtype=torch.float32)
        cnt = torch.empty(part.shape[0], device=dev, dtype=torch.float32)
        _power_scale_kernel[(R,)](x2, pad_t, z, part, cnt, N, C, B, sb, st, group_eps, G=groups,
                                  HAS_PAD=has_pad, TRAINING=training, BLOCK_R=rows, BLOCK_C=width)
        if training and sync:
            part = part.sum(0, keepdim=True)
            sums = torch.cat([part.view(C), cnt.sum().reshape(1)])
            dist.all_reduce(sums)
            part, cnt = sums[:C].view(1, C), sums[C:]
        sigma2 = torch.empty(C, device=dev, dtype=torch.float32)
        inv_fwd, inv_bwd = torch.empty_like(sigma2), torch.empty_like(sigma2)
        count = torch.empty((), device=dev, dtype=torch.float32)
        _power_stats_kernel[_reduce_grid(C)](
            part, cnt, part.shape[0], C, running_psi2, num_updates, sigma2, inv_fwd, inv_bwd,
            count, eps, warmup, alpha_fwd, TRAINING=training, BLOCK_R=REDUCE_ROWS,
            BLOCK_C=REDUCE_COLS)
        y = torch.empty_like(x2)
        affine = weight is not None
        _power_apply_kernel[_tile_grid(N, C)](z, pad_t, y, inv_fwd, weight, bias, N, C, B, sb, st,
                                             HAS_PAD=has_pad, AFFINE=affine,
                                             BLOCK_R=TILE_ROWS, BLOCK_C=TILE_COLS)
        ctx.save_for_backward(x2, z, pad_mask, weight, inv_fwd, inv_bwd, count)
        ctx.nu = nu  # a buffer the backward updates: held, not saved (saved tensors must not change)
        ctx.groups, ctx.group_eps, ctx.training, ctx.sync = groups, group_eps, training, sync
        ctx.nu_scale = (1 - alpha_bkw) if training else 0.0
        ctx.shape = x.shape
        ctx.mark_non_differentiable(sigma2)
        return y.view(T, B, C), sigma2

    @staticmethod
    def backward(ctx, gy, _gsigma2):
        x2, z, pad_mask, weight, inv_fwd, inv_bwd, count = ctx.saved_tensors
        nu = ctx.nu
        N, C = x2.shape
        B = ctx.shape[1]
        gy = gy.contiguous().view(N, C)
        pad_t, sb, st = _pad_args(pad_mask, x2)
        has_pad, affine = pad_mask is not None, weight is not None
        dw = torch.empty(C, device=gy.device, dtype=torch.float32) if affine else None
        db = torch.empty_like(dw) if affine else None
        nu_sum = torch.empty(C, device=gy.device, dtype=torch.float32) if ctx.training else None
        _power_grad_sums_kernel[_reduce_grid(C)](
            gy, z, pad_t, inv_fwd, nu, weight, nu_sum, dw, db, N, C, B, sb, st, ctx.nu_scale,
            HAS_PAD=has_pad, AFFINE=affine, TRAINING=ctx.training,
            BLOCK_R=REDUCE_ROWS, BLOCK_C=REDUCE_COLS)
        rows, width = _row_block(C)
        dx = torch.empty_like(gy)
        _power_grad_input_kernel[(triton.cdiv(N, rows),)](
            gy, x2, pad_t, dx, inv_fwd, inv_bwd, nu, weight, N, C, B, sb, st, ctx.nu_scale,
            ctx.group_eps, G=ctx.groups, HAS_PAD=has_pad, AFFINE=affine,
            BLOCK_R=rows, BLOCK_C=width)
        if ctx.training:
            # ν ← ν + mean over real tokens of g̃·ẑ, after the input gradient read the old ν
            if ctx.sync:
                dist.all_reduce(nu_sum)
            nu.add_(nu_sum / count.clamp(min=1))
        if affine:
            dw, db = dw.to(weight.dtype), db.to(weight.dtype)
        return (dx.view(ctx.shape), None, dw, db) + (None,) * 11


def power_norm(x, pad_mask, weight, bias, running_psi2, nu, num_updates, *, eps: float,
               groups: int, group_eps: float, warmup_updates: int, alpha_fwd: float,
               alpha_bkw: float, training: bool, sync: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """PowerNorm of T×B×C ``x`` in fused kernels: (y, σ²_B); ψ² and, in the backward, ν are
    updated in place. σ²_B is the batch's quadratic mean in training (unused in eval)."""
    return _PowerNormFunction.apply(x, pad_mask, weight, bias, running_psi2, nu, num_updates,
                                    eps, groups, group_eps, warmup_updates, alpha_fwd,
                                    alpha_bkw, training, sync)
