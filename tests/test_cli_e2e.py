"""The real fairseq command lines with --user-dir normplug, as subprocesses.

Two training runs cover every norm kind at some site: a Pre-Norm model (every
site a different kind, final norms included, RBN criterion) that is trained,
resumed, decoded by fairseq-generate and fairseq-interactive; and a Post-Norm
model with batch statistics in the decoder and --compile-norms.

The refusals (bad flags, a decoder that cannot decode incrementally) run the console
scripts' own ``cli_main`` in this process: each stops before training or decoding, so
a subprocess would be mostly interpreter and fairseq start-up (~3 s of CPU each). fairseq's
argparse refuses a flag with its usage and exit status 2; normplug's library raises
NormplugError, which the console script ends with: its traceback, whose last line is
``normplug.errors.NormplugError: <message>``.
"""
import importlib
import re
import shutil
import sys
import traceback
import warnings

import pytest
import torch

from conftest import USER_DIR, run_cli, train_args

from normplug.checkpoints import SAFE_GLOBALS
from normplug.errors import NormplugError

ERROR_LINE = "normplug.errors.NormplugError: "

PRE_NORM = [
    "--encoder-normalize-before", "--decoder-normalize-before",
    "--encoder-self-attn-norm", "batch", "--encoder-ffn-norm", "detach", "--encoder-final-norm", "power",
    "--decoder-self-attn-norm", "layer_simple", "--decoder-cross-attn-norm", "rms",
    "--decoder-ffn-norm", "scale", "--decoder-final-norm", "adanorm",
    "--power-warmup", "2", "--power-final-warmup", "1", "--detach-mode", "mean", "--adanorm-scale", "2",
    "--criterion", "label_smoothed_cross_entropy_rbn", "--rbn-mean-weight", "0.1", "--rbn-var-weight", "0.01",
]
POST_NORM = [
    "--encoder-self-attn-norm", "identity", "--encoder-ffn-norm", "layer",
    "--decoder-self-attn-norm", "batch", "--decoder-cross-attn-norm", "power", "--decoder-ffn-norm", "batch",
    "--bn-momentum", "0.1", "--compile-norms",
]
PER_LAYER_TID = ("tid_mean/enc0.self_attn", "tid_var/enc0.self_attn", "tid_var/enc.final")


def _generate_args(data, checkpoint, *extra):
    return [data, "--user-dir", USER_DIR, "--path", checkpoint, "--gen-subset", "test", "--beam", "2",
            "--max-len-b", "20", "--batch-size", "16", "--cpu", *extra]


def _generate(data, checkpoint, *extra):
    return run_cli("fairseq-generate", *_generate_args(data, checkpoint, *extra))


def _refused_in_process(tool, args, monkeypatch, capsys):
    """Run fairseq's ``tool`` (its ``cli_main``, as the console script does) in this process on
    arguments it must refuse. Returns (exit status, stdout, stderr) as the interpreter would
    leave them: a SystemExit message is printed to stderr with status 1, a NormplugError's
    traceback with status 1; any other exception fails the test."""
    cli = importlib.import_module("fairseq_cli." + tool.split("-", 1)[1])
    monkeypatch.setattr(sys, "argv", [tool, *map(str, args)])
    capsys.readouterr()
    code, tail = None, ""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # as PYTHONWARNINGS=ignore in run_cli's processes
        try:
            cli.cli_main()
        except SystemExit as stop:
            code = stop.code
            if isinstance(code, str):
                code, tail = 1, code + "\n"
        except NormplugError as error:
            code, tail = 1, "".join(traceback.format_exception(error))
    assert code is not None, f"{tool} did not refuse {args}"
    out, err = capsys.readouterr()
    return code, out, err + tail


def _normplug_error(err):
    """The message of a NormplugError that ended a console script: the last line of stderr,
    after one traceback of that error alone (no other exception raised while handling it)."""
    assert err.count("Traceback (most recent call last)") == 1 and "During handling" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith(ERROR_LINE), last
    return last[len(ERROR_LINE):]


@pytest.fixture(scope="module")
def pre_norm_run(tiny_data, tmp_path_factory):
    save = tmp_path_factory.mktemp("pre") / "ck"
    proc = run_cli("fairseq-train", *train_args(tiny_data, save, "norm_transformer", *PRE_NORM, updates=3))
    return save, proc.stdout + proc.stderr


@pytest.mark.slow
def test_every_site_trains_logs_and_decodes(tiny_data, pre_norm_run):
    save, log = pre_norm_run
    checkpoint = save / "checkpoint_last.pt"
    # torch >= 2.6 loads weights-only: the allow-list covers everything a checkpoint pickles
    assert set(torch.serialization.get_unsafe_globals_in_checkpoint(str(checkpoint))) <= {
        f"{t.__module__}.{t.__qualname__}" for t in SAFE_GLOBALS}
    model = torch.load(checkpoint)["model"]
    # fairseq hands the norms the updates done before each step: 2 before the third
    assert model["encoder.final_norm.num_updates"] == 2 and "encoder.final_norm.running_psi2" in model
    inner = [line for line in log.splitlines() if "| train_inner |" in line]
    assert len(inner) == 3
    for line in inner:  # the same keys on every step, penalty and TID apart
        for key in ("task_loss", "rbn_penalty", "rbn_mean", "rbn_var", "tid_mean", "tid_var", *PER_LAYER_TID):
            assert re.search(rf"[ |,]{re.escape(key)}[= ][0-9.]", line), (key, line)
    valid = [line for line in log.splitlines() if "| valid |" in line]
    assert valid and "rbn_mean" not in valid[0] and "task_loss" in valid[0]
    gen = _generate(tiny_data, checkpoint, "--scoring", "sacrebleu")
    assert re.search(r"BLEU = \d+\.\d+", gen.stdout + gen.stderr)
    assert len(re.findall(r"^H-\d+\t", gen.stdout, flags=re.M)) == 24


@pytest.mark.slow
def test_resume_and_interactive(tiny_data, pre_norm_run, tmp_path):
    save = tmp_path / "ck"
    shutil.copytree(pre_norm_run[0], save)
    resumed = run_cli("fairseq-train", *train_args(tiny_data, save, "norm_transformer", *PRE_NORM, updates=4))
    log = resumed.stdout + resumed.stderr
    assert "Loaded checkpoint" in log and "num_updates 4" in log
    inter = run_cli("fairseq-interactive", tiny_data, "--user-dir", USER_DIR, "--path",
                    save / "checkpoint_last.pt", "--cpu", "--beam", "2", "--source-lang", "src",
                    "--target-lang", "tgt", input="w1 w2 w3\n")
    assert re.search(r"^H-0\t", inter.stdout, flags=re.M)


@pytest.mark.slow
def test_compiled_post_norm_with_decoder_batch_statistics(tiny_data, tmp_path, monkeypatch, capsys):
    save = tmp_path / "ck"
    run_cli("fairseq-train", *train_args(tiny_data, save, "norm_transformer", *POST_NORM, updates=3))
    checkpoint = save / "checkpoint_last.pt"
    gen = _generate(tiny_data, checkpoint)
    assert len(re.findall(r"^H-\d+\t", gen.stdout, flags=re.M)) == 24
    # test-batch statistics cannot work one token at a time: refused before any output
    code, out, err = _refused_in_process(
        "fairseq-generate", _generate_args(tiny_data, checkpoint, "--model-overrides", "{'bn_test_stats': 'batch'}"),
        monkeypatch, capsys)
    assert code == 1 and "incremental decoding" in _normplug_error(err)
    assert not re.search(r"^H-\d+\t", out, flags=re.M)


def test_bad_flags_stop_with_one_line_before_anything_is_written(tiny_data, tmp_path, monkeypatch, capsys):
    # (flags, what the last line names, exit status): 2 is fairseq's argparse (usage and
    # message, no traceback), 1 a NormplugError raised while the model is built
    cases = [
        (["--arch", "transformer_iwslt_de_en_pn", "--rbn-mean-weight", "60", "--disable-validation"],
         ("--rbn-mean-weight", "no 'batch' norm", "power"), 1),
        (["--arch", "transformer_iwslt_de_en_pn", "--power-groups", "3"],
         ("groups=3 does not divide dim=16", "--encoder-self-attn-norm power"), 1),
        (["--encoder-norm", "batch", "--bn-momentum", "1.5"], ("--bn-momentum", "(0, 1]", "1.5"), 2),
        (["--power-alpha-fwd", "2"], ("--power-alpha-fwd", "[0, 1]"), 2),
        (["--encoder-norm", "powernorm"], ("powernorm", "batch", "layer"), 2),
        (["--rbn-var-weight", "-1"], ("--rbn-var-weight", "-1"), 1),
        (["--encoder-attn-norm", "batch"], ("unrecognized arguments: --encoder-attn-norm",), 2),
    ]
    for i, (flags, needles, code) in enumerate(cases):
        folder = tmp_path / f"s{i}"
        # a later --arch wins over train_args' own (argparse)
        args = train_args(tiny_data, folder, "transformer_iwslt_de_en_ln", "--criterion",
                          "label_smoothed_cross_entropy_rbn", *flags, updates=6)
        status, _, err = _refused_in_process("fairseq-train", args, monkeypatch, capsys)
        assert status == code, (flags, err[-2000:])
        if code == 1:
            last = _normplug_error(err)
        else:
            assert "Traceback" not in err, err[-3000:]
            last = err.strip().splitlines()[-1]
            assert "error:" in last, (flags, last)
        assert all(n in last for n in needles), (flags, last)
        assert not folder.exists() or not any(folder.iterdir()), (flags, list(folder.iterdir()))
