"""The split reductions of the fused BatchNorm and PowerNorm kernels, on the CPU under Triton's
interpreter: the grids a GPU-sized batch launches, the torch path's numbers at sizes where
several splits merge and programs loop over several row blocks, and torch.compile."""
import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels run on CPU tensors

import pytest
import torch

from normplug.norms import create_norm

pytest.importorskip("triton")

from normplug.norms import triton_batch, triton_power  # noqa: E402
from test_triton_batch import twins  # noqa: E402



def batch_of(T, B, C, seed, padding="some"):
    """x (non-contiguous), a B×T padding mask and the upstream gradient, both NaN at padding;
    ``padding``: "some" (random lengths, an empty and a full sentence), "none" (mask None), "all"."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    lengths[:2] = torch.tensor([0, T])
    lengths = {"some": lengths, "none": torch.full((B,), T), "all": torch.zeros(B)}[padding]
    pad = torch.arange(T)[None, :] >= lengths[:, None]
    x = (torch.randn(B, T, C, generator=g) * 2 + 0.5).transpose(0, 1)
    up = torch.randn(T, B, C, generator=g)
    # whatever padding holds never enters a sum: a NaN there would reach every output
    x[pad.t()] = up[pad.t()] = float("nan")
    return x, None if padding == "none" else pad, up


def train_step(norm, x, pad, up, penalty):
    """Output, input gradient, batch statistics, parameter gradients and buffers after one
    training step with upstream gradient ``up`` (+ the RBN penalty's two terms)."""
    norm.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(True)
    y = norm(x, pad_mask=pad)
    stats = [s.detach().clone() for s in norm._batch_stats if s is not None]
    outputs, grads = [y], [up]
    if penalty:
        d = norm.discrepancy()
        outputs.append(3.0 * d.rbn_mean + 2.0 * d.rbn_var)
        grads.append(torch.ones(()))
    torch.autograd.backward(outputs, grads)
    return ([y.detach(), x.grad] + stats + [p.grad for p in norm.parameters()]
            + [b.clone() for b in norm.buffers()])


def assert_steps_match(ref, fused, steps, penalty, first=0):
    """The torch and the fused norm agree after each of ``steps`` (numbered from ``first``)."""
    for step, (x, pad, up) in enumerate(steps, first):
        if hasattr(ref, "set_num_updates"):
            ref.set_num_updates(step), fused.set_num_updates(step)
        want, got = train_step(ref, x, pad, up, penalty), train_step(fused, x, pad, up, penalty)
        for i, (a, b) in enumerate(zip(got, want)):
            # 1e-5 of the tensor's scale: a sum over tokens that cancels to near 0 in one channel
            # keeps float32 rounding of its terms' size (on both paths alike, against float64)
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()),
                                       msg=lambda m: f"step {step}, value {i}: {m}")
        if pad is not None:  # padding outputs exactly 0 and gets no gradient
            assert (got[0][pad.t()] == 0).all() and (got[1][pad.t()] == 0).all()
        if pad is not None and pad.all():  # a batch of padding: every gradient 0
            assert all((p.grad == 0).all() for p in fused.parameters())


# (T, B) of the step where several splits merge, of the other steps, and the programs a launch
# gets (absent: as planned for a nominal H100): at 260 tokens BatchNorm's 3 splits and
# PowerNorm's 2, whose programs loop over 2 row blocks (fast tier); at 4,100 tokens 65 splits
# (BatchNorm, merged 16 at a time) or 33 (PowerNorm, its merges' chunks cut to 16), of one row
# block each (slow tier)
SIZES = [pytest.param((26, 10), (3, 2), {"batch": 6, "power": 2}, id="N=260"),
         pytest.param((410, 10), (3, 2), {}, id="N=4100", marks=pytest.mark.slow)]


def plan_programs(monkeypatch, name, programs):
    """Launches of ``programs[name]`` programs when given; PowerNorm's merges in chunks of 16."""
    if name in programs:
        monkeypatch.setattr(triton_batch, "resident_programs", lambda *args: programs[name])
    monkeypatch.setattr(triton_power, "MERGE_CHUNK", 16)


@pytest.mark.parametrize("shape,other,programs", SIZES)
def test_batch_matches_torch_across_splits(shape, other, programs, monkeypatch):
    # C = 70: two channel blocks, the second partly masked; then a batch of padding moves nothing
    plan_programs(monkeypatch, "batch", programs)
    ref, fused = twins("batch", 70, momentum=0.3)
    assert_steps_match(ref, fused, [batch_of(*shape, 70, 0), batch_of(*other, 70, 1)], penalty=True)
    assert fused.num_batches_tracked.item() == 2
    trained = [b.clone() for b in fused.buffers()]
    assert_steps_match(ref, fused, [batch_of(3, 2, 70, 2, padding="all")], penalty=True, first=2)
    assert all(torch.equal(a, b) for a, b in zip(fused.buffers(), trained))


@pytest.mark.parametrize("shape,other,programs", SIZES)
def test_power_matches_torch_across_splits(shape, other, programs, monkeypatch):
    # steps t = 1 (6 tokens, no padding mask), 2 in the warm-up (σ²_B; the cumulative ψ² step at
    # t = 1), t = 3 after it (ψ²), then a batch of padding; 5 groups of 6 or 14 channels padded
    # to 8 or 16 and 3 padded groups
    plan_programs(monkeypatch, "power", programs)
    C = 30 if shape == (26, 10) else 70
    ref, fused = twins("power", C, groups=5, warmup_updates=2)
    steps = [batch_of(3, 2, C, 0, padding="none"), batch_of(*shape, C, 1), batch_of(*other, C, 2)]
    assert_steps_match(ref, fused, steps, penalty=False)
    assert fused.nu.abs().min() > 0
    trained = fused.running_psi2.clone(), fused.nu.clone()
    assert_steps_match(ref, fused, [batch_of(3, 2, C, 3, padding="all")], penalty=False, first=3)
    assert torch.equal(fused.running_psi2, trained[0]) and torch.equal(fused.nu, trained[1])


class _Recorder:
    """Stands in for a kernel: records the grid of each launch and runs nothing."""

    def __init__(self, name, launches):
        self.name, self.launches = name, launches

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((self.name, grid))


@pytest.mark.parametrize("name,options,count", [("batch", {}, 4), ("power", {"groups": 16}, 5),
                                                ("power", {"groups": 1}, 5)])
def test_a_gpu_sized_batch_fills_the_gpu(name, options, count, monkeypatch):
    # 8,192 tokens × 512 channels, forward and backward (with the RBN penalty): the grids the host
    # code computes for a nominal H100 (132 multiprocessors) span 128 programs or more; the
    # launches are recorded, not run (the interpreter would take minutes)
    launches = []
    for module in (triton_batch, triton_power):
        for kernel in [k for k in vars(module) if k.endswith("_kernel")]:
            monkeypatch.setattr(module, kernel, _Recorder(kernel, launches))
    norm = create_norm(name, 512, impl="triton", **options)
    pad = torch.arange(256)[None, :] >= torch.randint(1, 257, (32,))[:, None]
    y = norm(torch.randn(256, 32, 512, requires_grad=True), pad_mask=pad)
    loss = y.sum()
    if name == "batch":
        d = norm.discrepancy()
        loss = loss + d.rbn_mean + d.rbn_var
    loss.backward()
    assert len(launches) == count <= 8, launches
    assert min(math.prod(grid) for _, grid in launches) >= 128, launches


def test_eager_mode_launches_without_the_custom_ops(monkeypatch):
    """Eager forward and backward call the launches directly: the custom ops (whose dispatch
    costs more host time than the launches) are for torch.compile, which the test below runs."""
    from normplug.norms import triton_token

    def refuse(*args):
        raise AssertionError("an eager call went through a custom op")

    for module in (triton_batch, triton_power, triton_token):
        monkeypatch.setattr(module, "_forward", refuse)
        monkeypatch.setattr(module, "_backward", refuse)
    x = torch.randn(5, 3, 24, requires_grad=True)
    for name, options in (("batch", {}), ("power", {"groups": 4}), ("rms", {})):
        create_norm(name, 24, impl="triton", **options)(x).sum().backward()
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("name,options", [("batch", {"momentum": 0.3}),
                                          ("power", {"groups": 4, "warmup_updates": 2})])
def test_compiled_fused_matches_eager_torch(name, options):
    """torch.compile(fullgraph=True) traces the fused norm, its buffer updates included
    (aot_eager: the backward is traced too), and gives the eager torch path's numbers over
    three steps: outputs, gradients (the RBN penalty's too), buffers, each updated once a step."""
    torch._dynamo.reset()
    ref, fused = twins(name, 24, **options)
    compiled = torch.compile(fused, fullgraph=True, backend="aot_eager")
    steps = [batch_of(5, 3, 24, seed) for seed in range(3)]
    for step, (x, pad, up) in enumerate(steps):
        ref.train(), compiled.train()
        if name == "power":
            ref.set_num_updates(step), compiled.set_num_updates(step)
        want = train_step(ref, x, pad, up, penalty=name == "batch")
        got = train_step(compiled, x, pad, up, penalty=name == "batch")
        for i, (a, b) in enumerate(zip(got, want)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()),
                                       msg=lambda m: f"step {step}, value {i}: {m}")


@pytest.mark.slow
def test_custom_ops_pass_opcheck():
    """torch.library.opcheck of the four ops: every buffer they write is declared mutable, the
    fake implementations give the real outputs' shapes and dtypes, nothing aliases."""
    x, pad, _ = batch_of(5, 3, 24, 0)
    w, b = torch.randn(24), torch.randn(24)
    forward = (x, pad, w, b, torch.zeros(24), torch.ones(24), torch.tensor(0), 1e-5, 0.1, True, True, False)
    torch.library.opcheck(triton_batch._forward, forward)
    _, mean, var, count = triton_batch._forward(*forward)
    torch.library.opcheck(triton_batch._backward, (torch.randn(5, 3, 24), torch.randn(24), None, x, pad, w,
                                                   mean, var, count, 1e-5, True, False))
    forward = (x, pad, w, b, torch.ones(24), torch.tensor(2), 1e-5, 4, 1e-5, 2, 0.9, True, False)
    torch.library.opcheck(triton_power._forward, forward)
    _, _, scales, count = triton_power._forward(*forward)
    torch.library.opcheck(triton_power._backward, (torch.randn(5, 3, 24), x, pad, w, torch.zeros(24), scales,
                                                   count, 4, 1e-5, 0.1, True, False))
