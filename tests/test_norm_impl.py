"""Which implementation a fused norm runs (normplug/norms/impl.py): the safe default and the
one-line refusal of the Triton kernels where they cannot run. No kernel launches here."""
from types import SimpleNamespace

import pytest
import torch

from normplug.errors import NormplugError
from normplug.norms import create_norm, impl, norm_names, norm_options, per_token
from normplug.norms.batch import MaskedBatchNorm
from normplug.norms.power import PowerNorm

FUSED = [name for name in norm_names() if "impl" in norm_options(name)]
# stand-ins for tensors: use_triton reads the device, never the values
CUDA = SimpleNamespace(is_cuda=True, device=torch.device("cuda"))
CPU = SimpleNamespace(is_cuda=False, device=torch.device("cpu"))


@pytest.mark.parametrize("verified", [frozenset(), frozenset({"rms"}), frozenset({"batch", "scale"})])
def test_auto_runs_triton_only_for_gpu_verified_norms_on_cuda(verified, monkeypatch):
    monkeypatch.setattr(impl, "GPU_VERIFIED", verified)
    monkeypatch.setattr(impl, "triton_available", lambda: True)
    for name in FUSED:
        assert impl.use_triton("auto", CUDA, name) == (name in verified), name
        assert not impl.use_triton("auto", CUDA, name, fits=False)  # wider than the kernels hold
        assert not impl.use_triton("auto", CPU, name)
        assert not impl.use_triton("torch", CUDA, name)
        assert impl.use_triton("triton", CUDA, name)
    monkeypatch.setattr(impl, "triton_available", lambda: False)
    assert not any(impl.use_triton("auto", CUDA, name) for name in FUSED)


def test_each_norm_asks_for_itself(monkeypatch):
    """The modules pass their own registry name, the key of GPU_VERIFIED, and whether a token
    fits the kernels' registers."""
    asked = []

    def record(choice, x, name, fits):
        asked.append((choice, name, fits))
        return False

    monkeypatch.setattr(per_token, "use_triton", record)
    x = torch.randn(3, 2, 8)
    for name in FUSED:
        if name not in ("batch", "power"):
            create_norm(name, 8)(x)
    assert asked == [("auto", name, True) for name in FUSED if name not in ("batch", "power")]
    create_norm("layer_simple", 8)(torch.randn(1, 1, impl.MAX_ROW_CHANNELS + 1))
    assert asked[-1] == ("auto", "layer_simple", False)


@pytest.mark.parametrize("setting", [None, "0", "false"])
def test_triton_on_cpu_without_the_interpreter_is_one_line(setting, monkeypatch):
    """impl='triton' on a CPU tensor: one NormplugError naming --norm-impl torch, before any
    kernel is launched (triton's own error is "0 active drivers")."""
    if setting is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", setting)

    def launch(*args, **kwargs):
        raise AssertionError("a kernel was launched")

    monkeypatch.setattr(per_token, "fused", launch)
    monkeypatch.setattr(MaskedBatchNorm, "_forward_fused", launch)
    monkeypatch.setattr(PowerNorm, "_forward_fused", launch)
    monkeypatch.setattr(impl, "triton_available", lambda: True)
    x = torch.randn(3, 2, 8)
    for name in FUSED:
        norm = create_norm(name, 8, impl="triton", **({"groups": 2} if name == "power" else {}))
        with pytest.raises(NormplugError, match=r"--norm-impl torch") as err:
            norm(x)
        assert "\n" not in str(err.value) and repr(name) in str(err.value)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(AssertionError, match="launched"):
        create_norm("rms", 8, impl="triton")(x)
