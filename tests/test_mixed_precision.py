"""Mixed precision on CPU: what fairseq 0.12 allows, every norm kind, float32 statistics.

fairseq 0.12 on CPU (see README "Mixed precision"):
* ``--bf16`` / ``--memory-efficient-bf16`` imply ``--tpu`` (options.parse_args_and_arch),
  which needs torch_xla: fairseq fails such a run. fairseq's bf16 trainer itself (model cast to bf16, FP16Optimizer with float32
  master weights) runs on CPU once ``--tpu`` is dropped again, which
  tests/hooked_train.py does (HOOK_CPU_BF16=1); that is how bf16 is tested here.
* ``--fp16`` fails on CPU in FP16Optimizer's flattened float32 copy
  (``torch.cuda.current_device()``); ``--fp16 --fp16-no-flatten-grads`` and
  ``--memory-efficient-fp16`` train on CPU with the stock ``fairseq-train``.
* ``--amp`` runs, but its autocast is CUDA's: on CPU the model stays float32.
"""
import math
import re

import pytest
import torch

from conftest import HOOKED_TRAIN, run_cli, train_args

from normplug.norms import create_norm

# Between them, every norm kind at some site (Post-Norm / Pre-Norm).
SITES = {
    "postnorm": ["--encoder-self-attn-norm", "batch", "--encoder-ffn-norm", "power",
                 "--decoder-self-attn-norm", "rms", "--decoder-cross-attn-norm", "layer",
                 "--decoder-ffn-norm", "batch"],
    "prenorm": ["--encoder-normalize-before", "--decoder-normalize-before",
                "--encoder-self-attn-norm", "batch", "--encoder-ffn-norm", "power",
                "--encoder-final-norm", "layer_simple", "--decoder-self-attn-norm", "detach",
                "--decoder-cross-attn-norm", "adanorm", "--decoder-ffn-norm", "scale",
                "--decoder-final-norm", "identity"],
}
STAT_BUFFERS = ("running_mean", "running_var", "running_psi2", "nu")
UPDATES = 4


def _args(data, save, sites, *extra):
    return train_args(data, save, "norm_transformer", *SITES[sites], *extra,
                      "--criterion", "label_smoothed_cross_entropy_rbn",
                      "--rbn-mean-weight", "1", "--rbn-var-weight", "0.1",
                      "--power-warmup", "2", updates=UPDATES)


def _check_run(proc, save, half):
    log = proc.stdout + proc.stderr
    inner = [line for line in log.splitlines() if "| train_inner |" in line]
    assert len(inner) == UPDATES, log[-3000:]
    for line in inner:
        for key in ("loss", "rbn_penalty", "rbn_mean", "rbn_var", "tid_mean", "tid_var", "gnorm"):
            value = float(re.search(rf"[ |,]{key}=([^,\s]+)", line).group(1))
            assert math.isfinite(value), (key, line)
    state = torch.load(save / "checkpoint_last.pt", weights_only=False)
    model = state["model"]
    assert state["optimizer_history"][-1]["num_updates"] == UPDATES
    stats = {k: v for k, v in model.items() if k.endswith(STAT_BUFFERS)}
    assert len(stats) >= 4  # batch norms: mean, var; power norm: ψ², ν
    for k, v in model.items():
        assert torch.isfinite(v.float()).all(), k
        if k.endswith(STAT_BUFFERS):
            assert v.dtype == torch.float32, k  # statistics stay float32
        elif k.endswith(".weight") and "embed" in k:
            # the model ran in half precision (fairseq saves it as float32)
            assert torch.equal(v, v.to(half).float()), k
    return model


@pytest.mark.slow
def test_bf16_and_fp16_train_every_norm_kind(tiny_data, tmp_path):
    """bf16 through fairseq's own bf16 trainer (tests/hooked_train.py drops the --tpu that
    fairseq 0.12 forces on), fp16 with the stock fairseq-train; between them every kind."""
    proc = run_cli("python", HOOKED_TRAIN, *_args(tiny_data, tmp_path / "bf16", "prenorm", "--bf16"),
                   env={"HOOK_CPU_BF16": "1"})
    model = _check_run(proc, tmp_path / "bf16", torch.bfloat16)
    # running statistics moved away from their initial values in float32
    assert float(model["encoder.layers.0.self_attn_layer_norm.running_mean"].abs().sum()) > 0
    proc = run_cli("fairseq-train", *_args(tiny_data, tmp_path / "fp16", "postnorm", "--memory-efficient-fp16"))
    _check_run(proc, tmp_path / "fp16", torch.float16)


# --------------------------------------------------------------------------- statistics
def _masked(T=48, B=24, C=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, B, C, generator=g) * torch.linspace(0.5, 3.0, C) + torch.linspace(-4, 6, C)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    pad = torch.arange(T)[None, :] >= lengths[:, None]  # B×T, True at padding
    return x, pad


def test_bn_statistics_of_a_bf16_batch_match_float32():
    x32, pad = _masked()
    xb = x32.to(torch.bfloat16)
    bn = create_norm("batch", 16)
    mu32, var32 = bn.batch_statistics(x32, pad)
    mub, varb = bn.batch_statistics(xb, pad)
    assert mub.dtype == varb.dtype == torch.float32
    # exactly the float32 statistics of the (rounded) bf16 values …
    mu_r, var_r = bn.batch_statistics(xb.float(), pad)
    torch.testing.assert_close(mub, mu_r, rtol=0, atol=0)
    torch.testing.assert_close(varb, var_r, rtol=0, atol=0)
    # … which are within bf16 rounding (2^-9 relative per value) of the float32 batch's
    sigma = var32.sqrt()
    assert ((mub - mu32).abs() / sigma).max() < 2e-3
    assert ((varb - var32).abs() / var32).max() < 4e-3
    # a training forward in bf16 updates the running statistics the same way
    a, b = create_norm("batch", 16).train(), create_norm("batch", 16).train()
    assert a(xb, pad).dtype == torch.bfloat16
    b(x32, pad)
    torch.testing.assert_close(a.running_mean, b.running_mean, rtol=0, atol=2e-3 * float(sigma.max()))
    torch.testing.assert_close(a.running_var, b.running_var, rtol=4e-3, atol=0)
    # PowerNorm's quadratic mean likewise
    pn = create_norm("power", 16, groups=2)
    torch.testing.assert_close(pn.batch_statistics(xb, pad)[1], pn.batch_statistics(x32, pad)[1],
                               rtol=4e-3, atol=0)


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
def test_running_statistics_accumulate_in_float32_in_a_half_model(half):
    """A model cast to half precision (fairseq --bf16/--fp16) keeps the running
    statistics float32. Kept in bf16 (8-bit mantissa), every EMA step with
    momentum 0.05 is rounded and steps under half an ulp are lost: here the
    running variance would end up to ~1% off the float32 EMA of the same batches."""
    bn_half = create_norm("batch", 16).to(half).train()
    bn_ref = create_norm("batch", 16).train()
    pn_half = create_norm("power", 16, groups=2, warmup_updates=0).to(half).train()
    pn_ref = create_norm("power", 16, groups=2, warmup_updates=0).train()
    for buf in ("running_mean", "running_var"):
        assert getattr(bn_half, buf).dtype == torch.float32
    assert pn_half.running_psi2.dtype == pn_half.nu.dtype == torch.float32
    assert bn_half.weight.dtype == pn_half.weight.dtype == half
    g = torch.Generator().manual_seed(1)
    for step in range(300):
        x = (torch.randn(6, 5, 16, generator=g) * 2 + 0.3).to(half)
        bn_half(x)
        bn_ref(x.float())  # the same values, in float32
        pn_half.set_num_updates(step)
        pn_ref.set_num_updates(step)
        pn_half(x)
        pn_ref(x.float())
    torch.testing.assert_close(bn_half.running_var, bn_ref.running_var, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bn_half.running_mean, bn_ref.running_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(pn_half.running_psi2, pn_ref.running_psi2, rtol=1e-5, atol=1e-6)
    assert float((bn_half.running_var - 4).abs().max()) < 1.0


def test_half_cast_keeps_statistics_exact():
    bn = create_norm("batch", 4)
    pn = create_norm("power", 4)
    values = torch.tensor([1.0001, 3.14159265, 0.1, 7.77777])  # not bf16-representable
    bn.running_var.copy_(values)
    bn.running_mean.copy_(-values)
    pn.running_psi2.copy_(values)
    pn.nu.copy_(values / 3)
    for half in (torch.bfloat16, torch.float16):
        for module, names in ((bn, ("running_mean", "running_var")), (pn, ("running_psi2", "nu"))):
            before = {n: getattr(module, n).clone() for n in names}
            module.to(half)
            for n in names:
                assert getattr(module, n).dtype == torch.float32
                assert torch.equal(getattr(module, n), before[n]), n
            module.float()
            for n in names:
                assert torch.equal(getattr(module, n), before[n]), n
    # a float64 cast is not a half cast: buffers follow it
    assert bn.double().running_var.dtype == torch.float64
