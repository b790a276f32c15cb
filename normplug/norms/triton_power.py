"""Fused Triton kernels for PowerNorm (Shen et al. 2020), forward and the released backward (the
torch code in power.py is the reference they are tested against). Rows, padding, splits,
resident programs and custom ops as in triton_batch.py.

Group scaling needs whole groups, so the kernels that touch tokens hold rows × groups ×
channels-of-a-group tiles: a grid of group blocks × row splits, each program looping over the
row blocks of its split. A group is held in registers: at most MAX_GROUP_CHANNELS channels
(impl.py), so that no kernel spills. A training step is five launches: Σz² per split; a merge
(σ²_B, the forward's scale, the ψ² update); the output; the input gradient with per-split sums
for γ, β and ν; a merge (γ, β gradients, the ν update). The backward recomputes the group
scaling from x rather than keeping z. This module imports triton: power.py imports it only
when a norm runs with impl="triton".
"""
from typing import Optional, Tuple

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from .triton_batch import WARPS, empty_grads, pad_args, real_rows, split_plan, sum_splits
from .triton_grid import cdiv, next_power_of_2, traced

MIN_TILE_CHANNELS = 64  # channels of a tile at least: narrow groups share a program
MERGE_COLS = 4  # channels per merge program: the partials are small, so many programs share them
MERGE_CHUNK = 64  # partials a merge program loads at once


@triton.jit
def _group_cols(G, D, GB: tl.constexpr, DB: tl.constexpr):
    """The channel at each (group, position in the group) of this program's GB×DB block of
    groups, and where one is real."""
    g = tl.program_id(0) * GB + tl.arange(0, GB)[:, None]
    d = tl.arange(0, DB)[None, :]
    return g * D + d, (g < G) & (d < D)


@triton.jit
def _load_groups(ptr, rows, cols, in_c, N, C, real):
    """The float32 rows × groups × channels tile of an N×C array, 0 at rows that are not
    ``real``: masked by the bounds only, padding (NaN included) zeroed after the load."""
    inside = (rows < N)[:, None, None] & in_c[None, :, :]
    h = tl.load(ptr + rows[:, None, None].to(tl.int64) * C + cols[None, :, :], mask=inside, other=0.0)
    return tl.where(real[:, None, None], h.to(tl.float32), 0.0)


@triton.jit
def _store_groups(ptr, rows, cols, in_c, N, C, real, value):
    """Store the rows × groups × channels tile ``value``, 0 at rows that are not ``real``."""
    inside = (rows < N)[:, None, None] & in_c[None, :, :]
    tl.store(ptr + rows[:, None, None].to(tl.int64) * C + cols[None, :, :],
             tl.where(real[:, None, None], value, 0.0).to(ptr.dtype.element_ty), mask=inside)


@triton.jit
def _group_scale(h, D, group_eps):
    """s = 1/sqrt(mean of the group's h² + ε) of each row and group, broadcast over the group."""
    return tl.rsqrt(tl.sum(h * h, 2) / D + group_eps)[:, :, None]


@triton.jit
def _power_stats_kernel(x_ptr, pad_ptr, part_ptr, cnt_ptr, N, C, B, pad_sb, pad_st, G, D,
                        group_eps, split_rows, HAS_PAD: tl.constexpr, GB: tl.constexpr,
                        DB: tl.constexpr, BLOCK_R: tl.constexpr):
    # one split's Σ m·z² per channel (z the group-scaled x) and its count of real tokens
    cols, in_c = _group_cols(G, D, GB, DB)
    split = tl.program_id(1)
    acc = tl.zeros([BLOCK_R, GB, DB], tl.float32)
    cnt = tl.zeros([BLOCK_R], tl.float32)
    start = split * split_rows
    for r0 in range(start, tl.minimum(start + split_rows, N), BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        real = real_rows(rows, N, B, pad_ptr, pad_sb, pad_st, HAS_PAD)
        h = _load_groups(x_ptr, rows, cols, in_c, N, C, real)
        z = h * _group_scale(h, D, group_eps)
        acc += z * z
        cnt += real.to(tl.float32)
    tl.store(part_ptr + split * C + cols, tl.sum(acc, 0), mask=in_c)
    if tl.program_id(0) == 0:
        tl.store(cnt_ptr + split, tl.sum(cnt, 0))


@triton.jit
def _power_merge_kernel(part_ptr, cnt_ptr, S, C, psi2_ptr, step_ptr, sigma2_ptr, inv_ptr,
                        count_ptr, eps, warmup, alpha_fwd, TRAINING: tl.constexpr,
                        MERGE_COLS: tl.constexpr, CHUNK: tl.constexpr):
    # σ²_B = Σ m z² / n over the splits; the forward's 1/sqrt(σ²_B + ε) during warm-up (t ≤ T_w),
    # 1/sqrt(ψ² + ε) after; the backward's 1/sqrt(σ²_B + ε); the released ψ² update (none
    # without real tokens). In eval both scales are 1/sqrt(ψ² + ε) and σ² reports ψ².
    cols = tl.program_id(0) * MERGE_COLS + tl.arange(0, MERGE_COLS)
    in_c = cols < C
    psi2 = tl.load(psi2_ptr + cols, mask=in_c, other=1.0)
    inv_psi = tl.rsqrt(psi2 + eps)
    if TRAINING:
        counts = tl.zeros([CHUNK], tl.float32)
        for s0 in range(0, S, CHUNK):
            s = s0 + tl.arange(0, CHUNK)
            counts += tl.load(cnt_ptr + s, mask=s < S, other=0.0)
        n = tl.sum(counts, 0)
        sigma2 = sum_splits(part_ptr, S, C, cols, in_c, CHUNK) / tl.maximum(n, 1.0)
        inv_bwd = tl.rsqrt(sigma2 + eps)
        step = tl.load(step_ptr) + 1  # the release's training-step counter t
        inv_fwd = tl.where(step <= warmup, inv_bwd, inv_psi)
        t = step.to(tl.float32)
        new = tl.where(step < warmup, psi2 * (t - 1) / t + sigma2 / t, psi2)
        new = alpha_fwd * new + (1 - alpha_fwd) * sigma2
        tl.store(psi2_ptr + cols, tl.where(n > 0, new, psi2), mask=in_c)
    else:
        n = 0.0
        sigma2 = psi2
        inv_fwd = inv_psi
        inv_bwd = inv_psi
    tl.store(sigma2_ptr + cols, sigma2, mask=in_c)
    tl.store(inv_ptr + cols, inv_fwd, mask=in_c)
    tl.store(inv_ptr + C + cols, inv_bwd, mask=in_c)
    if tl.program_id(0) == 0:
        tl.store(count_ptr, n)


@triton.jit
def _power_apply_kernel(x_ptr, pad_ptr, y_ptr, inv_ptr, w_ptr, b_ptr, N, C, B, pad_sb, pad_st, G,
                        D, group_eps, split_rows, HAS_PAD: tl.constexpr, AFFINE: tl.constexpr,
                        GB: tl.constexpr, DB: tl.constexpr, BLOCK_R: tl.constexpr):
    # y = γ·z·inv_fwd + β over this split's rows, 0 at padding
    cols, in_c = _group_cols(G, D, GB, DB)
    inv = tl.load(inv_ptr + cols, mask=in_c, other=0.0)[None, :, :]
    if AFFINE:
        w = tl.load(w_ptr + cols, mask=in_c, other=0.0).to(tl.float32)[None, :, :]
        b = tl.load(b_ptr + cols, mask=in_c, other=0.0).to(tl.float32)[None, :, :]
    start = tl.program_id(1) * split_rows
    for r0 in range(start, tl.minimum(start + split_rows, N), BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        real = real_rows(rows, N, B, pad_ptr, pad_sb, pad_st, HAS_PAD)
        h = _load_groups(x_ptr, rows, cols, in_c, N, C, real)
        y = h * _group_scale(h, D, group_eps) * inv
        if AFFINE:
            y = y * w + b
        _store_groups(y_ptr, rows, cols, in_c, N, C, real, y)


@triton.jit
def _power_grad_kernel(gy_ptr, x_ptr, pad_ptr, dx_ptr, inv_ptr, nu_ptr, w_ptr, part_ptr, N, C, B,
                       pad_sb, pad_st, G, D, nu_scale, group_eps, split_rows,
                       HAS_PAD: tl.constexpr, AFFINE: tl.constexpr, TRAINING: tl.constexpr,
                       GB: tl.constexpr, DB: tl.constexpr, BLOCK_R: tl.constexpr):
    # ∂L/∂z = g̃·inv_bwd, g̃ = γ·gy − nu_scale·ν·ẑ (nu_scale = 1 − α_b in training, 0 in eval),
    # then through z = h·s: ∂L/∂h = s·(∂L/∂z − z·mean over the group of ∂L/∂z·z); and this
    # split's Σ m·gy (dβ), Σ m·gy·ẑ (dγ) and Σ g̃·ẑ (ν's step), summed per lane, reduced once
    cols, in_c = _group_cols(G, D, GB, DB)
    inv_fwd = tl.load(inv_ptr + cols, mask=in_c, other=0.0)[None, :, :]
    inv_bwd = tl.load(inv_ptr + C + cols, mask=in_c, other=0.0)[None, :, :]
    coef = nu_scale * tl.load(nu_ptr + cols, mask=in_c, other=0.0)[None, :, :]
    if AFFINE:
        w = tl.load(w_ptr + cols, mask=in_c, other=0.0).to(tl.float32)[None, :, :]
    else:
        w = tl.full([1, GB, DB], 1.0, dtype=tl.float32)
    db = tl.zeros([BLOCK_R, GB, DB], tl.float32)
    dw = tl.zeros([BLOCK_R, GB, DB], tl.float32)
    dnu = tl.zeros([BLOCK_R, GB, DB], tl.float32)
    split = tl.program_id(1)
    start = split * split_rows
    for r0 in range(start, tl.minimum(start + split_rows, N), BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        real = real_rows(rows, N, B, pad_ptr, pad_sb, pad_st, HAS_PAD)
        h = _load_groups(x_ptr, rows, cols, in_c, N, C, real)
        gy = _load_groups(gy_ptr, rows, cols, in_c, N, C, real)
        s = _group_scale(h, D, group_eps)
        z = h * s
        zhat = z * inv_fwd
        g_tilde = gy * w - coef * zhat
        dz = g_tilde * inv_bwd
        dx = s * (dz - z * (tl.sum(dz * z, 2) / D)[:, :, None])
        _store_groups(dx_ptr, rows, cols, in_c, N, C, real, dx)
        if AFFINE:
            db += gy
            dw += gy * zhat
        if TRAINING:
            dnu += g_tilde * zhat
    S = tl.num_programs(1)
    if AFFINE:
        tl.store(part_ptr + split * C + cols, tl.sum(db, 0), mask=in_c)
        tl.store(part_ptr + (S + split) * C + cols, tl.sum(dw, 0), mask=in_c)
    if TRAINING:
        tl.store(part_ptr + (2 * S + split) * C + cols, tl.sum(dnu, 0), mask=in_c)


@triton.jit
def _power_grad_merge_kernel(part_ptr, S, C, count_ptr, nu_ptr, dw_ptr, db_ptr,
                             AFFINE: tl.constexpr, TRAINING: tl.constexpr,
                             MERGE_COLS: tl.constexpr, CHUNK: tl.constexpr):
    # dβ, dγ summed over the splits; ν ← ν + mean over real tokens of g̃·ẑ
    cols = tl.program_id(0) * MERGE_COLS + tl.arange(0, MERGE_COLS)
    in_c = cols < C
    if AFFINE:
        db = sum_splits(part_ptr, S, C, cols, in_c, CHUNK)
        dw = sum_splits(part_ptr + S * C, S, C, cols, in_c, CHUNK)
        tl.store(db_ptr + cols, db.to(db_ptr.dtype.element_ty), mask=in_c)
        tl.store(dw_ptr + cols, dw.to(dw_ptr.dtype.element_ty), mask=in_c)
    if TRAINING:
        step = sum_splits(part_ptr + 2 * S * C, S, C, cols, in_c, CHUNK) / tl.maximum(tl.load(count_ptr), 1.0)
        tl.store(nu_ptr + cols, tl.load(nu_ptr + cols, mask=in_c, other=0.0) + step, mask=in_c)


def _group_tile(N, C, groups, per_thread, pad_mask, **flags):
    """(kernel options, group blocks, D) of a rows × groups × channels tile of N rows of C:
    ``per_thread`` elements a thread over WARPS warps (fewer rows for fewer tokens), or whole
    groups (at least MIN_TILE_CHANNELS channels) of one row over more warps when that is wider."""
    D = C // groups
    db = next_power_of_2(D)
    gb = min(next_power_of_2(groups), max(1, MIN_TILE_CHANNELS // db))
    rows = max(1, min(per_thread * 32 * WARPS // (gb * db), next_power_of_2(max(N, 1))))
    warps = min(32, max(WARPS, rows * gb * db // (32 * per_thread)))
    options = dict(flags, HAS_PAD=pad_mask is not None, GB=gb, DB=db, BLOCK_R=rows, num_warps=warps)
    return options, cdiv(groups, gb), D


def forward_launches(x: torch.Tensor, pad_mask: Optional[torch.Tensor], weight: Optional[torch.Tensor],
                     bias: Optional[torch.Tensor], running_psi2: torch.Tensor, num_updates: torch.Tensor,
                     eps: float, groups: int, group_eps: float, warmup: int, alpha_fwd: float,
                     training: bool, sync: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, σ², scales, n): σ²_B in training (ψ² in eval), the forward's and the backward's
    1/sqrt(· + ε) per channel (2×C), the number of real tokens (0 in eval)."""
    T, B, C = x.shape
    N = T * B
    x2 = x.contiguous()  # read as N×C
    pad_t, sb, st = pad_args(pad_mask, x2)
    f32 = dict(device=x.device, dtype=torch.float32)
    if training:
        options, blocks, D = _group_tile(N, C, groups, 16, pad_mask)
        head = (x2, pad_t, torch.float32, torch.float32, N, C, B, sb, st, groups, D, group_eps)
        grid, split_rows, splits = split_plan(_power_stats_kernel, head, options, N, blocks, x.device)
        part, cnt = torch.empty(splits, C, **f32), torch.empty(splits, **f32)
        _power_stats_kernel[grid](x2, pad_t, part, cnt, *head[4:], split_rows, **options)
        if sync:
            sums = torch.cat([part.sum(0), cnt.sum().reshape(1)])
            dist.all_reduce(sums)
            part, cnt, splits = sums[:C], sums[C:], 1  # every worker's tokens as one split
    else:
        part, cnt, splits = running_psi2, running_psi2, 0  # no batch statistics in eval
    sigma2, scales, count = torch.empty(C, **f32), torch.empty(2, C, **f32), torch.empty((), **f32)
    _power_merge_kernel[(cdiv(C, MERGE_COLS),)](
        part, cnt, splits, C, running_psi2, num_updates, sigma2, scales, count, eps, warmup,
        alpha_fwd, TRAINING=training, MERGE_COLS=MERGE_COLS, CHUNK=MERGE_CHUNK)
    y = torch.empty_like(x2)
    options, blocks, D = _group_tile(N, C, groups, 16, pad_mask, AFFINE=weight is not None)
    head = (x2, pad_t, y, scales, weight, bias, N, C, B, sb, st, groups, D, group_eps)
    grid, split_rows, _ = split_plan(_power_apply_kernel, head, options, N, blocks, x.device)
    _power_apply_kernel[grid](*head, split_rows, **options)
    return y, sigma2, scales, count


def backward_launches(gy: torch.Tensor, x: torch.Tensor, pad_mask: Optional[torch.Tensor],
                      weight: Optional[torch.Tensor], nu: torch.Tensor, scales: torch.Tensor,
                      count: torch.Tensor, groups: int, group_eps: float, nu_scale: float, training: bool,
                      sync: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(∂L/∂x, ∂L/∂γ, ∂L/∂β) (empty γ, β grads without affine); in training ν takes its step."""
    T, B, C = x.shape
    N = T * B
    x2, gy2 = x.contiguous(), gy.contiguous()  # read as N×C
    pad_t, sb, st = pad_args(pad_mask, x2)
    affine = weight is not None
    dx, dw, db = empty_grads(x, weight)
    # half the forward's tile: a thread holds three sums and four per-channel factors an element
    options, blocks, D = _group_tile(N, C, groups, 8, pad_mask, AFFINE=affine, TRAINING=training)
    head, tail = (gy2, x2, pad_t, dx, scales, nu, weight), (N, C, B, sb, st, groups, D, nu_scale, group_eps)
    grid, split_rows, splits = split_plan(_power_grad_kernel, (*head, torch.float32, *tail), options, N, blocks,
                                          x.device)
    part = torch.empty(3, splits, C, device=x.device, dtype=torch.float32)  # per split: dβ, dγ, ν's sum
    _power_grad_kernel[grid](*head, part, *tail, split_rows, **options)
    if training and sync:
        part = part.sum(1, keepdim=True)
        dist.all_reduce(part[2])  # ν is every worker's; γ and β get this worker's sums
    if affine or training:
        _power_grad_merge_kernel[(cdiv(C, MERGE_COLS),)](
            part, part.shape[1], C, count, nu, dw, db, AFFINE=affine, TRAINING=training,
            MERGE_COLS=MERGE_COLS, CHUNK=MERGE_CHUNK)
    return dx, dw, db


_forward = torch.library.custom_op("normplug::power_norm_forward", forward_launches,
                                   mutates_args=("running_psi2",))
_backward = torch.library.custom_op("normplug::power_norm_backward", backward_launches, mutates_args=("nu",))


@_forward.register_fake
def _(x, pad_mask, weight, bias, running_psi2, num_updates, eps, groups, group_eps, warmup,
      alpha_fwd, training, sync):
    C = x.shape[-1]
    return (torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty(C, dtype=torch.float32),
            x.new_empty(2, C, dtype=torch.float32), x.new_empty((), dtype=torch.float32))


@_backward.register_fake
def _(gy, x, pad_mask, weight, nu, scales, count, groups, group_eps, nu_scale, training, sync):
    return empty_grads(x, weight)


class _PowerNorm(torch.autograd.Function):
    """PowerNorm's released forward and its approximate backward (Shen et al. 2020, Algorithm 1)
    in training; in eval the forward with ψ² and its exact backward. Returns (y, σ²_B)."""

    @staticmethod
    def forward(ctx, x, pad_mask, weight, bias, running_psi2, nu, num_updates, eps, groups,
                group_eps, warmup, alpha_fwd, alpha_bkw, training, sync):
        y, sigma2, scales, count = traced(_forward, forward_launches)(
            x, pad_mask, weight, bias, running_psi2, num_updates, eps, groups, group_eps, warmup,
            alpha_fwd, training, sync)
        ctx.save_for_backward(x, pad_mask, weight, scales, count)
        ctx.nu = nu  # a buffer the backward updates: held, not saved (saved tensors must not change)
        ctx.options = (groups, group_eps, (1 - alpha_bkw) if training else 0.0, training, sync)
        ctx.mark_non_differentiable(sigma2)
        return y, sigma2

    @staticmethod
    def backward(ctx, gy, _gsigma2):
        x, pad_mask, weight, scales, count = ctx.saved_tensors
        dx, dw, db = traced(_backward, backward_launches)(gy, x, pad_mask, weight, ctx.nu, scales, count,
                                                          *ctx.options)
        if weight is None:
            dw = db = None
        return (dx, None, dw, db) + (None,) * 11


def power_norm(x, pad_mask, weight, bias, running_psi2, nu, num_updates, *, eps: float,
               groups: int, group_eps: float, warmup_updates: int, alpha_fwd: float,
               alpha_bkw: float, training: bool, sync: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """PowerNorm of T×B×C ``x`` in fused kernels: (y, σ²_B); ψ² and, in the backward, ν are
    updated in place. σ²_B is the batch's quadratic mean in training (unused in eval)."""
    return _PowerNorm.apply(x, pad_mask, weight, bias, running_psi2, nu, num_updates, eps, groups,
                            group_eps, warmup_updates, alpha_fwd, alpha_bkw, training, sync)
