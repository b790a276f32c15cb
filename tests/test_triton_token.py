"""The fused Triton kernels of the per-token norms against their plain-torch path.

The torch path is checked against float64 references of the papers' equations in
test_norms_per_token.py; here impl="triton" must give the same numbers. On the CPU the
kernels run under Triton's interpreter (TRITON_INTERPRET=1, set before triton is imported),
which is slow: shapes are small.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

pytest.importorskip("triton")

from normplug.norms import NormConfigError, create_norm  # noqa: E402
from normplug.norms.impl import MAX_ROW_CHANNELS  # noqa: E402
from normplug.norms import per_token  # noqa: E402
from normplug.norms import triton_token  # noqa: E402
from test_norms_per_token import CONFIGS as PER_TOKEN_CONFIGS  # noqa: E402

# (name, options) of every fused configuration: the torch tests' per-token configurations but `layer`
CONFIGS = [(name, opts) for name, opts in PER_TOKEN_CONFIGS if name != "layer"]
IDS = [name + "".join(f"-{k}={v}" for k, v in opts.items()) for name, opts in CONFIGS]
# T×B×C: C not a power of two (the kernels' channel block is), several tokens a tile;
# one token alone (T·B = 1)
SHAPES = [(5, 3, 40), (1, 1, 24)]


def make_pair(name, opts, dim, dtype=torch.float32, seed=0):
    """The same norm twice, impl="torch" then impl="triton", parameters random and equal."""
    pair = [create_norm(name, dim, impl=impl, **opts) for impl in ("torch", "triton")]
    gen = torch.Generator().manual_seed(seed)
    for p, q in zip(pair[0].parameters(), pair[1].parameters()):
        with torch.no_grad():
            p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
            q.copy_(p)
    return [norm.to(dtype) for norm in pair]


def inputs(shape, seed=0, dtype=torch.float32):
    """Tokens with differing offsets and spreads, and an upstream gradient with a mean."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen) * (1.5 * torch.rand(shape[:-1] + (1,), generator=gen) + 0.1)
    x = x + 0.5 * torch.randn(shape[:-1] + (1,), generator=gen)
    gy = torch.randn(shape, generator=gen) + 0.3
    return x.to(dtype), gy.to(dtype)


def run(norm, x, gy, pad_mask=None):
    """[output, ∂L/∂x, ∂L/∂param...] of ``norm`` at ``x`` for upstream gradient ``gy``."""
    xi = x.detach().clone().requires_grad_(True)
    y = norm(xi, pad_mask)
    return [y.detach(), *torch.autograd.grad(y, [xi, *norm.parameters()], gy)]


def assert_same(got, want, rtol):
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == b.dtype and a.shape == b.shape, i
        scale = b.float().abs().max().item()
        torch.testing.assert_close(a.float(), b.float(), rtol=rtol, atol=rtol * scale, msg=lambda m: f"tensor {i}: {m}")


@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
@pytest.mark.parametrize("name,opts", CONFIGS, ids=IDS)
def test_triton_matches_torch_float32(name, opts, shape):
    """Output, input gradient and parameter gradients to 1e-5 relative."""
    torch_norm, triton_norm = make_pair(name, opts, shape[-1])
    x, gy = inputs(shape)
    assert_same(run(triton_norm, x, gy), run(torch_norm, x, gy), rtol=1e-5)


class LaunchSpy:
    """A kernel's stand-in that records the grid of every launch and launches the kernel."""

    def __init__(self, kernel):
        self.kernel, self.grids = kernel, []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.kernel[grid]


@pytest.mark.parametrize("name,opts", CONFIGS, ids=IDS)
def test_backward_programs_stride_over_tiles(name, opts, monkeypatch):
    """Tiles of 2 tokens: 8 tiles for 15 tokens, the last one half empty; the forward runs a
    program per tile, the persistent backward 3 (the programs the GPU keeps resident, here),
    which stride over 3, 3 and 2 tiles and each add their share of a parameter's gradient."""
    monkeypatch.setattr(triton_token, "WARPS", 1)
    monkeypatch.setattr(triton_token, "FORWARD_PER_THREAD", 4)  # 128 elements a tile: 2 tokens of 64
    monkeypatch.setattr(triton_token, "BACKWARD_PER_THREAD", 4)
    monkeypatch.setattr(triton_token, "resident_programs", lambda *args: 3)
    forward = LaunchSpy(triton_token._forward_kernel)
    backward = LaunchSpy(triton_token._backward_kernel)
    monkeypatch.setattr(triton_token, "_forward_kernel", forward)
    monkeypatch.setattr(triton_token, "_backward_kernel", backward)
    torch_norm, triton_norm = make_pair(name, opts, 40)
    x, gy = inputs((5, 3, 40), seed=4)
    assert_same(run(triton_norm, x, gy), run(torch_norm, x, gy), rtol=1e-5)
    assert (forward.grids, backward.grids) == ([(8,)], [(3,)])


@pytest.mark.parametrize("name,opts", CONFIGS, ids=IDS)
def test_degenerate_tokens(name, opts):
    """Tokens that are zero, constant, or of norm below ε (ScaleNorm's clamp, the std's 0/0):
    the same finite numbers as the torch path. The constants are sums exact in float32, so
    that x − μ is exactly 0 in either path (else it is the rounding error of the mean, which
    differs between summation orders)."""
    x, gy = inputs((4, 2, 24), seed=5)
    x[0, 0] = 0.0
    x[1, 1] = 0.5
    x[2, 0] *= 1e-7
    x[3, 1] = -2.0
    torch_norm, triton_norm = make_pair(name, opts, 24)
    got = run(triton_norm, x, gy)
    assert all(torch.isfinite(t).all() for t in got)
    assert_same(got, run(torch_norm, x, gy), rtol=1e-5)


DETACH_MODES = [("layer_simple", {}), ("detach", {"detach": "mean"}), ("detach", {"detach": "std"}),
                ("detach", {"detach": "both"})]


def test_detach_modes_differ_in_their_gradient():
    """The four stop-gradient choices give four different input gradients here (and the
    same output): a kernel that forgets a detach, or detaches too much, fails the test above."""
    x, gy = inputs((5, 3, 40))
    results = [run(make_pair(name, opts, 40)[1], x, gy) for name, opts in DETACH_MODES]
    for i in range(len(results)):
        for j in range(i):
            torch.testing.assert_close(results[i][0], results[j][0], rtol=0, atol=0)
            gap = (results[i][1] - results[j][1]).abs().max() / results[j][1].abs().max()
            assert gap > 1e-2, (DETACH_MODES[i], DETACH_MODES[j], gap.item())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name,opts", CONFIGS, ids=IDS)
def test_half_precision(name, opts, dtype):
    """The module cast to fp16/bf16 (fairseq's --fp16/--bf16): output and gradients in that
    dtype, statistics in float32, close to the float32 torch path on the same rounded values."""
    x, gy = inputs((5, 3, 40), seed=1, dtype=dtype)
    torch_norm, triton_norm = make_pair(name, opts, 40)
    got = run(triton_norm.to(dtype), x, gy)
    want = run(torch_norm, x.float(), gy.float())
    assert [t.dtype for t in got] == [dtype] * len(got)
    assert all(torch.isfinite(t.float()).all() for t in got)
    # two roundings to the half type apart (the parameters' and the result's)
    tol = 2 * torch.finfo(dtype).eps
    for a, b in zip(got, want):
        torch.testing.assert_close(a.float(), b, rtol=tol, atol=tol * b.abs().max().item())


@pytest.mark.parametrize("name", ["rms", "scale"])
def test_half_input_float32_parameters(name):
    """fp16 input to a float32 module (autocast's case): fp16 output and input gradient,
    float32 parameter gradient, as the torch path gives them."""
    x, gy = inputs((5, 3, 40), seed=6, dtype=torch.float16)
    torch_norm, triton_norm = make_pair(name, {}, 40)
    got, want = run(triton_norm, x, gy), run(torch_norm, x, gy)
    assert [t.dtype for t in got] == [t.dtype for t in want] == [torch.float16, torch.float16, torch.float32]
    tol = 2 * torch.finfo(torch.float16).eps
    for a, b in zip(got, want):
        torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol * b.float().abs().max().item())


@pytest.mark.parametrize("name,opts", CONFIGS, ids=IDS)
def test_padding_as_the_torch_path(name, opts):
    """pad_mask is ignored by a per-token norm, fused or not: padding tokens (here garbage:
    huge, zero, constant, NaN) are normalised on their own and reach no real token."""
    T, B, C = 6, 3, 24
    x, gy = inputs((T, B, C), seed=2)
    pad_mask = torch.arange(T).unsqueeze(0) >= torch.tensor([6, 2, 4]).unsqueeze(1)  # B×T
    pads = pad_mask.t()
    x[pads] = torch.stack([torch.full((C,), 1e4), torch.zeros(C), torch.full((C,), 7.0),
                           torch.randn(C), torch.zeros(C), torch.full((C,), -3.0)])[: int(pads.sum())]
    torch_norm, triton_norm = make_pair(name, opts, C)
    want = run(torch_norm, x, gy, pad_mask)
    got = run(triton_norm, x, gy, pad_mask)
    assert_same(got, want, rtol=1e-5)
    assert_same(run(triton_norm, x, gy), got, rtol=0)

    x[pads] = float("nan")
    with torch.no_grad():
        y = triton_norm(x, pad_mask)
    torch.testing.assert_close(y[~pads], want[0][~pads], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,opts", [("detach", {"detach": "mean"}), ("rms", {}), ("scale", {})])
def test_non_contiguous_input_and_expanded_gradient(name, opts):
    """A transposed input, and the stride-0 gradient of y.sum()."""
    torch_norm, triton_norm = make_pair(name, opts, 24)
    x, gy = inputs((24, 3, 5), seed=3)
    x, gy = x.transpose(0, 2), gy.transpose(0, 2)
    assert_same(run(triton_norm, x, gy), run(torch_norm, x, gy), rtol=1e-5)
    grads = []
    for norm in (torch_norm, triton_norm):
        xi = x.clone().requires_grad_(True)
        norm(xi).sum().backward()
        grads.append([xi.grad, *(p.grad for p in norm.parameters())])
    assert_same(grads[1], grads[0], rtol=1e-5)


@pytest.mark.parametrize("name,opts", [("adanorm", {}), ("rms", {}), ("scale", {})])
def test_no_tokens(name, opts):
    _, triton_norm = make_pair(name, opts, 8)
    x = torch.randn(0, 2, 8, requires_grad=True)
    y = triton_norm(x)
    assert y.shape == x.shape
    y.sum().backward()
    assert x.grad.shape == x.shape
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in triton_norm.parameters())


def test_impl_option():
    with pytest.raises(NormConfigError, match="impl='cuda'.*auto, torch, triton"):
        create_norm("rms", 8, impl="cuda")
    assert create_norm("adanorm", 8).impl == "auto"
    assert create_norm("detach", 8, impl="triton").impl == "triton"


def test_auto_runs_torch_on_cpu_tensors(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the fused path ran on a CPU tensor under impl='auto'")

    monkeypatch.setattr(per_token, "fused", refuse)
    x, _ = inputs((2, 2, 8))
    for name, opts in CONFIGS:
        create_norm(name, 8, **opts)(x)
    with pytest.raises(AssertionError, match="fused path"):
        create_norm("rms", 8, impl="triton")(x)


def test_too_many_channels_is_a_clear_error():
    """A token wider than the kernels hold in registers: refused when the norm is built, and
    when a norm without parameters meets a wider input."""
    wide = MAX_ROW_CHANNELS + 1
    with pytest.raises(NormConfigError, match=rf"norm 'scale': .*at most {MAX_ROW_CHANNELS} channels, got {wide}; "
                                              r"use impl='torch'"):
        create_norm("scale", wide, impl="triton")
    norm = create_norm("layer_simple", 8, impl="triton")
    with pytest.raises(NormConfigError, match=rf"norm 'layer_simple': .*got {wide}"):
        norm(torch.ones(1, 1, wide))
    assert create_norm("scale", MAX_ROW_CHANNELS, impl="triton").impl == "triton"


@pytest.mark.slow
@pytest.mark.parametrize("name,opts", [("detach", {"detach": "mean"}), ("adanorm", {}), ("rms", {}), ("scale", {})])
def test_compiles_as_one_graph(name, opts):
    """torch.compile(fullgraph=True) traces the fused norm as one opaque op, forward and
    backward (aot_eager: the autograd graph is traced too); the numbers are eager's."""
    torch._dynamo.reset()
    _, eager = make_pair(name, opts, 24)
    compiled = torch.compile(eager, fullgraph=True, dynamic=False, backend="aot_eager")
    for seed in range(2):
        x, gy = inputs((5, 3, 24), seed=seed)
        assert_same(run(compiled, x, gy), run(eager, x, gy), rtol=0)
