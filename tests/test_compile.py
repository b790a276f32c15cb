"""Every registered norm compiles as one graph (no host sync, no data-dependent shape) and
matches eager, in training with a padding mask and in eval, gradients and buffers included."""
import copy

import pytest
import torch

from normplug.norms import create_norm, norm_names

pytestmark = pytest.mark.slow

T, B, C = 7, 4, 16
VARIANTS = [(name, {}) for name in norm_names()] + [("batch", {"test_stats": "batch"})]


def _options(name, extra):
    # warm-up 1 puts the second PowerNorm step past warm-up: both forwards are compiled
    return dict(extra, **({"groups": 2, "warmup_updates": 1} if name == "power" else {}))


def _batch(seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(T, B, C, generator=g) * 2 + 0.5).requires_grad_(True)
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[0, 5:] = True
    pad[2, 2:] = True
    return x, pad, torch.randn(T, B, C, generator=g)


def _step(norm, x, pad, up):
    y = norm(x, pad)
    grads = torch.autograd.grad((y * up).sum(), [x] + [p for p in norm.parameters()])
    return [y.detach(), *grads]


@pytest.mark.parametrize("name,extra", VARIANTS, ids=[n + "".join(f"-{v}" for v in e.values()) for n, e in VARIANTS])
def test_compiles_as_one_graph_and_matches_eager(name, extra):
    torch._dynamo.reset()
    eager = create_norm(name, C, **_options(name, extra))
    compiled_module = copy.deepcopy(eager)
    compiled = torch.compile(compiled_module, fullgraph=True, dynamic=False)
    for mode in ("train", "eval"):
        eager.train(mode == "train")
        compiled_module.train(mode == "train")
        for step in range(2):
            for m in (eager, compiled_module):
                if hasattr(m, "set_num_updates"):
                    m.set_num_updates(step)
            x, pad, up = _batch(step)
            want = _step(eager, x, pad, up)
            got = _step(compiled, x, pad, up)
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
            for (key, a), b in zip(compiled_module.state_dict().items(), eager.state_dict().values()):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=f"{mode} step {step}: {key}")
