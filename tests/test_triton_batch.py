"""The fused Triton kernels of BatchNorm and PowerNorm against their torch code, on the CPU
under Triton's interpreter: outputs, every gradient, running statistics, padding, odd sizes."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels run on CPU tensors

import pytest
import torch

from normplug.norms import NormConfigError, create_norm
from normplug.norms.impl import MAX_GROUP_CHANNELS

pytest.importorskip("triton")

T, B = 5, 3


def twins(name, dim, **options):
    """The torch and the triton build of one norm, with the same random affine parameters."""
    torch.manual_seed(1)
    ref = create_norm(name, dim, impl="torch", **options)
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(1.0 if p is ref.weight else 0.0, 0.5)
    fused = create_norm(name, dim, impl="triton", **options)
    fused.load_state_dict(ref.state_dict())
    return ref, fused


def pad_mask(lengths, t=T):
    return torch.arange(t)[None, :] >= torch.tensor(lengths)[:, None]


def run(norm, x, pad, upstream, penalty=False):
    """Output and the gradient of the input after a backward of Σ y·upstream (+ the RBN terms)."""
    x = x.detach().clone().requires_grad_(True)
    y = norm(x, pad_mask=pad)
    loss = (y.float() * upstream).sum()
    if penalty:
        d = norm.discrepancy()
        loss = loss + 3.0 * d.rbn_mean + 2.0 * d.rbn_var
    loss.backward()
    return y, x.grad


def assert_close(a, b, rtol=1e-5, atol=1e-6):
    torch.testing.assert_close(a.float(), b.float(), rtol=rtol, atol=atol)


def assert_twins(ref, fused):
    for (name, a), (_, b) in zip(ref.named_parameters(), fused.named_parameters()):
        assert_close(a.grad, b.grad), name
    for (name, a), (_, b) in zip(ref.named_buffers(), fused.named_buffers()):
        assert torch.equal(a, b) if a.dtype == torch.long else torch.allclose(a, b, 1e-5, 1e-6), name


def test_batch_penalty_gradient_alone_matches():
    # the gradient that reaches x through μ_B and σ²_B only (no gradient on y)
    ref, fused = twins("batch", 40)
    x = torch.randn(T, B, 40)
    grads = []
    for norm in (ref, fused):
        xi = x.clone().requires_grad_(True)
        norm(xi, pad_mask=pad_mask([5, 1, 3]))
        d = norm.discrepancy()
        (d.rbn_mean + d.rbn_var).backward()
        grads.append(xi.grad)
    assert grads[0].abs().sum() > 0
    assert_close(grads[1], grads[0])


@pytest.mark.parametrize("test_stats", ["population", "batch"])
def test_batch_eval(test_stats):
    ref, fused = twins("batch", 40, test_stats=test_stats, affine=test_stats == "batch")
    for norm in (ref, fused):
        norm.running_mean.normal_()
        norm.running_var.uniform_(0.5, 2)
    ref.load_state_dict(fused.state_dict())
    ref.eval(), fused.eval()
    x, up, pad = torch.randn(T, B, 40), torch.randn(T, B, 40), pad_mask([3, 5, 1])
    y_ref, gx_ref = run(ref, x, pad, up)
    y_fused, gx_fused = run(fused, x, pad, up)
    assert_close(y_fused, y_ref)
    assert_close(gx_fused, gx_ref)
    assert_twins(ref, fused)


def test_batch_single_token_and_fp16():
    ref, fused = twins("batch", 24)
    x, up = torch.randn(1, 1, 24), torch.randn(1, 1, 24)
    for got, want in zip(run(fused, x, None, up), run(ref, x, None, up)):
        assert_close(got, want)
    # fp16 input: float32 statistics, fp16 output, against the float32 torch reference
    x, up = torch.randn(T, B, 24), torch.randn(T, B, 24)
    y16, gx16 = run(fused, x.half(), pad_mask([5, 4, 2]), up)
    y32, gx32 = run(ref, x, pad_mask([5, 4, 2]), up)
    assert y16.dtype == gx16.dtype == torch.float16
    assert_close(y16, y32, rtol=2e-3, atol=2e-3)
    assert_close(gx16, gx32, rtol=2e-3, atol=5e-3)
    assert_close(fused.running_var, ref.running_var, rtol=1e-3, atol=1e-4)


def test_power_eval_and_fp16():
    ref, fused = twins("power", 40, groups=1)
    for norm in (ref, fused):
        norm.running_psi2.uniform_(0.5, 2)
        norm.eval()
    ref.load_state_dict(fused.state_dict())
    x, up, pad = torch.randn(T, B, 40), torch.randn(T, B, 40), pad_mask([2, 5, 3])
    y_ref, gx_ref = run(ref, x, pad, up)
    y_fused, gx_fused = run(fused, x, pad, up)
    assert_close(y_fused, y_ref)
    assert_close(gx_fused, gx_ref)
    assert_twins(ref, fused)
    y16, gx16 = run(fused, x.half(), pad, up)
    assert y16.dtype == gx16.dtype == torch.float16
    assert_close(y16, y_ref, rtol=2e-3, atol=2e-3)
    assert_close(gx16, gx_ref, rtol=2e-3, atol=5e-3)


def test_impl_is_validated():
    with pytest.raises(NormConfigError, match=r"impl='cuda'.*valid choices: auto, torch, triton"):
        create_norm("batch", 8, impl="cuda")
    with pytest.raises(NormConfigError, match=r"impl='fused'"):
        create_norm("power", 8, impl="fused")
    assert create_norm("power", 8).impl == "auto"


def test_power_group_wider_than_the_kernels_hold_is_refused():
    wide = 2 * MAX_GROUP_CHANNELS
    with pytest.raises(NormConfigError, match=rf"norm 'power': impl='triton' holds a group of channels "
                                              rf"\(dim / groups\) in registers, at most {MAX_GROUP_CHANNELS} "
                                              rf"channels, got {wide}; use impl='torch'"):
        create_norm("power", wide, impl="triton")
    assert create_norm("power", wide, groups=2, impl="triton").impl == "triton"
    assert create_norm("power", wide).impl == "auto"


def test_norm_impl_flag_reaches_the_norms(tiny_data, capsys):
    from test_model import build, make_batch

    def norms(model):
        return [m for m in model.modules() if getattr(m, "norm_name", None) in ("batch", "power")]

    built = {}
    for impl in ("torch", "triton"):
        task, model, _ = build(tiny_data, "norm_transformer", "--encoder-norm", "batch",
                               "--decoder-norm", "power", "--norm-impl", impl)
        assert {m.impl for m in norms(model)} == {impl} and len(norms(model)) > 2
        built[impl] = (task, model)
    _, model, _ = build(tiny_data, "norm_transformer", "--encoder-norm", "batch")
    assert {m.impl for m in norms(model)} == {"auto"}
    # one training step of the fairseq model: the triton kernels give the torch path's numbers
    built["triton"][1].load_state_dict(built["torch"][1].state_dict())
    results = []
    for task, model in built.values():
        model.train()
        src, lengths, prev = make_batch(task, [5, 3, 7], [4, 6, 2])
        torch.manual_seed(0)
        logits, _ = model(src, lengths, prev)
        logits.square().mean().backward()
        results.append([logits] + [p.grad for p in model.parameters()])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)

    with pytest.raises(SystemExit):
        build(tiny_data, "norm_transformer", "--norm-impl", "cuda")
    err = capsys.readouterr().err
    assert "cuda" in err and "auto" in err and "triton" in err


def _sync_worker(rank, port, folder):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    try:
        g = torch.Generator().manual_seed(rank)
        out = {}
        for name, options in (("batch", {}), ("power", {"groups": 4, "warmup_updates": 1})):
            ref, fused = twins(name, 24, sync_stats=True, **options)
            steps = []
            for step in range(2):
                t = 5 - 2 * rank  # the workers' batches differ in size and padding
                x, up = torch.randn(t, B, 24, generator=g) + rank, torch.randn(t, B, 24, generator=g)
                pad = pad_mask([t, 1, t - 1], t)
                for norm in (ref, fused):
                    if name == "power":
                        norm.set_num_updates(step)
                    steps.append(tuple(t.detach() for t in run(norm, x, pad, up, penalty=name == "batch")))
            grads = [[p.grad for p in norm.parameters()] for norm in (ref, fused)]
            out[name] = (steps, grads, ref.state_dict(), fused.state_dict())
        torch.save(out, os.path.join(folder, f"rank{rank}.pt"))
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_synced_statistics_match_the_torch_path(tmp_path):
    # two gloo workers: statistics, the penalty's gradient and ν summed over both, as the torch path does
    import torch.multiprocessing as mp
    from conftest import free_port

    mp.start_processes(_sync_worker, args=(free_port(), str(tmp_path)), nprocs=2, join=True,
                       start_method="fork")
    res = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for name in ("batch", "power"):
        for rank in range(2):
            steps, (grads_ref, grads_fused), state_ref, state_fused = res[rank][name]
            for (y_ref, gx_ref), (y_fused, gx_fused) in zip(steps[::2], steps[1::2]):
                assert_close(y_fused, y_ref)
                assert_close(gx_fused, gx_ref)
            for a, b in zip(grads_fused, grads_ref):
                assert_close(a, b)
            for key, value in state_ref.items():
                assert_close(state_fused[key], value)
        for key, value in res[0][name][3].items():  # synced: both workers hold the same statistics
            assert_close(res[1][name][3][key], value)
