"""The real fairseq command lines with --user-dir normplug, as subprocesses."""
import re

import pytest
import torch

from conftest import USER_DIR, run_cli, train_args

from normplug.compat import SAFE_GLOBALS

# (architecture, extra fairseq-train flags): every norm kind, Post- and Pre-Norm mixed
RUNS = {
    "ln": ("transformer_iwslt_de_en_ln", []),
    "lnsimple": ("transformer_iwslt_de_en_lnsimple_prenorm", []),
    "detach": ("transformer_iwslt_de_en_detach", ["--detach-mode", "mean"]),
    "adanorm": ("transformer_iwslt_de_en_adanorm_prenorm", ["--adanorm-scale", "2"]),
    "rms": ("transformer_iwslt_de_en_rms", []),
    "scale": ("transformer_iwslt_de_en_scale_prenorm", []),
    "nonorm": ("transformer_iwslt_de_en_nonorm_prenorm", []),
    "bn": ("transformer_iwslt_de_en_bn", ["--bn-momentum", "0.1"]),
    "rbn": ("transformer_iwslt_de_en_rbn_prenorm",
            ["--criterion", "label_smoothed_cross_entropy_rbn", "--rbn-mean-weight", "0.1",
             "--rbn-var-weight", "0.01"]),
    "pn": ("transformer_iwslt_de_en_pn", ["--power-warmup", "2"]),
}


def generate(data, checkpoint, *extra):
    return run_cli(
        "fairseq-generate", data, "--user-dir", USER_DIR, "--path", checkpoint,
        "--gen-subset", "test", "--beam", "2", "--max-len-b", "20", "--batch-size", "16",
        "--cpu", "--scoring", "sacrebleu", "--remove-bpe", *extra,
    )


@pytest.mark.parametrize("kind", sorted(RUNS))
def test_train_then_generate(tiny_data, tmp_path, kind):
    arch, extra = RUNS[kind]
    # a later --criterion in `extra` wins over train_args' default (argparse)
    train = run_cli("fairseq-train", *train_args(tiny_data, tmp_path / "ck", arch, *extra))
    checkpoint = tmp_path / "ck" / "checkpoint_last.pt"
    assert checkpoint.exists() and checkpoint.stat().st_size > 10_000
    assert "num_updates 3" in train.stdout + train.stderr
    # fairseq >= 2.6 torch loads weights-only: the allow-list covers what we pickle
    assert set(torch.serialization.get_unsafe_globals_in_checkpoint(str(checkpoint))) <= {
        f"{t.__module__}.{t.__qualname__}" for t in SAFE_GLOBALS
    }
    gen = generate(tiny_data, checkpoint)
    out = gen.stdout + gen.stderr
    assert re.search(r"BLEU = \d+\.\d+", out), out[-2000:]
    assert len(re.findall(r"^H-\d+\t", gen.stdout, flags=re.M)) == 24


def test_rbn_criterion_logs_task_loss_penalty_and_tid(tiny_data, tmp_path):
    arch, extra = RUNS["rbn"]
    out = run_cli("fairseq-train", *train_args(tiny_data, tmp_path / "ck", arch, *extra))
    log = out.stdout + out.stderr
    inner = [line for line in log.splitlines() if "| train_inner |" in line]
    assert len(inner) == 3
    for line in inner:
        for key in ("task_loss", "rbn_penalty", "rbn_mean", "rbn_var", "tid_mean", "tid_var",
                    "tid_mean/enc0.attn", "tid_var/enc0.ffn"):
            assert re.search(rf"[ |,]{re.escape(key)}[= ][0-9.]", line), (key, line)
    valid = [line for line in log.splitlines() if "| valid |" in line]
    assert valid and "rbn_mean" not in valid[0] and "task_loss" in valid[0]


def test_resume_and_interactive_load_plugin_checkpoints(tiny_data, tmp_path):
    save = tmp_path / "ck"
    run_cli("fairseq-train", *train_args(tiny_data, save, "transformer_iwslt_de_en_pn_prenorm",
                                         "--power-warmup", "2", updates=2))
    resumed = run_cli("fairseq-train", *train_args(tiny_data, save, "transformer_iwslt_de_en_pn_prenorm",
                                                   "--power-warmup", "2", updates=4))
    log = resumed.stdout + resumed.stderr
    assert "Loaded checkpoint" in log and "num_updates 4" in log
    inter = run_cli("fairseq-interactive", tiny_data, "--user-dir", USER_DIR,
                    "--path", save / "checkpoint_last.pt", "--cpu", "--beam", "2",
                    "--source-lang", "src", "--target-lang", "tgt", input="w1 w2 w3\n")
    assert re.search(r"^H-0\t", inter.stdout, flags=re.M)


def test_clear_errors_from_the_command_line(tiny_data, tmp_path):
    bad = run_cli("fairseq-train", *train_args(tiny_data, tmp_path / "a", "transformer_iwslt_de_en_ln",
                                               "--criterion", "label_smoothed_cross_entropy_rbn",
                                               "--rbn-mean-weight", "60"), check=False)
    assert bad.returncode != 0
    assert "normplug: error:" in bad.stderr and "no 'batch' norm" in bad.stderr
    assert "Traceback" not in bad.stderr
    assert not (tmp_path / "a" / "checkpoint_last.pt").exists()

    bad = run_cli("fairseq-train", *train_args(tiny_data, tmp_path / "b", "norm_transformer",
                                               "--encoder-norm", "powernorm"), check=False)
    assert bad.returncode == 2 and "powernorm" in bad.stderr and "batch" in bad.stderr

    neg = run_cli("fairseq-train", *train_args(tiny_data, tmp_path / "c", "transformer_iwslt_de_en_bn",
                                               "--criterion", "label_smoothed_cross_entropy_rbn",
                                               "--rbn-var-weight", "-1"), check=False)
    assert neg.returncode != 0 and "--rbn-var-weight" in neg.stderr and "-1" in neg.stderr
    assert "Traceback" not in neg.stderr

    run_cli("fairseq-train", *train_args(tiny_data, tmp_path / "d", "norm_transformer",
                                         "--decoder-norm", "batch", updates=1))
    gen = run_cli("fairseq-generate", tiny_data, "--user-dir", USER_DIR,
                  "--path", tmp_path / "d" / "checkpoint_last.pt", "--cpu",
                  "--model-overrides", "{'bn_test_stats': 'batch'}", check=False)
    assert gen.returncode != 0 and "incremental decoding" in gen.stderr
    assert "Traceback" not in gen.stderr
