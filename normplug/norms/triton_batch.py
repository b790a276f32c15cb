"""Fused Triton kernels for masked BatchNorm (the torch code in batch.py is the reference they
are tested against); triton_power.py reuses its row and grid helpers for PowerNorm.

``x`` of shape T×B×C is read as N = T·B rows of C channels; row i is the token
(t, b) = divmod(i, B), and the B×T ``pad_mask`` (True at padding) is read in place, so a
call prepares no mask. Statistics and gradient sums are float32 whatever the input dtype;
outputs and the input gradient are in the input dtype. Padding never enters a sum and
outputs 0. BatchNorm's column reductions run one program per block of channels over every
row, so its statistics need no second kernel; PowerNorm's group scaling needs whole rows, so
its row-wise kernel leaves partial column sums that a small kernel adds up. The all_reduce of
synced statistics is a torch call between two kernels. This module imports triton: batch.py
and power.py import it only when a norm runs with impl="triton".
"""
from typing import Optional, Tuple

import torch
import torch.distributed as dist
import triton
import triton.language as tl

# rows × channels of one program: a column reduction walks all rows in tiles of REDUCE_ROWS
REDUCE_ROWS, REDUCE_COLS = 64, 32
TILE_ROWS, TILE_COLS = 32, 64
# row-wise kernels (PowerNorm's group scaling, triton_power.py) hold whole rows: at most this many elements a tile
ROW_TILE_ELEMENTS = 4096


@triton.jit
def _real_rows(rows, N, B, pad_ptr, pad_sb, pad_st, HAS_PAD: tl.constexpr):
    """True at rows < N that are real tokens (pad_mask[b, t] False for row = t·B + b)."""
    real = rows < N
    if HAS_PAD:
        pad = tl.load(pad_ptr + (rows % B) * pad_sb + (rows // B) * pad_st, mask=real, other=1)
        real = real & (pad == 0)
    return real


# ---------------------------------------------------------------- masked BatchNorm

@triton.jit
def _bn_stats_kernel(x_ptr, pad_ptr, mean_ptr, var_ptr, count_ptr, N, C, B, pad_sb, pad_st,
                     HAS_PAD: tl.constexpr, SUM_PASS: tl.constexpr, M2_PASS: tl.constexpr,
                     BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    # SUM_PASS: mean and count of the real tokens; M2_PASS: Σ m·(x − mean)² / max(count, 1)
    # around the mean and count found in mean_ptr/count_ptr when SUM_PASS is off (synced stats)
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    in_c = cols < C
    if SUM_PASS:
        acc = tl.zeros([BLOCK_C], dtype=tl.float32)
        cnt = tl.zeros([BLOCK_R], dtype=tl.float32)
        for r0 in range(0, N, BLOCK_R):
            rows = r0 + tl.arange(0, BLOCK_R)
            real = _real_rows(rows, N, B, pad_ptr, pad_sb, pad_st, HAS_PAD)
            x = tl.load(x_ptr + rows[:, None] * C + cols[None, :], mask=real[:, None] & in_c[None, :],
                        other=0.0).to(tl.float32)
            acc += tl.sum(x, 0)
            cnt += real.to(tl.float32)
        n = tl.sum(cnt, 0)
        mean = acc / tl.maximum(n, 1.0)
        tl.store(mean_ptr + cols, mean, mask=in_c)
        if tl.program_id(0) == 0:
            tl.store(count_ptr, n)
    else:
        mean = tl.load(mean_ptr + cols, mask=in_c, other=0.0)
        n = tl.load(count_ptr)
    if M2_PASS:
        m2 = tl.zeros([BLOCK_C], dtype=tl.float32)
        for r0 in range(0, N, BLOCK_R):
            rows = r0 + tl.arange(0, BLOCK_R)
            real = _real_rows(rows, N, B, pad_ptr, pad_sb, pad_st, HAS_PAD)
            ok = real[:, None] & in_c[None, :]
            x = tl.load(x_ptr + rows[:, None] * C + cols[None, :], mask=ok, other=0.0).to(tl.float32)
            d = tl.where(ok, x - mean[None, :], 0.0)
            m2 += tl.sum(d * d, 0)
        tl.store(var_ptr + cols, m2 / tl.maximum(n, 1.0), mask=in_c)


@triton.jit
def _bn_apply_kernel(x_ptr, pad_ptr, y_ptr, mean_ptr, var_ptr, w_ptr, b_ptr,
                     count_ptr, run_mean_ptr, run_var_ptr, tracked_ptr, N, C, B, pad_sb, pad_st,
                     eps, momentum, HAS_PAD: tl.constexpr, AFFINE: tl.constexpr,
                     UPDATE_RUNNING: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    # y = γ (x − μ)/sqrt(σ² + ε) + β at real tokens, 0 at padding; the first row of programs
    # also takes the EMA step of the running statistics (no step for a batch without tokens)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    in_c = cols < C
    real = _real_rows(rows, N, B, pad_ptr, pad_sb, pad_st, HAS_PAD)
    ok = real[:, None] & in_c[None, :]
    x = tl.load(x_ptr + rows[:, None] * C + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    mean = tl.load(mean_ptr + cols, mask=in_c, other=0.0)
    var = tl.load(var_ptr + cols, mask=in_c, other=1.0)
    y = (x - mean[None, :]) * tl.rsqrt(var + eps)[None, :]
    if AFFINE:
        w = tl.load(w_ptr + cols, mask=in_c, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=in_c, other=0.0).to(tl.float32)
        y = y * w[None, :] + b[None, :]
    y = tl.where(ok, y, 0.0)
    tl.store(y_ptr + rows[:, None] * C + cols[None, :], y.to(y_ptr.dtype.element_ty),
             mask=(rows < N)[:, None] & in_c[None, :])
    if UPDATE_RUNNING:
        if tl.program_id(0) == 0:
            has_tokens = tl.load(count_ptr) > 0
            rho = tl.where(has_tokens, momentum, 0.0)
            run_mean = tl.load(run_mean_ptr + cols, mask=in_c, other=0.0)
            run_var = tl.load(run_var_ptr + cols, mask=in_c, other=1.0)
            tl.store(run_mean_ptr + cols, run_mean + rho * (mean - run_mean), mask=in_c)
            tl.store(run_var_ptr + cols, run_var + rho * (var - run_var), mask=in_c)
            if tl.program_id(1) == 0:
                tl.store(tracked_ptr, tl.load(tracked_ptr) + has_tokens.to(tl.int64))


@triton.jit
def _bn_grad_sums_kernel(gy_ptr, x_ptr, pad_ptr, mean_ptr, var_ptr, w_ptr, gmean_ptr, gvar_ptr,
                         dw_ptr, db_ptr, gmu_ptr, gsig_ptr, N, C, B, pad_sb, pad_st, eps,
                         HAS_PAD: tl.constexpr, AFFINE: tl.constexpr, BATCH_STATS: tl.constexpr,
                         HAS_GMEAN: tl.constexpr, HAS_GVAR: tl.constexpr,
                         BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    # dβ = Σ m·gy, dγ = Σ m·gy·x̂ and, with batch statistics, the total gradients of μ_B and σ²_B:
    # ∂L/∂μ_B = gmean − r·γ·dβ, ∂L/∂σ²_B = gvar − ½ r²·γ·dγ (r = 1/sqrt(σ²_B + ε))
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    in_c = cols < C
    mean = tl.load(mean_ptr + cols, mask=in_c, other=0.0)
    r = tl.rsqrt(tl.load(var_ptr + cols, mask=in_c, other=1.0) + eps)
    db = tl.zeros([BLOCK_C], dtype=tl.float32)
    dw = tl.zeros([BLOCK_C], dtype=tl.float32)
    for r0 in range(0, N, BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        real = _real_rows(rows, N, B, pad_ptr, pad_sb, pad_st, HAS_PAD)
        ok = real[:, None] & in_c[None, :]
        offs = rows[:, None] * C + cols[None, :]
        gy = tl.load(gy_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        db += tl.sum(gy, 0)
        dw += tl.sum(gy * (x - mean[None, :]) * r[None, :], 0)
    if AFFINE:
        tl.store(dw_ptr + cols, dw, mask=in_c)
        tl.store(db_ptr + cols, db, mask=in_c)
        w = tl.load(w_ptr + cols, mask=in_c, other=0.0).to(tl.float32)
    else:
        w = tl.full([BLOCK_C], 1.0, dtype=tl.float32)
    if BATCH_STATS:
        gmu = -(w * db) * r  # the input kernel's order (γ·gy)·r: one real token cancels exactly
        gsig = -0.5 * r * r * w * dw
        if HAS_GMEAN:
            gmu += tl.load(gmean_ptr + cols, mask=in_c, other=0.0).to(tl.float32)
        if HAS_GVAR:
            gsig += tl.load(gvar_ptr + cols, mask=in_c, other=0.0).to(tl.float32)
        tl.store(gmu_ptr + cols, gmu, mask=in_c)
        tl.store(gsig_ptr + cols, gsig, mask=in_c)


@triton.jit
def _bn_grad_input_kernel(gy_ptr, x_ptr, pad_ptr, dx_ptr, mean_ptr, var_ptr, w_ptr, gmu_ptr,
                          gsig_ptr, count_ptr, N, C, B, pad_sb, pad_st, eps,
                          HAS_PAD: tl.constexpr, AFFINE: tl.constexpr, BATCH_STATS: tl.constexpr,
                          BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    # ∂L/∂x = m·(γ·gy·r + (∂L/∂μ_B)/n + 2 (∂L/∂σ²_B)(x − μ_B)/n): ∂μ_B/∂x = m/n, ∂σ²_B/∂x = 2m(x − μ_B)/n
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    in_c = cols < C
    real = _real_rows(rows, N, B, pad_ptr, pad_sb, pad_st, HAS_PAD)
    ok = real[:, None] & in_c[None, :]
    offs = rows[:, None] * C + cols[None, :]
    gy = tl.load(gy_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    r = tl.rsqrt(tl.load(var_ptr + cols, mask=in_c, other=1.0) + eps)
    if AFFINE:
        gy = gy * tl.load(w_ptr + cols, mask=in_c, other=0.0).to(tl.float32)[None, :]
    dx = gy * r[None, :]
    if BATCH_STATS:
        x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + cols, mask=in_c, other=0.0)
        inv_n = 1.0 / tl.maximum(tl.load(count_ptr), 1.0)
        gmu = tl.load(gmu_ptr + cols, mask=in_c, other=0.0)
        gsig = tl.load(gsig_ptr + cols, mask=in_c, other=0.0)
        dx += (gmu[None, :] + 2.0 * gsig[None, :] * (x - mean[None, :])) * inv_n
    dx = tl.where(ok, dx, 0.0)
    tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=(rows < N)[:, None] & in_c[None, :])


def _pad_args(pad_mask: Optional[torch.Tensor], x: torch.Tensor):
    """(pointer tensor, stride over b, stride over t) of a B×T bool mask, read in place."""
    if pad_mask is None:
        return x, 0, 0  # a never-read pointer: HAS_PAD is off
    pad = pad_mask if pad_mask.dtype == torch.bool else pad_mask.to(torch.bool)
    return pad.view(torch.uint8), pad.stride(0), pad.stride(1)


def _reduce_grid(C):
    return (triton.cdiv(C, REDUCE_COLS),)


def _tile_grid(N, C):
    return (triton.cdiv(N, TILE_ROWS), triton.cdiv(C, TILE_COLS))


def _batch_moments(x2, pad, has_pad, B, sync):
    """(mean, var, count) of the real rows of x2 (N×C), float32, over every worker when ``sync``."""
    N, C = x2.shape
    pad_t, sb, st = pad
    mean = torch.empty(C, device=x2.device, dtype=torch.float32)
    var = torch.empty_like(mean)
    count = torch.empty((), device=x2.device, dtype=torch.float32)
    common = dict(HAS_PAD=has_pad, BLOCK_R=REDUCE_ROWS, BLOCK_C=REDUCE_COLS)
    if not sync:
        _bn_stats_kernel[_reduce_grid(C)](x2, pad_t, mean, var, count, N, C, B, sb, st,
                                          SUM_PASS=True, M2_PASS=True, **common)
        return mean, var, count
    # the same two passes as the torch path: Σx and n summed over workers, then Σ (x − μ)²/n
    _bn_stats_kernel[_reduce_grid(C)](x2, pad_t, mean, var, count, N, C, B, sb, st,
                                      SUM_PASS=True, M2_PASS=False, **common)
    sums = torch.cat([mean * count, count.reshape(1)])
    dist.all_reduce(sums)
    count = sums[-1].contiguous()
    mean = (sums[:-1] / count.clamp(min=1)).contiguous()
    _bn_stats_kernel[_reduce_grid(C)](x2, pad_t, mean, var, count, N, C, B, sb, st,
                                      SUM_PASS=False, M2_PASS=True, **common)
    dist.all_reduce(var)
    return mean, var, count


class _BatchNormFunction(torch.autograd.Function):
    """Masked BatchNorm forward and backward; returns (y, μ_B, σ²_B) with batch statistics so
    that a loss on μ_B and σ²_B (the RBN penalty) gets its gradient in the same backward."""

    @staticmethod
    def forward(ctx, x, pad_mask, weight, bias, running_mean, running_var, num_batches_tracked,
                eps, momentum, batch_stats, update_running, sync):
        T, B, C = x.shape
        x2 = x.contiguous().view(T * B, C)
        pad = _pad_args(pad_mask, x2)
        if batch_stats:
            mean, var, count = _batch_moments(x2, pad, pad_mask is not None, B, sync)
        else:
            mean, var, count = running_mean.float(), running_var.float(), None
        y = torch.empty_like(x2)
        affine = weight is not None
        _bn_apply_kernel[_tile_grid(T * B, C)](
            x2, pad[0], y, mean, var, weight, bias, count, running_mean, running_var,
            num_batches_tracked, T * B, C, B, pad[1], pad[2], eps, momentum,
            HAS_PAD=pad_mask is not None, AFFINE=affine, UPDATE_RUNNING=update_running,
            BLOCK_R=TILE_ROWS, BLOCK_C=TILE_COLS)
        ctx.save_for_backward(x2, pad_mask, weight, mean, var, count)
        ctx.eps, ctx.batch_stats, ctx.sync, ctx.shape = eps, batch_stats, sync, x.shape
        ctx.set_materialize_grads(False)
        if not batch_stats:
            return y.view(T, B, C), None, None
        return y.view(T, B, C), mean, var

    @staticmethod
    def backward(ctx, gy, gmean, gvar):
        x2, pad_mask, weight, mean, var, count = ctx.saved_tensors
        N, C = x2.shape
        B = ctx.shape[1]
        if gy is None:
            gy = torch.zeros_like(x2)
        gy = gy.contiguous().view(N, C)
        pad = _pad_args(pad_mask, x2)
        affine = weight is not None
        dw = torch.empty(C, device=x2.device, dtype=torch.float32) if affine else None
        db = torch.empty_like(dw) if affine else None
        gmu = torch.empty(C, device=x2.device, dtype=torch.float32) if ctx.batch_stats else None
        gsig = torch.empty_like(gmu) if ctx.batch_stats else None
        flags = dict(HAS_PAD=pad_mask is not None, AFFINE=affine, BATCH_STATS=ctx.batch_stats)
        _bn_grad_sums_kernel[_reduce_grid(C)](
            gy, x2, pad[0], mean, var, weight, gmean, gvar, dw, db, gmu, gsig, N, C, B,
            pad[1], pad[2], ctx.eps, HAS_GMEAN=gmean is not None, HAS_GVAR=gvar is not None,
            BLOCK_R=REDUCE_ROWS, BLOCK_C=REDUCE_COLS, **flags)
        if ctx.sync and ctx.batch_stats:
            # μ_B and σ²_B are shared by every worker: their gradients are summed over workers
            both = torch.cat([gmu, gsig])
            dist.all_reduce(both)
            gmu, gsig = both[:C], both[C:]
        dx = torch.empty_like(gy)
        _bn_grad_input_kernel[_tile_grid(N, C)](
            gy, x2, pad[0], dx, mean, var, weight, gmu, gsig, count, N, C, B, pad[1], pad[2],
            ctx.eps, BLOCK_R=TILE_ROWS, BLOCK_C=TILE_COLS, **flags)
        if affine:
            dw, db = dw.to(weight.dtype), db.to(weight.dtype)
        return dx.view(ctx.shape), None, dw, db, None, None, None, None, None, None, None, None


def batch_norm(x, pad_mask, weight, bias, running_mean, running_var, num_batches_tracked, *,
               eps: float, momentum: float, batch_stats: bool, update_running: bool,
               sync: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Masked BatchNorm of T×B×C ``x`` in fused kernels: (y, mean, var) where mean and var
    are the batch statistics (differentiable) or, without ``batch_stats``, the running ones."""
    y, mean, var = _BatchNormFunction.apply(
        x, pad_mask, weight, bias, running_mean, running_var, num_batches_tracked,
        eps, momentum, batch_stats, update_running, sync)
    if not batch_stats:
        return y, running_mean, running_var
    return y, mean, var
