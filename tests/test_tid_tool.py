"""normplug-tid: TID of BN/PN layers of real fairseq checkpoints (Wang, Wu & Huang 2022).

A tiny BN model is trained once by a real ``fairseq-train`` (shared with
tests/test_average.py through :func:`trained_bn_run`); the tool runs as a
console script on one and on several of its checkpoints; its numbers are
checked against an independent computation, by hand, from the inputs the
norm layers receive; and each user error gives one line and exit code 2.
"""
import csv
import math
import os
import sys

import pytest
import torch

from conftest import REPO, run_cli, train_args

import normplug  # noqa: F401  (registers the plugin)
from normplug.norms import create_norm
from normplug.tools import tid as tid_cli
from normplug.tools.common import numbered_checkpoints
from normplug.tools.tid import TIDMeter, batch_tid

ARCH = "transformer_iwslt_de_en_bn"
LAYERS = ["enc0.self_attn", "enc0.ffn"]

_RUNS = {}


def trained_bn_run(tmp_path_factory, tiny_data):
    """Save dir of a 2-epoch tiny BN run, trained once per test session.

    Checkpoints: checkpoint1.pt (8 updates), checkpoint2.pt (16), and update
    checkpoints every 4 updates that are not epoch ends (checkpoint_1_4.pt,
    checkpoint_2_12.pt).
    """
    if "bn" not in _RUNS:
        save = tmp_path_factory.mktemp("tid_bn_run")
        run_cli("fairseq-train", *train_args(
            tiny_data, save, ARCH, "--save-interval-updates", "4", "--max-epoch", "2",
            updates=1000,
        ))
        _RUNS["bn"] = save
    return _RUNS["bn"]


@pytest.fixture(scope="module")
def bn_run(tmp_path_factory, tiny_data):
    return trained_bn_run(tmp_path_factory, tiny_data)


def numbered(save):
    return numbered_checkpoints(str(save))


# --- the measurement itself, on one layer and hand-built batches -----------------

def _hand_bn_tid(x, pad_mask, mu_hat, var_hat):
    """mean_c |μ̂−μ_B|/σ_B and mean_c |σ̂/σ_B − 1| over the real tokens, in float64."""
    T, B, C = x.shape
    keep = ~pad_mask.t().reshape(-1)
    xr = x.reshape(T * B, C)[keep].double()
    mu = xr.mean(0)
    var = ((xr - mu) ** 2).mean(0)
    sd = var.sqrt()
    tid_mean = ((mu_hat.double() - mu).abs() / sd).mean().item()
    tid_var = (var_hat.double().sqrt() / sd - 1).abs().mean().item()
    return tid_mean, tid_var, int(keep.sum())


def _batch(T, B, C, lengths, seed, scale=1.0, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, B, C, generator=g) * scale + shift
    pad = torch.ones(B, T, dtype=torch.bool)
    for b, n in enumerate(lengths):
        pad[b, :n] = False
    x = x.masked_fill(pad.t().unsqueeze(-1), 1e6)  # garbage at padding must not count
    return x, pad


def test_batch_tid_of_one_bn_layer_matches_hand_computation():
    C = 8
    norm = create_norm("batch", C, momentum=0.3)
    norm.train()
    for seed in range(3):  # move the running statistics away from (0, 1)
        x, pad = _batch(6, 4, C, [6, 3, 5, 2], seed, scale=2.0, shift=0.5)
        norm(x, pad)
    norm.eval()
    mu_hat, var_hat = norm.running_mean.clone(), norm.running_var.clone()

    x, pad = _batch(7, 3, C, [7, 4, 2], seed=10, scale=1.5, shift=-0.2)
    tid_mean, tid_var, tokens = batch_tid(norm, x, pad)
    want_mean, want_var, n = _hand_bn_tid(x, pad, mu_hat, var_hat)
    assert tokens == n == 13
    assert tid_mean == pytest.approx(want_mean, rel=1e-5)
    assert tid_var == pytest.approx(want_var, rel=1e-5)
    # measuring changes nothing
    assert torch.equal(norm.running_mean, mu_hat) and torch.equal(norm.running_var, var_hat)

    # The meter: forward pre-hooks, token-weighted over batches, eval forward untouched.
    x2, pad2 = _batch(4, 2, C, [4, 1], seed=11)
    with TIDMeter({"layer": norm}) as meter, torch.no_grad():
        y = norm(x, pad)
        norm(x2, pad2)
        norm(x2[:1, :1], pad2[:1, :1])  # a single real token: no variance, skipped
    assert torch.isfinite(y).all()
    (res,) = meter.results()
    m2, v2, n2 = _hand_bn_tid(x2, pad2, mu_hat, var_hat)
    assert (res.layer, res.norm, res.batches, res.tokens) == ("layer", "batch", 2, n + n2)
    assert res.tid_mean == pytest.approx((n * want_mean + n2 * m2) / (n + n2), rel=1e-5)
    assert res.tid_var == pytest.approx((n * want_var + n2 * v2) / (n + n2), rel=1e-5)
    # hooks are gone after the block
    assert not norm._forward_pre_hooks


def test_batch_tid_of_one_power_layer_matches_hand_computation():
    C, G = 8, 2
    norm = create_norm("power", C, groups=G, warmup_updates=100)
    norm.train()
    for seed in range(2):
        x, pad = _batch(5, 3, C, [5, 2, 4], seed, scale=3.0)
        norm(x, pad)
    norm.eval()
    psi2 = norm.running_psi2.clone()
    x, pad = _batch(6, 3, C, [6, 5, 1], seed=7, scale=0.7, shift=0.3)
    tid_mean, tid_var, tokens = batch_tid(norm, x, pad)
    # by hand: group-scale each real token, quadratic mean per channel, no mean statistic
    keep = ~pad.t().reshape(-1)
    z = x.reshape(-1, C)[keep].double().view(-1, G, C // G)
    z = (z / (z.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()).view(-1, C)
    sigma2 = z.pow(2).mean(0)
    want = (psi2.double().sqrt() / sigma2.sqrt() - 1).abs().mean().item()
    assert tid_mean is None
    assert tokens == 12
    assert tid_var == pytest.approx(want, rel=1e-5)


# --- the console script ----------------------------------------------------------

def _read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _check_png(path):
    from PIL import Image

    assert os.path.getsize(path) > 5000
    with Image.open(path) as im:
        im.verify()
    with Image.open(path) as im:
        assert im.format == "PNG"
        w, h = im.size
    assert 400 <= w <= 4000 and 300 <= h <= 4000, (w, h)


@pytest.mark.slow
def test_one_checkpoint_table_csv_and_figure(bn_run, tiny_data, tmp_path):
    ckpt = bn_run / "checkpoint2.pt"
    out_csv, out_png = tmp_path / "tid.csv", tmp_path / "tid.png"
    proc = run_cli("normplug-tid", ckpt, "--data", tiny_data, "--max-tokens", "100",
                   "--csv", out_csv, "--plot", out_png, "--cpu")
    assert "epoch 2, 16 updates" in proc.stdout
    for layer in LAYERS:
        line = next(l for l in proc.stdout.splitlines() if l.split()[:1] == [layer])
        assert len(line.split()) == 5 and line.split()[1] == "batch"
    rows = _read_csv(out_csv)
    assert list(rows[0]) == tid_cli.CSV_COLUMNS
    assert [r["layer"] for r in rows] == LAYERS
    for r in rows:
        assert (r["checkpoint"], r["epoch"], r["num_updates"]) == (str(ckpt), "2", "16")
        assert math.isfinite(float(r["tid_mean"])) and float(r["tid_mean"]) > 0
        assert math.isfinite(float(r["tid_var"])) and float(r["tid_var"]) > 0
        assert int(r["batches"]) >= 2  # --max-tokens 100 splits the 24 valid sentences
    _check_png(out_png)
    assert sorted(os.listdir(tmp_path)) == ["tid.csv", "tid.png"]  # no temporary left


@pytest.mark.slow
def test_several_checkpoints_over_training(bn_run, tiny_data, tmp_path):
    out_csv, out_png = tmp_path / "over.csv", tmp_path / "over.png"
    # printed in the order given (a save dir's checkpoints oldest first); run as `python -m normplug.tools.tid`
    proc = run_cli("python", "-m", "normplug.tools.tid", bn_run / "checkpoint2.pt",
                   bn_run / "checkpoint_1_4.pt", bn_run / "checkpoint1.pt", "--data", tiny_data,
                   "--max-tokens", "100", "--csv", out_csv, "--plot", out_png, "--cpu", cwd=REPO)
    assert proc.stdout.index("checkpoint2.pt (") < proc.stdout.index("checkpoint_1_4.pt") < \
        proc.stdout.index("checkpoint1.pt (")
    rows = _read_csv(out_csv)
    assert len(rows) == 3 * len(LAYERS)
    assert [int(r["num_updates"]) for r in rows] == [16, 16, 4, 4, 8, 8]
    assert [r["epoch"] for r in rows] == ["2", "2", "1", "1", "1", "1"]
    assert [r["layer"] for r in rows] == LAYERS * 3
    assert all(math.isfinite(float(r[k])) for r in rows for k in ("tid_mean", "tid_var"))
    _check_png(out_png)

    # a save dir gives every numbered checkpoint, oldest first
    found = [os.path.basename(p) for p in numbered(bn_run)]
    assert found == ["checkpoint_1_4.pt", "checkpoint1.pt", "checkpoint_2_12.pt", "checkpoint2.pt"]


@pytest.mark.slow
def test_numbers_equal_an_independent_computation(bn_run, tiny_data, tmp_path, monkeypatch, capsys):
    """The CLI's per-layer TID equals the token-weighted mean, over every batch of
    the split, of the formulas applied by hand to what each BN layer receives."""
    from fairseq import checkpoint_utils, utils

    ckpt = bn_run / "checkpoint1.pt"
    monkeypatch.setattr(tid_cli, "configure_logging", lambda verbose: None)
    out_csv = tmp_path / "t.csv"
    assert tid_cli.main([str(ckpt), "--data", str(tiny_data), "--max-tokens", "100",
                         "--csv", str(out_csv), "--cpu"]) == 0
    got = {r["layer"]: r for r in _read_csv(out_csv)}

    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(ckpt)], arg_overrides={"data": str(tiny_data)})
    model = models[0].eval()
    modules = {"enc0.self_attn": model.encoder.layers[0].self_attn_layer_norm,
               "enc0.ffn": model.encoder.layers[0].final_layer_norm}
    sums = {k: [0.0, 0.0, 0] for k in modules}

    def record(name):
        def hook(module, args):
            x, pad = args[0], args[1]
            if pad is None:
                pad = torch.zeros(x.shape[1], x.shape[0], dtype=torch.bool)
            m, v, n = _hand_bn_tid(x, pad, module.running_mean, module.running_var)
            sums[name][0] += n * m
            sums[name][1] += n * v
            sums[name][2] += n
        return hook

    for name, module in modules.items():
        module.register_forward_pre_hook(record(name))
    task.load_dataset("valid")
    itr = task.get_batch_iterator(
        dataset=task.dataset("valid"), max_tokens=100, seed=1,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=True,
    ).next_epoch_itr(shuffle=False)
    with torch.no_grad():
        for sample in itr:
            model(**sample["net_input"])
    for name, (sm, sv, n) in sums.items():
        assert int(got[name]["tokens"]) == n
        assert float(got[name]["tid_mean"]) == pytest.approx(sm / n, rel=1e-4)
        assert float(got[name]["tid_var"]) == pytest.approx(sv / n, rel=1e-4)


# --- errors: one line, exit code 2, no traceback, no output file -----------------

def _no_bn_checkpoint(src, dst):
    """The BN checkpoint turned into an all-LayerNorm one (same parameters)."""
    state = torch.load(src)
    model = state["cfg"]["model"]  # the model's dataclass, as a dict
    model["encoder_self_attn_norm"] = model["encoder_ffn_norm"] = "layer"
    state["model"] = {k: v for k, v in state["model"].items()
                      if not k.endswith(("running_mean", "running_var", "num_batches_tracked"))}
    torch.save(state, dst)
    return dst


def _bad_momentum_checkpoint(src, dst):
    """The BN checkpoint with a BN momentum no model can be built with."""
    state = torch.load(src)
    state["cfg"]["model"]["bn_momentum"] = 5.0
    torch.save(state, dst)
    return dst


def _expect_error(capsys, argv, *needles):
    with pytest.raises(SystemExit) as exc:
        tid_cli.main([str(a) for a in argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("normplug-tid: error: "), err
    for needle in needles:
        assert needle in err[0], err[0]
    return err[0]


@pytest.mark.slow
def test_errors(bn_run, tiny_data, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tid_cli, "configure_logging", lambda verbose: None)
    good = bn_run / "checkpoint1.pt"
    outs = ["--csv", tmp_path / "e.csv", "--plot", tmp_path / "e.png", "--max-tokens", "100"]
    no_bn = _no_bn_checkpoint(good, tmp_path / "ln.pt")
    _expect_error(capsys, [tmp_path / "missing.pt", *outs], "checkpoint not found", "missing.pt")
    _expect_error(capsys, [no_bn, "--data", tiny_data, *outs], "has no BN/PN layer")
    bad = _bad_momentum_checkpoint(good, tmp_path / "bad.pt")
    _expect_error(capsys, [bad, "--data", tiny_data, *outs], "cannot build the model", "momentum", "got 5.0")
    _expect_error(capsys, [good, "--data", tmp_path / "nodata", *outs], "data directory not found")
    _expect_error(capsys, [good, "--data", tiny_data, "--split", "nosuch", *outs],
                  "cannot load split 'nosuch'")
    garbage = tmp_path / "garbage.pt"
    garbage.write_text("not a checkpoint\n")
    _expect_error(capsys, [garbage, *outs], "cannot read checkpoint", "garbage.pt")
    # the good checkpoint first: the failure comes after one was measured
    _expect_error(capsys, [good, tmp_path / "missing.pt", *outs], "checkpoint not found")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.pt", "garbage.pt", "ln.pt"]


@pytest.mark.slow
def test_truncated_checkpoint(bn_run, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tid_cli, "configure_logging", lambda verbose: None)
    data = (bn_run / "checkpoint1.pt").read_bytes()
    for name, content in (("half.pt", data[: len(data) // 2]), ("head.pt", data[:100]),
                          ("empty.pt", b"")):
        path = tmp_path / name
        path.write_bytes(content)
        _expect_error(capsys, [path, "--csv", tmp_path / "t.csv", "--plot", tmp_path / "t.png"],
                      f"cannot read checkpoint {path}", "truncated, corrupt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.pt", "half.pt", "head.pt"]


def test_plot_without_matplotlib_names_the_extra(tmp_path, monkeypatch, capsys):
    """matplotlib is the optional 'plot' extra: --plot without it fails before any work."""
    monkeypatch.setattr(tid_cli, "configure_logging", lambda verbose: None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    message = _expect_error(capsys, [tmp_path / "missing.pt", "--plot", tmp_path / "t.png"],
                            "needs matplotlib", ": pip install matplotlib")
    assert "checkpoint not found" not in message  # refused before reading any checkpoint
    assert list(tmp_path.iterdir()) == []


def test_a_library_error_is_one_line(tmp_path, monkeypatch, capsys):
    """A NormplugError from the library (a bad option found while measuring) ends the tool
    with one line and exit status 2, like its own errors."""
    from normplug.errors import NormplugError

    def refuse(args):
        raise NormplugError("a bad option, named")

    monkeypatch.setattr(tid_cli, "configure_logging", lambda verbose: None)
    monkeypatch.setattr(tid_cli, "run", refuse)
    _expect_error(capsys, [tmp_path / "any.pt", "--csv", tmp_path / "t.csv"], "a bad option, named")
    assert list(tmp_path.iterdir()) == []


def _fairseq_fails(monkeypatch, tmp_path, missing_module, missing=(), versions=None):
    """``import fairseq`` raises ModuleNotFoundError for ``missing_module``; the distributions ``missing``
    are not installed and ``versions`` ({name: version}) are what the others report."""
    import importlib.metadata

    fake = tmp_path / "fake" / "fairseq"
    fake.mkdir(parents=True, exist_ok=True)
    (fake / "__init__.py").write_text(f"raise ModuleNotFoundError(\"No module named '{missing_module}'\", "
                                      f"name={missing_module!r})\n")
    monkeypatch.syspath_prepend(str(fake.parent))
    monkeypatch.delitem(sys.modules, "fairseq")
    real = importlib.metadata.version

    def version(name):
        if name in missing:
            raise importlib.metadata.PackageNotFoundError(name)
        return (versions or {}).get(name) or real(name)
    monkeypatch.setattr(importlib.metadata, "version", version)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="the pins are fairseq-fixed's, for Python >= 3.11")
def test_without_fairseq_one_line_names_the_missing_module_and_what_installs_it(tmp_path, monkeypatch, capsys):
    """Never the command that was just run: fairseq installed without its dependencies is told to install
    those; fairseq missing is told to install fairseq; a numpy of another major version, its range."""
    from normplug.tools import average as average_cli
    from normplug.tools.common import INSTALL_FAIRSEQ

    for tool in (tid_cli, average_cli):
        monkeypatch.setattr(tool, "configure_logging", lambda verbose: None)
    route = "(README: Using it from your own environment)"
    with monkeypatch.context() as m:  # the loop: pip install --no-deps fairseq-fixed, then this
        _fairseq_fails(m, tmp_path, "omegaconf", missing=("omegaconf", "hydra-core"))
        assert _expect_error(capsys, [tmp_path / "any.pt"]) == (
            "normplug-tid: error: normplug-tid needs fairseq, which does not import (ModuleNotFoundError: No module "
            f"named 'omegaconf'); install them: pip install hydra-core==1.3.2 omegaconf==2.3.0 {route}")
    with monkeypatch.context() as m:
        _fairseq_fails(m, tmp_path, "fairseq", missing=("fairseq-fixed",), versions={"numpy": "2.1.0"})
        assert _expect_error(capsys, [tmp_path / "any.pt"]).endswith(
            f"(ModuleNotFoundError: No module named 'fairseq'); install them: pip install 'numpy<2,>=1.21.3' && "
            f"{INSTALL_FAIRSEQ} {route}")
    with monkeypatch.context() as m:
        _fairseq_fails(m, tmp_path, "fairseq", missing=("fairseq-fixed",))
        with pytest.raises(SystemExit):  # averaging alone needs only torch; re-estimating runs the model
            average_cli.main(["--inputs", str(tmp_path / "a.pt"), "--output", str(tmp_path / "b.pt"),
                              "--reestimate-stats"])
        assert capsys.readouterr().err.splitlines() == [
            "normplug-average: error: normplug-average --reestimate-stats needs fairseq, which does not import "
            f"(ModuleNotFoundError: No module named 'fairseq'); install it: {INSTALL_FAIRSEQ} {route}"]
    with monkeypatch.context() as m:  # everything declared is there: nothing to install, say where to look
        _fairseq_fails(m, tmp_path, "tensorboardX")
        assert _expect_error(capsys, [tmp_path / "any.pt"]).endswith(
            "(ModuleNotFoundError: No module named 'tensorboardX'); fairseq and every package normplug declares "
            "for it are installed: `python -c 'import fairseq'` shows the whole error")


def test_the_plot_gives_bn_and_rbn_their_own_colours(tmp_path, monkeypatch):
    """make demo's figure, BN against RBN: every line of a layer has its own colour, none shared between the
    runs; one run alone keeps a colour per layer."""
    from matplotlib.colors import to_hex
    from matplotlib.figure import Figure

    from normplug.tools.common import CheckpointInfo

    layers = [tid_cli.LayerTID(name, "batch", 0.1, 0.2, 1, 10) for name in [*LAYERS, "enc1.self_attn", "enc1.ffn"]]
    series = [(CheckpointInfo(f"checkpoint{e}.pt", e, 8 * e), layers) for e in (1, 2)]
    drawn = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *args, **kwargs: drawn.append(
        [(line.get_label(), to_hex(line.get_color()), line.get_linestyle()) for line in fig.axes[0].lines]))
    tid_cli.draw({"BN": series, "RBN": series}, tmp_path / "t.png", "valid")
    tid_cli.draw({"": series}, tmp_path / "t.png", "valid")
    two, one = drawn
    assert [label for label, _, _ in two] == [f"{run} {layer.layer}" for run in ("BN", "RBN") for layer in layers]
    assert len({colour for _, colour, _ in two}) == 8 and {style for _, _, style in two} == {"-", "--"}
    assert len({colour for _, colour, _ in one}) == 4


def test_help_gives_the_definitions_it_announces():
    """The description ends in the equations its colon announces, without the docstring's markup."""
    text = tid_cli.build_parser().format_help()
    assert "on a held-out split:\n\n    mean TID     = mean_c |μ̂_c − μ_B,c| / σ_B,c\n" \
           "    variance TID = mean_c |σ̂_c / σ_B,c − 1|\n" in text and "``" not in text
