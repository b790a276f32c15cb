"""Fused Triton kernels for the per-token norms: LayerNorm-simple, DetachNorm and AdaNorm
(Xu et al., "Understanding and Improving Layer Normalization", NeurIPS 2019), RMSNorm
(Zhang & Sennrich, NeurIPS 2019) and ScaleNorm (Nguyen & Salazar, IWSLT 2019).

One forward and one backward kernel, each over tiles of whole tokens (rows of C channels, at
most MAX_ROW_CHANNELS: a token is held in registers), specialised by constexpr flags into each
norm; per_token.py states the same equations in plain torch, and that path is the reference
the tests hold these kernels to. A call is one launch forward (a program per tile) and one
backward (as many programs as the GPU keeps resident, triton_grid.py, each striding over
tiles), plus torch's sum of the backward programs' shares of RMSNorm's and ScaleNorm's
parameter gradient.
Statistics are float32 for fp16/bf16/fp32 input (float64 for float64, though ε, k and C
reach a compiled kernel as float32 numbers), outputs in the input's dtype. The forward
saves each token's statistics; the backward reads them back.

This module imports triton at its top: per_token.py imports it on the first fused call only,
so that ``import normplug`` works without triton. The launches are torch.library custom ops
with fake implementations, called from an autograd.Function where torch.compile traces (so
that torch.compile(fullgraph=True) traces a fused norm as one opaque op, forward and backward),
and directly in eager mode, which skips the dispatcher's host cost.
"""
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from .impl import MAX_ROW_CHANNELS, check_width
from .triton_grid import cdiv, next_power_of_2, resident_programs, traced

# Which norm a kernel computes (the constexpr KIND: each is compiled separately); a kernel
# reads only globals that are tl.constexpr, the host their int values.
SIMPLE = tl.constexpr(0)  # y = (x − μ) / (s + ε), s the unbiased std (LayerNorm-simple, DetachNorm)
ADANORM = tl.constexpr(1)  # z = C·(1 − k·sg(y)) ⊙ y with y as SIMPLE
RMS = tl.constexpr(2)  # y = w ⊙ x / sqrt(mean(x²) + ε)
SCALE = tl.constexpr(3)  # y = g · x / max(‖x‖₂, ε)
KINDS = {"layer_simple": SIMPLE.value, "detach": SIMPLE.value, "adanorm": ADANORM.value,
         "rms": RMS.value, "scale": SCALE.value}

WARPS = 8  # a program's warps, more where one token needs them
# elements a thread holds of each tile: rows of a narrow norm share a program
FORWARD_PER_THREAD, BACKWARD_PER_THREAD = 16, 8


@triton.jit
def _forward_kernel(X, Y, P, STATS, n_rows, n_cols, eps, k, scale,
                    KIND: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    acc = STATS.dtype.element_ty
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    row_ok = rows < n_rows
    mask = row_ok[:, None] & (cols < n_cols)[None, :]
    offs = rows.to(tl.int64)[:, None] * n_cols + cols[None, :]
    x = tl.load(X + offs, mask=mask, other=0.0).to(acc)
    if KIND <= ADANORM:
        mean = tl.sum(x, 1) / n_cols
        d = tl.where(mask, x - mean[:, None], 0.0)
        std = tl.sqrt(tl.sum(d * d, 1) / (n_cols - 1))
        y = d / (std + eps)[:, None]
        if KIND == ADANORM:
            y = scale * (1 - k * y) * y
        tl.store(STATS + rows, mean, mask=row_ok)
        tl.store(STATS + n_rows + rows, std, mask=row_ok)
    elif KIND == RMS:
        r = 1 / tl.sqrt(tl.sum(x * x, 1) / n_cols + eps)
        w = tl.load(P + cols, mask=cols < n_cols, other=0.0).to(acc)
        y = x * r[:, None] * w[None, :]
        tl.store(STATS + rows, r, mask=row_ok)
    else:
        norm = tl.sqrt(tl.sum(x * x, 1))
        g = tl.load(P).to(acc)
        y = x * (g / tl.maximum(norm, eps))[:, None]
        tl.store(STATS + rows, norm, mask=row_ok)
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _backward_kernel(GY, X, P, STATS, DX, DP, n_rows, n_cols, eps, k, scale,
                     KIND: tl.constexpr, MEAN_GRAD: tl.constexpr, STD_GRAD: tl.constexpr,
                     BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    # persistent: a few programs (one per multiprocessor) stride over the row tiles, each
    # summing its share of the parameter's gradient in registers and storing it once
    acc = STATS.dtype.element_ty
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_C)
    col_ok = cols < n_cols
    if KIND == RMS:
        w = tl.load(P + cols, mask=col_ok, other=0.0).to(acc)
        dp = tl.zeros((BLOCK_C,), dtype=acc)
    elif KIND == SCALE:
        g = tl.load(P).to(acc)
        dp = tl.zeros((BLOCK_R,), dtype=acc)
    for tile in range(pid, tl.cdiv(n_rows, BLOCK_R), tl.num_programs(0)):
        rows = tile * BLOCK_R + tl.arange(0, BLOCK_R)
        row_ok = rows < n_rows
        mask = row_ok[:, None] & col_ok[None, :]
        offs = rows.to(tl.int64)[:, None] * n_cols + cols[None, :]
        x = tl.load(X + offs, mask=mask, other=0.0).to(acc)
        gy = tl.load(GY + offs, mask=mask, other=0.0).to(acc)
        if KIND <= ADANORM:
            mean = tl.load(STATS + rows, mask=row_ok, other=0.0)
            std = tl.load(STATS + n_rows + rows, mask=row_ok, other=0.0)
            sigma = std + eps
            d = tl.where(mask, x - mean[:, None], 0.0)
            if KIND == ADANORM:
                # the factor C·(1 − k·sg(y)) is a constant of the backward
                gy = gy * (scale * (1 - k * (d / sigma[:, None])))
            if MEAN_GRAD:  # through μ: every channel loses the token's mean gradient
                gy_c = tl.where(mask, gy - (tl.sum(gy, 1) / n_cols)[:, None], 0.0)
            else:
                gy_c = gy
            dx = gy_c / sigma[:, None]
            if STD_GRAD:
                # ∂s/∂x = (x − μ) / ((C − 1)·s); s = 0 only where x − μ is 0 (to underflow), and
                # the term is then 0, as in torch's std backward
                dot = tl.sum(gy * d, 1)
                coef = dot / (sigma * sigma * (n_cols - 1) * tl.where(std > 0, std, 1.0))
                dx = dx - d * coef[:, None]
        elif KIND == RMS:
            # ∂L/∂x = r·(∂L/∂y ⊙ w) − x·r³·mean(∂L/∂y ⊙ w ⊙ x), r = 1/sqrt(mean(x²) + ε)
            r = tl.load(STATS + rows, mask=row_ok, other=0.0)
            gw = gy * w[None, :]
            dx = r[:, None] * gw - x * (r * r * r * tl.sum(gw * x, 1) / n_cols)[:, None]
            dp += tl.sum(gy * x * r[:, None], 0)
        else:
            norm = tl.load(STATS + rows, mask=row_ok, other=0.0)
            clamped = tl.maximum(norm, eps)
            dot = tl.sum(gy * x, 1)
            # ∂L/∂x = g·∂L/∂y/max(‖x‖, ε) − g·(∂L/∂y · x)·x/‖x‖³, the second term only where
            # ‖x‖ ≥ ε: below, the clamp holds the denominator at ε and passes no gradient to it
            coef = tl.where(norm >= eps, g * dot / (clamped * clamped * clamped), 0.0)
            dx = (g / clamped)[:, None] * gy - coef[:, None] * x
            dp += dot / clamped  # padded rows add 0: their x and ∂L/∂y load as 0
        tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=mask)
    # this program's share of ∂L/∂param; the host sums the programs' rows
    if KIND == RMS:
        tl.store(DP + pid * n_cols + cols, dp, mask=col_ok)
    elif KIND == SCALE:
        tl.store(DP + pid, tl.sum(dp, 0))


def _stats_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _tile(n_rows: int, n_cols: int, per_thread: int):
    """(rows a tile, channel block, warps) for tokens of ``n_cols`` channels: ``per_thread``
    elements a thread over WARPS warps, or one token over more warps when it is wider."""
    block_c = next_power_of_2(n_cols)
    block_r = max(1, min(next_power_of_2(n_rows), per_thread * 32 * WARPS // block_c))
    return block_r, block_c, min(32, max(WARPS, block_r * block_c // (32 * per_thread)))


def forward_launches(x: torch.Tensor, param: Optional[torch.Tensor], kind: int, eps: float, k: float,
                     scale: float, mean_grad: bool, std_grad: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """(output, per-token statistics) of norm ``kind``; ``mean_grad``/``std_grad`` are read
    by the backward only."""
    x = x.contiguous()
    n_cols = x.shape[-1]
    n_rows = x.numel() // n_cols if n_cols else 0
    y = torch.empty_like(x)
    stats = torch.empty(2 if kind <= ADANORM.value else 1, n_rows, dtype=_stats_dtype(x), device=x.device)
    if n_rows:
        block_r, block_c, warps = _tile(n_rows, n_cols, FORWARD_PER_THREAD)
        _forward_kernel[(cdiv(n_rows, block_r),)](
            x, y, x if param is None else param, stats, n_rows, n_cols, eps, k, scale,
            KIND=kind, BLOCK_R=block_r, BLOCK_C=block_c, num_warps=warps)
    return y, stats


def backward_launches(gy: torch.Tensor, x: torch.Tensor, param: Optional[torch.Tensor], stats: torch.Tensor,
                      kind: int, eps: float, k: float, scale: float, mean_grad: bool,
                      std_grad: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """(∂L/∂x, ∂L/∂param) of norm ``kind``; the second is empty for a norm without one."""
    x, gy = x.contiguous(), gy.contiguous()
    n_cols = x.shape[-1]
    n_rows = stats.shape[1]
    dx = torch.empty_like(x)
    if n_rows == 0:
        dx.zero_()
        return dx, (x.new_empty(0) if param is None else torch.zeros_like(param))
    block_r, block_c, warps = _tile(n_rows, n_cols, BACKWARD_PER_THREAD)
    options = dict(KIND=kind, MEAN_GRAD=mean_grad, STD_GRAD=std_grad, BLOCK_R=block_r, BLOCK_C=block_c,
                   num_warps=warps)
    # persistent: as many programs as the GPU keeps resident, so that a parameter's partial
    # sums are programs × C, not tiles × C (Liger's RMSNorm backward does the same)
    head, tail = (gy, x, x if param is None else param, stats, dx), (n_rows, n_cols, eps, k, scale)
    resident = resident_programs(_backward_kernel, (*head, stats.dtype, *tail), options, x.device)
    grid = (min(cdiv(n_rows, block_r), resident),)
    if param is None:
        partial = stats  # not written: SIMPLE and ADANORM have no parameter
    else:
        partial = stats.new_empty((grid[0], n_cols) if kind == RMS.value else (grid[0],))
    _backward_kernel[grid](*head, partial, *tail, **options)
    if param is None:
        return dx, x.new_empty(0)
    return dx, partial.sum(0).reshape(param.shape).to(param.dtype)


_forward = torch.library.custom_op("normplug::per_token_forward", forward_launches, mutates_args=())
_backward = torch.library.custom_op("normplug::per_token_backward", backward_launches, mutates_args=())


@_forward.register_fake
def _forward_fake(x, param, kind, eps, k, scale, mean_grad, std_grad):
    n_rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            x.new_empty(2 if kind <= ADANORM.value else 1, n_rows, dtype=_stats_dtype(x)))


@_backward.register_fake
def _backward_fake(gy, x, param, stats, kind, eps, k, scale, mean_grad, std_grad):
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            x.new_empty(0) if param is None else torch.empty_like(param))


class _PerTokenNorm(torch.autograd.Function):
    """The two ops as one differentiable function of (x, param) returning the output."""

    @staticmethod
    def forward(ctx, x, param, *options):
        y, stats = traced(_forward, forward_launches)(x, param, *options)
        ctx.save_for_backward(x, param, stats)
        ctx.options = options
        return y

    @staticmethod
    def backward(ctx, gy):
        x, param, stats = ctx.saved_tensors
        dx, dparam = traced(_backward, backward_launches)(gy, x, param, stats, *ctx.options)
        return (dx, None if param is None else dparam) + (None,) * len(ctx.options)


def per_token_norm(x: torch.Tensor, norm: str, eps: float, *, param: Optional[torch.Tensor] = None,
                   k: float = 0.0, scale: float = 1.0, mean_grad: bool = True,
                   std_grad: bool = True) -> torch.Tensor:
    """Norm ``norm`` (a key of KINDS) of each token of ``x`` over its last dim, fused.

    ``param``: RMSNorm's weight or ScaleNorm's 0-dim g; ``k``, ``scale``: AdaNorm's k and C;
    ``mean_grad``/``std_grad`` False: DetachNorm's stop-gradient on μ / on s.
    """
    check_width(norm, "triton", x.shape[-1], MAX_ROW_CHANNELS, "a token")
    return _PerTokenNorm.apply(x, param, KINDS[norm], eps, k, scale, mean_grad, std_grad)
