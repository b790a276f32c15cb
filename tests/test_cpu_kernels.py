"""The fused CPU kernels (normplug/norms/csrc/kernels.cpp) against the torch-op
implementations of the same norms, and their build, cache and fallback.

The float64 references from the SPEC equations are in the per-norm test modules,
which run every test with both implementations; here the two implementations
are compared with each other on larger batches (big enough for the kernels'
multi-threaded paths), several training steps (running statistics, ν, the
PowerNorm warm-up boundary) and garbage in the padding.
"""
import copy
import os
import subprocess
import sys
import warnings

import pytest
import torch

from normplug.norms import create_norm, cpu_kernels

CASES = [
    ("layer_simple", {}),
    ("detach", {"detach": "mean"}),
    ("detach", {"detach": "std"}),
    ("detach", {"detach": "both"}),
    ("adanorm", {"k": 0.1, "scale": 2.0}),
    ("rms", {}),
    ("scale", {}),
    ("batch", {}),
    ("batch", {"affine": False, "momentum": 0.3}),
    ("power", {"warmup_updates": 2}),
    ("power", {"groups": 4, "warmup_updates": 0, "alpha_bkw": 0.5}),
    ("power", {"affine": False, "warmup_updates": 1}),
]
IDS = [f"{n}-{'-'.join(f'{k}={v}' for k, v in o.items()) or 'defaults'}" for n, o in CASES]
BUFFERS = ("running_mean", "running_var", "num_batches_tracked", "running_psi2", "nu", "warmup_steps")


def batch(T, B, C, seed, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    lengths[0] = T
    pad = torch.arange(T).unsqueeze(0) >= lengths.unsqueeze(1)  # B×T
    x = (torch.randn(T, B, C, generator=gen) * 2 + 0.5).to(dtype)
    x[pad.t()] = float("nan")  # never read by a batch-statistics norm
    gy = torch.randn(T, B, C, generator=gen).to(dtype)
    return x, gy, pad


def run_steps(norm, batches, kernels):
    """Training steps; per step the output, the gradients and the discrepancy terms."""
    out = []
    ctx = cpu_kernels.disabled() if not kernels else _nullcontext()
    with ctx:
        for k, (x, gy, pad) in enumerate(batches):
            if hasattr(norm, "set_num_updates"):
                norm.set_num_updates(k)
            x = x.clone().requires_grad_(True)
            y = norm(x, pad_mask=pad)
            real = ~pad.t()
            loss = (y[real] * gy[real]).sum()  # nothing reads padding
            params = [p for p in norm.parameters()]
            grads = torch.autograd.grad(loss, [x] + params)
            d = norm.discrepancy() if hasattr(norm, "discrepancy") else None
            out.append((y.detach(), grads, d, real))
    return out


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_kernels_build_on_this_machine():
    assert cpu_kernels.library() is not None, cpu_kernels.build_error()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(7, 3, 16), (40, 32, 64)], ids=["small", "threaded"])
@pytest.mark.parametrize("name,opts", CASES, ids=IDS)
def test_kernels_match_torch_ops(name, opts, shape, threads):
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        T, B, C = shape
        batches = [batch(T, B, C, seed) for seed in range(3)]
        a = create_norm(name, C, **opts).double().train()
        with torch.no_grad():
            for p in a.parameters():
                p.add_(torch.randn_like(p) * 0.3)
        b = copy.deepcopy(a)
        got = run_steps(a, batches, kernels=True)
        want = run_steps(b, batches, kernels=False)
    finally:
        torch.set_num_threads(old_threads)

    tol = dict(rtol=1e-9, atol=1e-10)
    per_token = name not in ("batch", "power")
    for (y1, g1, d1, real), (y2, g2, d2, _) in zip(got, want):
        if per_token:  # per-token norms normalise padding too (NaN in, NaN out)
            torch.testing.assert_close(y1, y2, equal_nan=True, **tol)
        else:
            torch.testing.assert_close(y1[real], y2[real], **tol)
            assert torch.equal(y1[~real], torch.zeros_like(y1[~real]))
            assert torch.equal(y2[~real], torch.zeros_like(y2[~real]))
        for u, v in zip(g1, g2):
            torch.testing.assert_close(u, v, equal_nan=per_token, **tol)
        if d1 is not None:
            for u, v in zip(d1, d2):
                torch.testing.assert_close(u, v, **tol)
    for buf in BUFFERS:
        if hasattr(a, buf):
            torch.testing.assert_close(getattr(a, buf), getattr(b, buf), **tol)


def spec_first_step(name, norm, x, gy, pad):
    """Output and input gradient at the real tokens of a fresh norm's first training
    step, from the SPEC §2 equations in float64 (loss Σ y ⊙ gy over real tokens)."""
    real = ~pad.t()
    xr = x[real].clone().requires_grad_(True)  # n×C real tokens
    g = gy[real]
    n, C = xr.shape
    w = norm.weight.detach() if norm.weight is not None else torch.ones(C, dtype=x.dtype)
    b = norm.bias.detach() if norm.bias is not None else torch.zeros(C, dtype=x.dtype)
    if name == "batch":  # μ_B, σ²_B (biased) over the real tokens, gradient through both
        mu = xr.mean(0)
        var = (xr - mu).pow(2).mean(0)
        y = w * (xr - mu) / torch.sqrt(var + norm.eps) + b
        y.backward(g)
        return y.detach(), xr.grad
    # power: group scaling (1e-5), σ²_B = mean z², warm-up divides by σ²_B and
    # afterwards by ψ² = 1 (its initial value); backward with ν = 0:
    # ∂L/∂z = γ ⊙ gy / sqrt(σ²_B + ε), then through the group scaling.
    G = norm.groups
    zg = xr.view(n, G, C // G)
    z = (zg / torch.sqrt(zg.pow(2).mean(-1, keepdim=True) + 1e-5)).view(n, C)
    var_b = z.detach().pow(2).mean(0)
    warm = norm.warmup_updates > 0  # first step: 0 updates done
    denom = var_b if warm else torch.ones_like(var_b)
    y = w * z.detach() / torch.sqrt(denom + norm.eps) + b
    z.backward(w * g / torch.sqrt(var_b + norm.eps))
    return y, xr.grad


@pytest.mark.parametrize("real_rows", ["one token", "first sentence only", "last rows only"])
@pytest.mark.parametrize("name,opts", [c for c in CASES if c[0] in ("batch", "power")],
                         ids=[i for c, i in zip(CASES, IDS) if c[0] in ("batch", "power")])
def test_threads_split_uneven_padding(name, opts, real_rows):
    """Two threads share the rows by work, not by count: with the real rows all in
    one corner of the batch a thread gets none, and the results still match the
    SPEC equations (first step) and the torch ops (every step)."""
    T, B, C = 40, 32, 64  # above the kernels' threading threshold
    pad = torch.ones(B, T, dtype=torch.bool)
    if real_rows == "one token":
        pad[5, 17] = False
    elif real_rows == "first sentence only":
        pad[0] = False
    else:
        pad[:, T - 2:] = False  # padding at the start: every real row in the last 2·B
    batches = []
    for seed in range(2):
        x, gy, _ = batch(T, B, C, seed)
        x = torch.where(pad.t().unsqueeze(-1), torch.full_like(x, float("nan")), x.nan_to_num())
        batches.append((x, gy, pad))
    old_threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        a = create_norm(name, C, **opts).double().train()
        with torch.no_grad():
            for p in a.parameters():
                p.add_(torch.randn_like(p) * 0.3)
        b = copy.deepcopy(a)
        b_initial = copy.deepcopy(a)
        got = run_steps(a, batches, kernels=True)
        want = run_steps(b, batches, kernels=False)
    finally:
        torch.set_num_threads(old_threads)
    y_ref, gx_ref = spec_first_step(name, b_initial, *batches[0])
    y1, g1, _, real = got[0]
    torch.testing.assert_close(y1[real], y_ref, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(g1[0][real], gx_ref, rtol=1e-9, atol=1e-10)
    assert torch.equal(g1[0][~real], torch.zeros_like(g1[0][~real]))
    for (y1, g1, _, real), (y2, g2, _, _) in zip(got, want):
        torch.testing.assert_close(y1[real], y2[real], rtol=1e-9, atol=1e-10)
        assert torch.equal(y1[~real], torch.zeros_like(y1[~real]))
        for u, v in zip(g1, g2):
            torch.testing.assert_close(u, v, rtol=1e-9, atol=1e-10)
    for buf in BUFFERS:
        if hasattr(a, buf):
            torch.testing.assert_close(getattr(a, buf), getattr(b, buf), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name,opts", [c for c in CASES if c[0] in ("batch", "power")],
                         ids=[i for c, i in zip(CASES, IDS) if c[0] in ("batch", "power")])
def test_eval_paths_match(name, opts):
    """Inference without a graph takes the one-pass kernel; with a graph the torch ops."""
    x, _, pad = batch(9, 5, 24, 4)
    a = create_norm(name, 24, **opts).double().train()
    run_steps(a, [batch(9, 5, 24, s) for s in range(3)], kernels=True)
    a.eval()
    with torch.no_grad():
        fast = a(x, pad_mask=pad)
        with cpu_kernels.disabled():
            slow = a(x, pad_mask=pad)
    real = ~pad.t()
    torch.testing.assert_close(fast[real], slow[real], rtol=1e-12, atol=1e-12)
    assert torch.equal(fast[~real], torch.zeros_like(fast[~real]))


def test_batch_kernel_statistics_gradients_match():
    """The RBN terms' gradient reaches x through μ_B and σ²_B (the extra backward inputs)."""
    x, gy, pad = batch(6, 4, 8, 1)
    real = ~pad.t()
    grads = []
    for kernels in (True, False):
        norm = create_norm("batch", 8).double().train()
        with (_nullcontext() if kernels else cpu_kernels.disabled()):
            xx = x.clone().requires_grad_(True)
            y = norm(xx, pad_mask=pad)
            d = norm.discrepancy()
            loss = (y[real] * gy[real]).sum() + 3.0 * d.rbn_mean + 0.5 * d.rbn_var
            grads.append(torch.autograd.grad(loss, [xx, norm.weight, norm.bias]))
    for u, v in zip(*grads):
        torch.testing.assert_close(u, v, rtol=1e-10, atol=1e-12)


def test_kernel_functions_gradcheck():
    from normplug.norms.batch import _MaskedBatchNormKernelFn
    from normplug.norms.per_token import _RMSKernelFn, _ScaleKernelFn, _SimpleKernelFn

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 6, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(6, dtype=torch.float64, generator=gen, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, generator=gen, requires_grad=True)
    # (DetachNorm and AdaNorm detach part of their graph on purpose: their backwards
    # are checked against the SPEC formulas in test_norms_per_token.py)
    assert torch.autograd.gradcheck(lambda t: _SimpleKernelFn.apply(t, 6, 1e-5, "full", 0.0, 1.0), (x,))
    assert torch.autograd.gradcheck(lambda t, v: _RMSKernelFn.apply(t, v, 1e-8), (x, w))
    g = torch.tensor(1.7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t, s: _ScaleKernelFn.apply(t, s, 1e-5), (x, g))
    pad = torch.tensor([False, True, False, False, True])

    def bn(t, weight, bias):
        run = torch.zeros(6, dtype=torch.float64), torch.ones(6, dtype=torch.float64)
        y, mean, var, _, _ = _MaskedBatchNormKernelFn.apply(t, pad, 3, weight, bias, 1e-3, 0.1, *run)
        return y, mean, var

    assert torch.autograd.gradcheck(bn, (x, w, b))


def test_switch_off_and_fallback_warning(monkeypatch):
    x = torch.randn(3, 2, 8)
    norm = create_norm("rms", 8)
    with cpu_kernels.disabled():
        assert not cpu_kernels.usable(x)
    # a machine where the build fails: one warning naming why, then the torch ops
    monkeypatch.setattr(cpu_kernels, "_lib", None)
    monkeypatch.setattr(cpu_kernels, "_error", None)
    monkeypatch.setattr(cpu_kernels, "_compiler", lambda: None)
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler found"):
        assert not cpu_kernels.usable(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # only once
        y = norm(x)
    want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-8)
    torch.testing.assert_close(y, want)
    assert "no C++ compiler" in cpu_kernels.build_error()


def test_build_into_an_empty_cache_and_env_switch(tmp_path):
    code = (
        "import torch, normplug.norms.cpu_kernels as k; "
        "print(k.library() is not None, k.build_error())"
    )
    env = dict(os.environ, NORMPLUG_KERNEL_CACHE=str(tmp_path / "cache"))
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert first.returncode == 0 and first.stdout.split()[0] == "True", first.stderr
    built = list((tmp_path / "cache").glob("kernels-*.so"))
    assert len(built) == 1 and not list((tmp_path / "cache").glob(".kernels-*"))  # no temporaries left
    mtime = built[0].stat().st_mtime_ns
    again = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert again.stdout.split()[0] == "True" and built[0].stat().st_mtime_ns == mtime  # reused
    off = subprocess.run([sys.executable, "-c", code], env=dict(env, NORMPLUG_CPU_KERNELS="0"),
                         capture_output=True, text=True)
    assert off.stdout.split()[0] == "False" and "Warning" not in off.stderr
