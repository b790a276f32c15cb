"""normplug-average: checkpoint averaging and re-estimation of population statistics.

Uses the tiny BN run of tests/test_tid_tool.py (trained once per session).
"""
import os

import pytest
import torch
import torch.nn as nn

from conftest import USER_DIR, run_cli

import normplug  # noqa: F401  (registers the plugin)
from normplug.norms import create_norm
from normplug.tools import average as average_cli
from normplug.tools.average import reestimate_population_statistics
from normplug.tools.common import iterate_batches, load_model

from test_tid_tool import _no_bn_checkpoint, trained_bn_run

STAT_SUFFIXES = ("running_mean", "running_var")


@pytest.fixture(scope="module")
def bn_run(tmp_path_factory, tiny_data):
    return trained_bn_run(tmp_path_factory, tiny_data)


@pytest.fixture(scope="module")
def averaged(bn_run, tmp_path_factory):
    """checkpoint1.pt and checkpoint2.pt averaged (in process; the console script
    runs in :func:`reestimated`)."""
    out = tmp_path_factory.mktemp("avg") / "avg.pt"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(average_cli, "configure_logging", lambda verbose: None)
        assert average_cli.main(["--inputs", str(bn_run / "checkpoint1.pt"),
                                 str(bn_run / "checkpoint2.pt"), "--output", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def reestimated(bn_run, tiny_data, tmp_path_factory):
    """The same average with population statistics re-estimated on 3 training batches."""
    out = tmp_path_factory.mktemp("avg_re") / "avg_re.pt"
    proc = run_cli("normplug-average", "--inputs", bn_run, "--num-epoch-checkpoints", "2",
                   "--output", out, "--reestimate-stats", "--data", tiny_data,
                   "--max-batches", "3", "--max-tokens", "400", "--cpu")
    assert "on 3 batch(es) of train" in proc.stdout
    return out


def _load(path):
    return torch.load(path, map_location="cpu")


@pytest.mark.slow
def test_average_is_the_elementwise_mean(bn_run, averaged, tmp_path, monkeypatch):
    a, b, out = _load(bn_run / "checkpoint1.pt"), _load(bn_run / "checkpoint2.pt"), _load(averaged)
    assert set(out) == set(b)  # same structure as the inputs
    assert set(out["model"]) == set(a["model"])
    n_float = 0
    for k, v in out["model"].items():
        assert v.dtype == a["model"][k].dtype and v.shape == a["model"][k].shape
        if v.is_floating_point():
            want = ((a["model"][k].double() + b["model"][k].double()) / 2).to(v.dtype)
            assert torch.equal(v, want), k
            n_float += 1
        else:  # counters come from the newest input
            assert torch.equal(v, b["model"][k]), k
    assert n_float > 20
    # the two inputs really differ, running statistics included
    key = "encoder.layers.0.self_attn_layer_norm.running_mean"
    assert not torch.equal(a["model"][key], b["model"][key])
    # everything else is the newest checkpoint's
    assert out["optimizer_history"] == b["optimizer_history"]
    assert out["extra_state"]["train_iterator"] == b["extra_state"]["train_iterator"]
    record = out["extra_state"]["normplug_average"]
    assert record["num_updates"] == [8, 16] and record["reestimated"] is None

    # the same through --num-epoch-checkpoints on the save dir, in process
    monkeypatch.setattr(average_cli, "configure_logging", lambda verbose: None)
    again = tmp_path / "again.pt"
    assert average_cli.main(["--inputs", str(bn_run), "--num-epoch-checkpoints", "2",
                             "--output", str(again)]) == 0
    again = _load(again)
    assert all(torch.equal(again["model"][k], v) for k, v in out["model"].items())


@pytest.mark.slow
def test_reestimation_changes_running_statistics_only(averaged, reestimated):
    avg, re = _load(averaged), _load(reestimated)
    assert set(avg) == set(re) and set(avg["model"]) == set(re["model"])
    changed = []
    for k, v in avg["model"].items():
        if k.endswith(STAT_SUFFIXES) and "encoder.layers.0." in k:
            assert not torch.equal(v, re["model"][k]), k
            changed.append(k)
        else:  # parameters and every other buffer bit-identical
            assert torch.equal(v, re["model"][k]), k
    assert len(changed) == 4
    rec = re["extra_state"]["normplug_average"]["reestimated"]
    assert rec["batches"] == 3 and rec["split"] == "train"


@pytest.mark.slow
def test_reestimated_statistics_are_the_mean_of_batch_statistics(reestimated, averaged, tiny_data):
    """Replays the CLI's re-estimation in process with a recording hook on one BN
    layer: its new running mean/var are the plain mean, over the batches, of
    the biased mean/variance of the real tokens it received."""
    model, task, _ = load_model(str(averaged), str(tiny_data))
    norm = model.encoder.layers[0].self_attn_layer_norm
    seen = []

    def hook(module, args):
        x, pad = args[0], args[1]
        keep = ~pad.t().reshape(-1) if pad is not None else slice(None)
        xr = x.reshape(-1, x.shape[-1])[keep].double()
        seen.append((xr.mean(0), xr.var(0, unbiased=False)))

    norm.register_forward_pre_hook(hook)
    model.train()  # dropout would make the statistics random: the procedure must turn it off
    params = {k: p.detach().clone() for k, p in model.named_parameters()}
    tracked = norm.num_batches_tracked.clone()
    batches = iterate_batches(task, model, "train", 400, 3, seed=1)
    assert reestimate_population_statistics(model, batches) == 3
    assert len(seen) == 3
    want_mean = torch.stack([m for m, _ in seen]).mean(0)
    want_var = torch.stack([v for _, v in seen]).mean(0)
    torch.testing.assert_close(norm.running_mean.double(), want_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(norm.running_var.double(), want_var, rtol=1e-5, atol=1e-6)
    # what the CLI wrote is the same computation
    re = _load(reestimated)["model"]
    prefix = "encoder.layers.0.self_attn_layer_norm."
    torch.testing.assert_close(re[prefix + "running_mean"], norm.running_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(re[prefix + "running_var"], norm.running_var, rtol=1e-5, atol=1e-6)
    # nothing else moved; modes and momentum are back
    assert all(torch.equal(p, params[k]) for k, p in model.named_parameters())
    assert torch.equal(norm.num_batches_tracked, tracked)
    assert norm.momentum == 0.05
    assert model.training and all(m.training for m in model.modules())


class _Toy(nn.Module):
    """Linear -> dropout -> BN -> PowerNorm, called as fairseq models are (``**net_input``)."""

    def __init__(self, C=8):
        super().__init__()
        self.lin = nn.Linear(C, C)
        self.drop = nn.Dropout(0.5)
        self.bn = create_norm("batch", C)
        self.pn = create_norm("power", C, groups=2, warmup_updates=4)

    def forward(self, x, pad_mask):
        return self.pn(self.bn(self.drop(self.lin(x)), pad_mask), pad_mask)

    def batch_stat_norms(self):
        return {"bn": self.bn, "pn": self.pn}


def _toy_samples(n, C=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        T, B = 3 + i, 2 + i % 2
        pad = torch.zeros(B, T, dtype=torch.bool)
        pad[0, T - 1 - i % 2:] = True
        out.append({"net_input": {"x": torch.randn(T, B, C, generator=g) * (1 + i), "pad_mask": pad}})
    return out


def test_reestimation_of_batch_and_power_norms_unit():
    torch.manual_seed(0)
    model = _Toy()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    for step, s in enumerate(_toy_samples(6, seed=1)):  # train past PowerNorm's warm-up
        model.pn.set_num_updates(step)
        opt.zero_grad()
        model(**s["net_input"]).pow(2).sum().backward()
        opt.step()
    model.pn.set_num_updates(6)
    assert model.pn.nu.abs().sum() > 0
    before = {k: v.clone() for k, v in model.state_dict().items()}

    inputs = {"bn": [], "pn": []}

    def record(name):
        def hook(module, args):
            x, pad = args
            xr = x.reshape(-1, x.shape[-1])[~pad.t().reshape(-1)].double()
            inputs[name].append(xr)
        return hook

    model.bn.register_forward_pre_hook(record("bn"))
    model.pn.register_forward_pre_hook(record("pn"))
    samples = _toy_samples(4, seed=2)
    assert reestimate_population_statistics(model, iter(samples)) == 4

    bn_mean = torch.stack([x.mean(0) for x in inputs["bn"]]).mean(0)
    bn_var = torch.stack([x.var(0, unbiased=False) for x in inputs["bn"]]).mean(0)
    torch.testing.assert_close(model.bn.running_mean.double(), bn_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model.bn.running_var.double(), bn_var, rtol=1e-5, atol=1e-6)

    def quad_mean(x):  # PowerNorm's batch statistic: group scaling, then mean of squares
        z = x.view(-1, 2, 4)
        z = (z / (z.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()).view(-1, 8)
        return z.pow(2).mean(0)

    psi2 = torch.stack([quad_mean(x) for x in inputs["pn"]]).mean(0)
    torch.testing.assert_close(model.pn.running_psi2.double(), psi2, rtol=1e-5, atol=1e-6)

    after = model.state_dict()
    changed = {k for k in after if not torch.equal(after[k], before[k])}
    assert changed == {"bn.running_mean", "bn.running_var", "pn.running_psi2"}
    assert model.training and model.drop.training and model.bn.momentum == 0.05

    # dropout was off: the BN layer saw the deterministic eval-mode activations
    with torch.no_grad():
        model.eval()
        clean = model.lin(samples[0]["net_input"]["x"])
    pad = samples[0]["net_input"]["pad_mask"]
    torch.testing.assert_close(inputs["bn"][0], clean.reshape(-1, 8)[~pad.t().reshape(-1)].double())


@pytest.mark.slow
def test_output_loads_in_fairseq_generate(reestimated, tiny_data):
    proc = run_cli("fairseq-generate", tiny_data, "--user-dir", USER_DIR, "--path", reestimated,
                   "--gen-subset", "valid", "--beam", "2", "--max-tokens", "400", "--cpu",
                   "--max-len-a", "0", "--max-len-b", "4", "--batch-size", "24")
    assert "Translated 24 sentences" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_errors(bn_run, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(average_cli, "configure_logging", lambda verbose: None)
    no_bn = _no_bn_checkpoint(bn_run / "checkpoint1.pt", tmp_path / "ln.pt")
    out = tmp_path / "out.pt"

    def expect(argv, needle):
        with pytest.raises(SystemExit) as exc:
            average_cli.main([str(a) for a in argv])
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("normplug-average: error: "), err
        assert needle in err[0], err[0]

    expect(["--inputs", tmp_path / "missing.pt", "--output", out], "checkpoint not found")
    expect(["--inputs", bn_run / "checkpoint1.pt", no_bn, "--output", out], "different parameters")
    expect(["--inputs", bn_run, "--num-epoch-checkpoints", "5", "--output", out],
           "found 2 epoch checkpoint(s)")
    expect(["--inputs", bn_run, "--output", out], "is a directory")
    expect(["--inputs", no_bn, "--output", out, "--reestimate-stats"], "has no BN/PN layer")
    assert sorted(os.listdir(tmp_path)) == ["ln.pt"]  # nothing half-written


def test_output_may_not_be_an_input(tmp_path, monkeypatch, capsys):
    """An average written over one of its inputs would destroy it: refused before reading any."""
    monkeypatch.setattr(average_cli, "configure_logging", lambda verbose: None)
    for name in ("checkpoint1.pt", "checkpoint2.pt"):
        (tmp_path / name).write_bytes(b"not read")
    monkeypatch.chdir(tmp_path)
    for argv in (["--inputs", "checkpoint1.pt", "checkpoint2.pt", "--output", str(tmp_path / "checkpoint2.pt")],
                 ["--inputs", ".", "--num-epoch-checkpoints", "2", "--output", "./checkpoint1.pt"]):
        with pytest.raises(SystemExit) as exc:
            average_cli.main(argv)
        assert exc.value.code == 2
        assert capsys.readouterr().err.splitlines() == [
            f"normplug-average: error: --output {argv[-1]} is one of the inputs: write the average to another file"]
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == {
        "checkpoint1.pt": b"not read", "checkpoint2.pt": b"not read"}
