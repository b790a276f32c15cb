"""Fused Triton kernels for masked BatchNorm (the torch code in batch.py is the reference they
are tested against), and the split reductions that triton_power.py shares for PowerNorm.

``x`` of shape T×B×C is read as N = T·B rows of C channels; row i is the token
(t, b) = divmod(i, B), and the B×T ``pad_mask`` (True at padding) is read in place. Statistics
and gradient sums are float32 whatever the input dtype; outputs are in the input dtype; padding
never enters a sum and outputs 0: a tile is loaded within the array's bounds and its padding
rows (whatever they hold, NaN included) are zeroed before any arithmetic, so that the load does
not wait for the mask's. Every sum over tokens is split: a grid of channel blocks × row splits,
each program looping over the row blocks of its split and leaving one partial per channel; the
next kernel's programs merge the partials of their own channels in a fixed order (no atomics,
so two runs are bitwise equal). A training step is four launches: statistics, normalise
(+ running update), gradient sums, input gradient. Synced statistics are all-reduced by torch
between two kernels.

A launch is memory-bound: its grid is one wave of the programs the GPU keeps resident
(triton_grid.py, from the compiled kernel's registers), each a tile of BLOCK_C channels × the
rows that hold TILE_BYTES of every tensor it streams, over 16 warps (32 bytes a thread and
tensor in flight). Wide programs keep the splits few: every program of the next kernel merges
all partials of its channels.

The two torch.library custom ops declare the buffers they update, so that
torch.compile(fullgraph=True) traces them and each buffer is updated once per step; an
autograd.Function (torch refuses an autograd formula on an op that mutates) calls the ops where
torch.compile traces and their Python bodies, which launch the kernels, in eager mode (a custom
op's dispatch costs more host time than the launches). This module imports triton: batch.py
imports it only when a norm runs with impl="triton".
"""
from typing import Optional, Tuple

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from .triton_grid import cdiv, next_power_of_2, resident_programs, traced

BLOCK_C = 64  # channels of a tile: row segments of 128 bytes in 16-bit types, 256 in float32
WARPS = 16  # a program's warps
TILE_BYTES = 32 * WARPS * 32  # of each streamed tensor a program loads at once: 32 bytes a thread
SPLIT_CHUNK = 16  # partials a merge loads at once (registers bounded whatever the split count)


def split_plan(kernel, args, options, n_rows: int, col_blocks: int, device: torch.device):
    """(grid, rows per split, splits) of a launch of ``kernel`` that reduces ``n_rows`` rows in
    ``col_blocks`` column blocks × splits: as many programs as the GPU keeps resident, each
    reducing a whole number of BLOCK_R row blocks. ``args`` are the launch's arguments before
    its rows per split (a dtype stands for an output not yet allocated)."""
    block_r = options["BLOCK_R"]
    # any multiple of BLOCK_R stands for the rows per split, but 1 (Triton would make it a constant)
    programs = resident_programs(kernel, (*args, 2 * block_r), options, device)
    # one wave: a program more than the GPU holds would run after the others
    splits = max(1, min(programs // col_blocks, cdiv(n_rows, block_r)))
    rows = max(block_r, cdiv(cdiv(n_rows, splits), block_r) * block_r)
    splits = max(1, cdiv(n_rows, rows))
    return (col_blocks, splits), rows, splits


def pad_args(pad_mask: Optional[torch.Tensor], x: torch.Tensor):
    """(pointer tensor, stride over b, stride over t) of a B×T bool mask, read in place."""
    if pad_mask is None:
        return x, 0, 0  # a never-read pointer: HAS_PAD is off
    pad = pad_mask if pad_mask.dtype == torch.bool else pad_mask.to(torch.bool)
    return pad.view(torch.uint8), pad.stride(0), pad.stride(1)


@triton.jit
def real_rows(rows, N, B, pad_ptr, pad_sb, pad_st, HAS_PAD: tl.constexpr):
    """True at rows < N that are real tokens (pad_mask[b, t] False for row = t·B + b)."""
    real = rows < N
    if HAS_PAD:
        pad = tl.load(pad_ptr + (rows % B) * pad_sb + (rows // B) * pad_st, mask=real, other=1)
        real = real & (pad == 0)
    return real


@triton.jit
def load_tile(ptr, rows, cols, N, C, real):
    """The float32 tile ``rows`` × ``cols`` of an N×C array, 0 at rows that are not ``real``.
    The load is masked by the array's bounds only, so that it does not wait for the padding
    mask (both loads are in flight together), and whatever padding holds, NaN included, becomes
    0 before any arithmetic."""
    inside = (rows < N)[:, None] & (cols < C)[None, :]
    x = tl.load(ptr + rows[:, None].to(tl.int64) * C + cols[None, :], mask=inside, other=0.0)
    return tl.where(real[:, None], x.to(tl.float32), 0.0)


@triton.jit
def store_tile(ptr, rows, cols, N, C, real, value):
    """Store the tile ``value`` at ``rows`` × ``cols`` of an N×C array, 0 at rows not ``real``."""
    inside = (rows < N)[:, None] & (cols < C)[None, :]
    tl.store(ptr + rows[:, None].to(tl.int64) * C + cols[None, :],
             tl.where(real[:, None], value, 0.0).to(ptr.dtype.element_ty), mask=inside)


@triton.jit
def sum_splits(part_ptr, S, C, cols, in_c, CHUNK: tl.constexpr):
    """Σ over the S rows of an S×C array of partial sums, for channels ``cols``, in a fixed order
    (CHUNK rows at a time, summed per lane, reduced once)."""
    total = tl.zeros([CHUNK, cols.shape[0]], tl.float32)
    for s0 in range(0, S, CHUNK):
        s = s0 + tl.arange(0, CHUNK)
        ok = (s < S)[:, None] & in_c[None, :]
        total += tl.load(part_ptr + s[:, None] * C + cols[None, :], mask=ok, other=0.0)
    return tl.sum(total, 0)


@triton.jit
def _merge_moments(mean, m2, n):
    """(mean, M2 = Σ (x − mean)², count) per channel of K disjoint sets of rows given as K×C
    arrays of theirs: Chan et al.'s merge, M2 = Σ_k M2_k + n_k (mean_k − mean)²."""
    total = tl.sum(n, 0)
    merged = tl.sum(n * mean, 0) / tl.maximum(total, 1.0)
    delta = mean - merged[None, :]
    return merged, tl.sum(m2 + n * delta * delta, 0), total


@triton.jit
def _bn_stats_kernel(x_ptr, pad_ptr, part_ptr, cnt_ptr, N, C, B, pad_sb, pad_st, split_rows,
                     HAS_PAD: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    # (count, mean, M2) of the real rows of one split: a Welford update per lane (row of the
    # tile) and channel, then the lanes merged once, as PyTorch's and apex's BN kernels do
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    in_c = cols < C
    split = tl.program_id(1)
    start = split * split_rows
    mean = tl.zeros([BLOCK_R, BLOCK_C], tl.float32)
    m2 = tl.zeros([BLOCK_R, BLOCK_C], tl.float32)
    n = tl.zeros([BLOCK_R], tl.float32)
    for r0 in range(start, tl.minimum(start + split_rows, N), BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        real = real_rows(rows, N, B, pad_ptr, pad_sb, pad_st, HAS_PAD)
        x = load_tile(x_ptr, rows, cols, N, C, real)
        n += real.to(tl.float32)
        delta = tl.where(real[:, None], x - mean, 0.0)
        mean += delta * (1.0 / tl.maximum(n, 1.0))[:, None]  # one division a lane, not an element
        m2 += delta * (x - mean)
    mean, m2, n = _merge_moments(mean, m2, n[:, None] + tl.zeros_like(mean))
    tl.store(part_ptr + split * C + cols, mean, mask=in_c)
    tl.store(part_ptr + (tl.num_programs(1) + split) * C + cols, m2, mask=in_c)
    if tl.program_id(0) == 0:
        tl.store(cnt_ptr + split, tl.max(n, 0))


@triton.jit
def _bn_apply_kernel(x_ptr, pad_ptr, y_ptr, part_ptr, cnt_ptr, S, mean_ptr, var_ptr, count_ptr,
                     w_ptr, b_ptr, run_mean_ptr, run_var_ptr, tracked_ptr, N, C, B, pad_sb, pad_st,
                     eps, momentum, split_rows, HAS_PAD: tl.constexpr, AFFINE: tl.constexpr,
                     BATCH_STATS: tl.constexpr, UPDATE_RUNNING: tl.constexpr,
                     BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, CHUNK: tl.constexpr):
    # merge the S splits' moments of these channels (or read the running ones), then
    # y = γ (x − μ)/sqrt(σ² + ε) + β over this split's rows, 0 at padding; split 0 also stores
    # μ_B, σ²_B and takes the EMA step of the running statistics (none for a batch without tokens)
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    in_c = cols < C
    split = tl.program_id(1)
    if BATCH_STATS:
        # the splits' moments merged as in _merge_moments, CHUNK splits at a time: first the
        # count and the mean, then M2 around that mean
        counts = tl.zeros([CHUNK], tl.float32)
        mean_sum = tl.zeros([CHUNK, BLOCK_C], tl.float32)
        for s0 in range(0, S, CHUNK):
            s = s0 + tl.arange(0, CHUNK)
            ok = (s < S)[:, None] & in_c[None, :]
            n_s = tl.load(cnt_ptr + s, mask=s < S, other=0.0)
            counts += n_s
            mean_sum += n_s[:, None] * tl.load(part_ptr + s[:, None] * C + cols[None, :], mask=ok, other=0.0)
        count = tl.sum(counts, 0)
        mean = tl.sum(mean_sum, 0) / tl.maximum(count, 1.0)
        m2 = tl.zeros([CHUNK, BLOCK_C], tl.float32)
        for s0 in range(0, S, CHUNK):
            s = s0 + tl.arange(0, CHUNK)
            ok = (s < S)[:, None] & in_c[None, :]
            offs = s[:, None] * C + cols[None, :]
            delta = tl.load(part_ptr + offs, mask=ok, other=0.0) - mean[None, :]
            m2 += tl.load(part_ptr + S * C + offs, mask=ok, other=0.0) + (
                tl.load(cnt_ptr + s, mask=s < S, other=0.0)[:, None] * delta * delta)
        var = tl.sum(m2, 0) / tl.maximum(count, 1.0)
    else:
        mean = tl.load(run_mean_ptr + cols, mask=in_c, other=0.0).to(tl.float32)
        var = tl.load(run_var_ptr + cols, mask=in_c, other=1.0).to(tl.float32)
        count = 0.0
    if split == 0:
        tl.store(mean_ptr + cols, mean, mask=in_c)
        tl.store(var_ptr + cols, var, mask=in_c)
        if tl.program_id(0) == 0:
            tl.store(count_ptr, count)
        if UPDATE_RUNNING:
            rho = tl.where(count > 0, momentum, 0.0)
            run_mean = tl.load(run_mean_ptr + cols, mask=in_c, other=0.0)
            run_var = tl.load(run_var_ptr + cols, mask=in_c, other=1.0)
            tl.store(run_mean_ptr + cols, run_mean + rho * (mean - run_mean), mask=in_c)
            tl.store(run_var_ptr + cols, run_var + rho * (var - run_var), mask=in_c)
            if tl.program_id(0) == 0:
                tl.store(tracked_ptr, tl.load(tracked_ptr) + (count > 0).to(tl.int64))
    r = tl.rsqrt(var + eps)
    if AFFINE:
        w = tl.load(w_ptr + cols, mask=in_c, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=in_c, other=0.0).to(tl.float32)
    start = split * split_rows
    for r0 in range(start, tl.minimum(start + split_rows, N), BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        real = real_rows(rows, N, B, pad_ptr, pad_sb, pad_st, HAS_PAD)
        y = (load_tile(x_ptr, rows, cols, N, C, real) - mean[None, :]) * r[None, :]
        if AFFINE:
            y = y * w[None, :] + b[None, :]
        store_tile(y_ptr, rows, cols, N, C, real, y)


@triton.jit
def _bn_grad_sums_kernel(gy_ptr, x_ptr, pad_ptr, mean_ptr, var_ptr, part_ptr, N, C, B, pad_sb,
                         pad_st, eps, split_rows, HAS_PAD: tl.constexpr,
                         BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    # one split's Σ m·gy (dβ) and Σ m·gy·x̂ (dγ) per channel, summed per lane, reduced once
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    in_c = cols < C
    split = tl.program_id(1)
    mean = tl.load(mean_ptr + cols, mask=in_c, other=0.0)
    db = tl.zeros([BLOCK_R, BLOCK_C], tl.float32)
    dw = tl.zeros([BLOCK_R, BLOCK_C], tl.float32)
    start = split * split_rows
    for r0 in range(start, tl.minimum(start + split_rows, N), BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        real = real_rows(rows, N, B, pad_ptr, pad_sb, pad_st, HAS_PAD)
        gy = load_tile(gy_ptr, rows, cols, N, C, real)
        x = load_tile(x_ptr, rows, cols, N, C, real)
        db += gy
        dw += gy * (x - mean[None, :])  # gy is 0 at padding
    r = tl.rsqrt(tl.load(var_ptr + cols, mask=in_c, other=1.0) + eps)
    tl.store(part_ptr + split * C + cols, tl.sum(db, 0), mask=in_c)
    tl.store(part_ptr + (tl.num_programs(1) + split) * C + cols, tl.sum(dw, 0) * r, mask=in_c)


@triton.jit
def _bn_grad_input_kernel(gy_ptr, x_ptr, pad_ptr, dx_ptr, part_ptr, S, gmean_ptr, gvar_ptr,
                          mean_ptr, var_ptr, count_ptr, w_ptr, dw_ptr, db_ptr, N, C, B, pad_sb,
                          pad_st, eps, split_rows, HAS_PAD: tl.constexpr, AFFINE: tl.constexpr,
                          PARAM_GRADS: tl.constexpr, BATCH_STATS: tl.constexpr,
                          HAS_GMEAN: tl.constexpr, HAS_GVAR: tl.constexpr,
                          BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, CHUNK: tl.constexpr):
    # merge dβ, dγ of these channels (split 0 stores them), then with batch statistics the total
    # gradients ∂L/∂μ_B = gmean − r·γ·dβ, ∂L/∂σ²_B = gvar − ½ r²·γ·dγ (r = 1/sqrt(σ²_B + ε)) and
    # ∂L/∂x = m·(γ·gy·r + (∂L/∂μ_B)/n + 2 (∂L/∂σ²_B)(x − μ_B)/n) over this split's rows
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    in_c = cols < C
    split = tl.program_id(1)
    mean = tl.load(mean_ptr + cols, mask=in_c, other=0.0)
    r = tl.rsqrt(tl.load(var_ptr + cols, mask=in_c, other=1.0) + eps)
    if AFFINE:
        w = tl.load(w_ptr + cols, mask=in_c, other=0.0).to(tl.float32)
    else:
        w = tl.full([BLOCK_C], 1.0, dtype=tl.float32)
    if AFFINE or BATCH_STATS:
        db = sum_splits(part_ptr, S, C, cols, in_c, CHUNK)
        dw = sum_splits(part_ptr + S * C, S, C, cols, in_c, CHUNK)
    if PARAM_GRADS:
        if split == 0:
            tl.store(dw_ptr + cols, dw.to(dw_ptr.dtype.element_ty), mask=in_c)
            tl.store(db_ptr + cols, db.to(db_ptr.dtype.element_ty), mask=in_c)
    if BATCH_STATS:
        gmu = -(w * db) * r  # the order of γ·gy·r below: one real token cancels exactly
        gsig = -0.5 * r * r * w * dw
        if HAS_GMEAN:
            gmu += tl.load(gmean_ptr + cols, mask=in_c, other=0.0).to(tl.float32)
        if HAS_GVAR:
            gsig += tl.load(gvar_ptr + cols, mask=in_c, other=0.0).to(tl.float32)
        inv_n = 1.0 / tl.maximum(tl.load(count_ptr), 1.0)
    start = split * split_rows
    for r0 in range(start, tl.minimum(start + split_rows, N), BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        real = real_rows(rows, N, B, pad_ptr, pad_sb, pad_st, HAS_PAD)
        dx = load_tile(gy_ptr, rows, cols, N, C, real) * w[None, :] * r[None, :]
        if BATCH_STATS:
            x = load_tile(x_ptr, rows, cols, N, C, real)
            dx += (gmu[None, :] + 2.0 * gsig[None, :] * (x - mean[None, :])) * inv_n
        store_tile(dx_ptr, rows, cols, N, C, real, dx)


def _options(x2, N, pad_mask, **flags):
    """Constexprs and warps of the streaming kernels for N×C ``x2``: tiles of BLOCK_C channels ×
    the rows that hold TILE_BYTES (fewer for fewer tokens)."""
    rows = min(TILE_BYTES // (BLOCK_C * x2.element_size()), next_power_of_2(max(N, 1)))
    return dict(flags, HAS_PAD=pad_mask is not None, BLOCK_R=rows, BLOCK_C=BLOCK_C, num_warps=WARPS)


def empty_grads(x, weight):
    """Uninitialised (∂L/∂x, ∂L/∂γ, ∂L/∂β): contiguous like x; like γ, or empty without γ."""
    param = x.new_empty(0) if weight is None else torch.empty_like(weight)
    return torch.empty_like(x, memory_format=torch.contiguous_format), param, torch.empty_like(param)


def _synced_moments(part, cnt):
    """The (mean, M2) and count of the real rows of every worker as one split: Σx and n
    all-reduced, then each split's M2 moved to the global mean and all-reduced."""
    local_mean, local_m2 = part.unbind(0)
    sums = torch.cat([(cnt[:, None] * local_mean).sum(0), cnt.sum().reshape(1)])
    dist.all_reduce(sums)
    count = sums[-1:]
    mean = sums[:-1] / count.clamp(min=1)
    m2 = (local_m2 + cnt[:, None] * (local_mean - mean).square()).sum(0)
    dist.all_reduce(m2)
    return torch.stack([mean, m2])[:, None], count


def forward_launches(x: torch.Tensor, pad_mask: Optional[torch.Tensor], weight: Optional[torch.Tensor],
                     bias: Optional[torch.Tensor], running_mean: torch.Tensor, running_var: torch.Tensor,
                     num_batches_tracked: torch.Tensor, eps: float, momentum: float, batch_stats: bool,
                     update_running: bool, sync: bool
                     ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, μ, σ², n): the statistics that normalised x (the batch's, or the running ones) and the
    number of real tokens (0 without batch statistics)."""
    T, B, C = x.shape
    N = T * B
    x2 = x.contiguous()  # read as N×C
    pad_t, sb, st = pad_args(pad_mask, x2)
    col_blocks = cdiv(C, BLOCK_C)
    f32 = dict(device=x.device, dtype=torch.float32)
    if batch_stats:
        options = _options(x2, N, pad_mask)
        head = (x2, pad_t, torch.float32, torch.float32, N, C, B, sb, st)
        grid, split_rows, splits = split_plan(_bn_stats_kernel, head, options, N, col_blocks, x.device)
        part, cnt = torch.empty(2, splits, C, **f32), torch.empty(splits, **f32)  # per split: mean, M2
        _bn_stats_kernel[grid](x2, pad_t, part, cnt, N, C, B, sb, st, split_rows, **options)
        if sync:
            part, cnt = _synced_moments(part, cnt)
            splits = 1
    else:
        part, cnt, splits = running_mean, running_mean, 0  # the running statistics normalise
    mean, var, count = torch.empty(C, **f32), torch.empty(C, **f32), torch.empty((), **f32)
    y = torch.empty_like(x2)
    options = _options(x2, N, pad_mask, AFFINE=weight is not None, BATCH_STATS=batch_stats,
                       UPDATE_RUNNING=update_running, CHUNK=SPLIT_CHUNK)
    head = (x2, pad_t, y, part, cnt, splits, mean, var, count, weight, bias, running_mean,
            running_var, num_batches_tracked, N, C, B, sb, st, eps, momentum)
    grid, split_rows, _ = split_plan(_bn_apply_kernel, head, options, N, col_blocks, x.device)
    _bn_apply_kernel[grid](*head, split_rows, **options)
    return y, mean, var, count


def backward_launches(gy: torch.Tensor, gmean: Optional[torch.Tensor], gvar: Optional[torch.Tensor],
                      x: torch.Tensor, pad_mask: Optional[torch.Tensor], weight: Optional[torch.Tensor],
                      mean: torch.Tensor, var: torch.Tensor, count: torch.Tensor, eps: float,
                      batch_stats: bool, sync: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(∂L/∂x, ∂L/∂γ, ∂L/∂β) from the gradients of y, μ_B and σ²_B (empty γ, β grads without affine)."""
    T, B, C = x.shape
    N = T * B
    x2, gy2 = x.contiguous(), gy.contiguous()  # read as N×C
    pad_t, sb, st = pad_args(pad_mask, x2)
    col_blocks = cdiv(C, BLOCK_C)
    affine = weight is not None
    part, splits = mean, 0  # no sums to merge
    if affine or batch_stats:
        options = _options(x2, N, pad_mask)
        head = (gy2, x2, pad_t, mean, var, torch.float32, N, C, B, sb, st, eps)
        grid, split_rows, splits = split_plan(_bn_grad_sums_kernel, head, options, N, col_blocks, x.device)
        part = torch.empty(2, splits, C, device=x.device, dtype=torch.float32)  # per split: dβ, dγ
        _bn_grad_sums_kernel[grid](gy2, x2, pad_t, mean, var, part, N, C, B, sb, st, eps, split_rows,
                                   **options)
    dx, dw, db = empty_grads(x, weight)
    if sync and batch_stats:
        # μ_B and σ²_B are every worker's: the merge sees the sums over workers (gmean, gvar
        # included); γ and β get this worker's sums, as on the torch path
        local = part.sum(1)
        zeros = torch.zeros_like(local[0])
        both = torch.cat([local, torch.stack([zeros if g is None else g for g in (gmean, gvar)])])
        dist.all_reduce(both)
        part, gmean, gvar, splits = both[:2, None], both[2], both[3], 1
        if affine:
            db.copy_(local[0])
            dw.copy_(local[1])
    options = _options(x2, N, pad_mask, AFFINE=affine, PARAM_GRADS=affine and not (sync and batch_stats),
                       BATCH_STATS=batch_stats, HAS_GMEAN=gmean is not None, HAS_GVAR=gvar is not None,
                       CHUNK=SPLIT_CHUNK)
    head = (gy2, x2, pad_t, dx, part, splits, gmean, gvar, mean, var, count, weight, dw, db,
            N, C, B, sb, st, eps)
    grid, split_rows, _ = split_plan(_bn_grad_input_kernel, head, options, N, col_blocks, x.device)
    _bn_grad_input_kernel[grid](*head, split_rows, **options)
    return dx, dw, db


_forward = torch.library.custom_op("normplug::batch_norm_forward", forward_launches,
                                   mutates_args=("running_mean", "running_var", "num_batches_tracked"))
_backward = torch.library.custom_op("normplug::batch_norm_backward", backward_launches, mutates_args=())


@_forward.register_fake
def _(x, pad_mask, weight, bias, running_mean, running_var, num_batches_tracked, eps, momentum,
      batch_stats, update_running, sync):
    stat = x.new_empty(x.shape[-1], dtype=torch.float32)
    return (torch.empty_like(x, memory_format=torch.contiguous_format), stat, torch.empty_like(stat),
            x.new_empty((), dtype=torch.float32))


@_backward.register_fake
def _(gy, gmean, gvar, x, pad_mask, weight, mean, var, count, eps, batch_stats, sync):
    return empty_grads(x, weight)


class _BatchNorm(torch.autograd.Function):
    """The two ops as one differentiable function of (x, γ, β) returning (y, μ, σ², n); μ and σ²
    are differentiable with batch statistics, so that the RBN penalty gets its gradient."""

    @staticmethod
    def forward(ctx, x, pad_mask, weight, bias, running_mean, running_var, num_batches_tracked,
                eps, momentum, batch_stats, update_running, sync):
        y, mean, var, count = traced(_forward, forward_launches)(
            x, pad_mask, weight, bias, running_mean, running_var, num_batches_tracked, eps, momentum,
            batch_stats, update_running, sync)
        ctx.save_for_backward(x, pad_mask, weight, mean, var, count)
        ctx.options = (eps, batch_stats, sync)
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(count)
        if not batch_stats:
            ctx.mark_non_differentiable(mean, var)
        return y, mean, var, count

    @staticmethod
    def backward(ctx, gy, gmean, gvar, _gcount):
        x, pad_mask, weight, mean, var, count = ctx.saved_tensors
        if gy is None:  # a loss on the statistics alone
            gy = torch.zeros_like(x)
        dx, dw, db = traced(_backward, backward_launches)(gy, gmean, gvar, x, pad_mask, weight, mean,
                                                          var, count, *ctx.options)
        if weight is None:
            dw = db = None
        return dx, None, dw, db, None, None, None, None, None, None, None, None


def batch_norm(x, pad_mask, weight, bias, running_mean, running_var, num_batches_tracked, *,
               eps: float, momentum: float, batch_stats: bool, update_running: bool,
               sync: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Masked BatchNorm of T×B×C ``x`` in fused kernels: (y, mean, var) where mean and var
    are the batch statistics (differentiable) or, without ``batch_stats``, the running ones."""
    y, mean, var, _ = _BatchNorm.apply(x, pad_mask, weight, bias, running_mean, running_var,
                                       num_batches_tracked, eps, momentum, batch_stats,
                                       update_running, sync)
    if not batch_stats:
        return y, running_mean, running_var
    return y, mean, var
