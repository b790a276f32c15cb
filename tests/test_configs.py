"""configs/*.yaml: every published row has a config, every config is complete, and
fairseq-train accepts its arguments (parsed in-process; model and criterion built and
run on a tiny corpus with shrunk dimensions). Bad configs fail with one clear line."""
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, TINY_MODEL

import recipes
from recipes import ConfigError, load_config

CONFIGS = sorted((REPO / "configs").glob("*.yaml"))
DEMO_CONFIGS = sorted((REPO / "configs" / "demo").glob("*.yaml"))
ALL = CONFIGS + DEMO_CONFIGS


def _id(path):
    return str(path.relative_to(REPO / "configs"))


# every translation row of SPEC §4: (dataset, setting, norm) -> published BLEU
PUBLISHED = {
    ("IWSLT14 De-En", "Post-Norm", "BN"): 34.0,
    ("IWSLT14 De-En", "Post-Norm", "RBN"): 35.5,
    ("IWSLT14 De-En", "Post-Norm", "BN, test-time batch stats"): 34.8,
    ("IWSLT14 De-En", "Pre-Norm", "BN"): 34.8,
    ("IWSLT14 De-En", "Pre-Norm", "BN, test-time batch stats"): 27.2,
    ("WMT16 En-De", "Post-Norm", "LN"): 27.3,
    ("WMT16 En-De", "Post-Norm", "BN"): 25.0,
    ("WMT16 En-De", "Post-Norm", "RBN"): 26.5,
    ("IWSLT14 De-En", "Pre-Norm", "LN", "xu"): 35.5,
    ("IWSLT14 De-En", "Pre-Norm", "LN-simple"): 35.5,
    ("IWSLT14 De-En", "Pre-Norm", "DetachNorm"): 33.9,
    ("IWSLT14 De-En", "Pre-Norm", "AdaNorm"): 35.6,
    ("IWSLT14 De-En", "Pre-Norm", "no norm"): 34.0,
    ("IWSLT15 En-Vi", "Pre-Norm", "LN"): 31.2,
    ("IWSLT15 En-Vi", "Pre-Norm", "LN-simple"): 31.6,
    ("IWSLT15 En-Vi", "Pre-Norm", "AdaNorm"): 31.4,
    ("IWSLT14 De-En", "Pre-Norm", "LN", "shen"): 35.5,
    ("IWSLT14 De-En", "Pre-Norm", "PowerNorm"): 35.9,
}


def _row_key(r):
    key = (r.dataset, r.setting, r.norm)
    if key == ("IWSLT14 De-En", "Pre-Norm", "LN"):
        key += ("xu" if r.name.startswith("xu") else "shen",)
    return key


def test_every_published_row_has_exactly_one_config():
    rows = {}
    for path in CONFIGS:
        r = load_config(path)
        key = _row_key(r)
        assert key not in rows, f"{path.name} and {rows[key]} are the same row {key}"
        rows[key] = path.name
        assert key in PUBLISHED, f"{path.name}: {key} is not a published row of SPEC §4"
        assert r.published == PUBLISHED[key], path.name
    assert set(rows) == set(PUBLISHED), set(PUBLISHED) - set(rows)


@pytest.mark.parametrize("path", ALL, ids=_id)
def test_config_is_complete(path):
    r = load_config(path)
    assert r.name == path.stem or path.parent.name == "demo"
    assert r.notes and all(n.strip() for n in r.notes)
    assert r.paper and r.metric
    for key in ("arch", "optimizer", "lr", "lr-scheduler", "criterion", "label-smoothing",
                "max-tokens", "dropout", "seed", "share-all-embeddings", "clip-norm",
                "weight-decay", "adam-betas"):
        assert key in r.train, f"{path.name}: train.{key} missing"
    assert "max-epoch" in r.train or "max-update" in r.train
    if r.published is not None:
        assert "BLEU" in r.metric
    if "rbn" in r.train["arch"]:
        assert r.train["criterion"] == "label_smoothed_cross_entropy_rbn"
        assert "rbn-mean-weight" in r.train and "rbn-var-weight" in r.train


def _prepare_dest(script):
    text = (REPO / "scripts" / script).read_text()
    return "data/data-bin/" + re.search(r"^PL_DEST_NAME=(\S+)", text, re.M).group(1)


DATA_OF = {
    "IWSLT14 De-En": ("prepare-iwslt14.sh", "de", "en", "sentencepiece"),
    "WMT16 En-De": ("prepare-wmt16.sh", "en", "de", "subword_nmt"),
    "IWSLT15 En-Vi": ("prepare-iwslt15-envi.sh", "en", "vi", "sentencepiece"),
}


@pytest.mark.parametrize("path", CONFIGS, ids=_id)
def test_data_path_is_what_the_prepare_script_writes(path):
    r = load_config(path)
    script, src, tgt, bpe = DATA_OF[r.dataset]
    assert r.data == _prepare_dest(script)
    assert (r.source_lang, r.target_lang) == (src, tgt)
    assert r.evaluate["remove_bpe"] == bpe


@pytest.mark.parametrize("path", CONFIGS, ids=_id)
def test_spec_recipe_values(path):
    """SPEC §4 recipes, value by value."""
    r = load_config(path)
    t, ev = r.train, r.evaluate
    pre = r.setting == "Pre-Norm"
    arch = t["arch"]
    assert arch.endswith("_prenorm") == pre
    assert t["share-all-embeddings"] is True
    assert t["optimizer"] == "adam" and t["adam-betas"] == "(0.9, 0.98)"
    assert t["clip-norm"] == 0 and t["label-smoothing"] == 0.1
    assert t["max-tokens"] == 4096 and t["lr-scheduler"] == "inverse_sqrt"
    assert "fp16" not in t  # fp32
    if r.dataset.startswith("IWSLT"):
        assert arch.startswith("transformer_iwslt_de_en_")
        assert (t["dropout"], t["attention-dropout"], t["activation-dropout"]) == (0.3, 0.1, 0.1)
        assert t["weight-decay"] == 0.0001 and t["warmup-updates"] == 8000
        assert t["max-epoch"] == 60 and t.get("update-freq", 1) == 1
        if pre:
            assert t["lr"] == 0.0015 and t["warmup-init-lr"] == 1e-7 and t["stop-min-lr"] == 1e-9
        else:
            assert t["lr"] == 0.0005
        assert ev["average_last_epochs"] == 6 and t["keep-last-epochs"] >= 6
        assert (ev["beam"], ev["lenpen"], ev["max_len_a"], ev["max_len_b"]) == (5, 1, 1, 50)
        assert ev["compound_split"] is False
    else:
        assert arch.startswith("transformer_wmt_en_de_")
        assert ev["compound_split"] is True
    if "rbn" in arch:
        weights = (t["rbn-mean-weight"], t["rbn-var-weight"])
        assert weights == ((0.1, 0.01) if pre else (60, 0))
    if "teststats" in r.name:
        assert ev["model_overrides"] == {"bn_test_stats": "batch"}
        assert r.shares_training_with
    else:
        assert not ev["model_overrides"]


def test_shared_trainings_are_identical_trainings():
    by_name = {load_config(p).name: load_config(p) for p in CONFIGS}
    shared = [r for r in by_name.values() if r.shares_training_with]
    assert len(shared) == 3
    for r in shared:
        base = by_name[r.shares_training_with]
        assert base.shares_training_with is None
        assert r.train == base.train, r.name
        assert (r.data, r.source_lang, r.target_lang) == (base.data, base.source_lang,
                                                          base.target_lang)


# --------------------------------------------------------------------------- fairseq dry run

def _parse(argv):
    from fairseq import options

    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, argv)


SHAPES = {  # arch prefix -> (embed, ffn, heads, layers)
    "transformer_iwslt_de_en_": (512, 1024, 4, 6),
    "transformer_wmt_en_de_": (512, 2048, 8, 6),
}


@pytest.mark.parametrize("path", ALL, ids=_id)
def test_full_size_arguments_parse(path, tiny_data, tmp_path):
    r = load_config(path)
    argv = recipes.train_argv(r, save_dir=tmp_path, data=tiny_data, gpu=False, exe=False)
    assert argv[0] == str(tiny_data) and "--cpu" in argv
    assert argv[argv.index("--user-dir") + 1] == str(recipes.PLUGIN_DIR)
    args = _parse(argv)
    assert args.arch == r.train["arch"] and args.user_dir == str(recipes.PLUGIN_DIR)
    assert args.encoder_normalize_before == (r.setting == "Pre-Norm")
    assert args.decoder_normalize_before == (r.setting == "Pre-Norm")
    assert args.share_all_embeddings and args.cpu
    assert math.isclose(args.lr[0], float(r.train["lr"]))
    assert args.criterion == r.train["criterion"]
    if path in CONFIGS:
        prefix = next(p for p in SHAPES if r.train["arch"].startswith(p))
        embed, ffn, heads, layers = SHAPES[prefix]
        assert (args.encoder_embed_dim, args.encoder_ffn_embed_dim,
                args.encoder_attention_heads, args.encoder_layers) == (embed, ffn, heads, layers)
        assert (args.decoder_embed_dim, args.decoder_layers) == (embed, layers)
    else:  # the demo's small model
        assert (args.encoder_embed_dim, args.encoder_layers) == (64, 2)


@pytest.mark.parametrize("path", ALL, ids=_id)
def test_dry_run_builds_and_runs_model_and_criterion(path, tiny_data, tmp_path):
    """fairseq-train's own set-up, in-process, on the tiny corpus with shrunk dimensions."""
    from fairseq import tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    r = load_config(path)
    extra = [*TINY_MODEL, "--source-lang", "src", "--target-lang", "tgt"]
    args = _parse(recipes.train_argv(r, save_dir=tmp_path, extra=extra, data=tiny_data,
                                     gpu=False, exe=False))
    assert args.encoder_embed_dim == 16  # the extra arguments won
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    task.load_dataset("valid")
    itr = task.get_batch_iterator(dataset=task.dataset("valid"), max_tokens=400,
                                  seed=1).next_epoch_itr(shuffle=False)
    sample = next(iter(itr))
    torch.manual_seed(0)
    model.train()
    loss, sample_size, logs = criterion(model, sample)
    loss.backward()
    assert torch.isfinite(loss) and sample_size > 0
    if r.train["criterion"].endswith("_rbn"):
        assert "rbn_penalty" in logs
    overrides = r.evaluate["model_overrides"]
    if overrides:  # the evaluation's --model-overrides build and run too
        for key, value in overrides.items():
            setattr(args, key, value)
        cfg = convert_namespace_to_omegaconf(args)
        model = task.build_model(cfg.model)
        model.eval()
        with torch.no_grad():
            loss, _, _ = criterion(model, sample)
        assert torch.isfinite(loss)


# --------------------------------------------------------------------------- argv details

def test_extra_arguments_replace_config_flags():
    r = load_config(REPO / "configs" / "wang2022-iwslt14-deen-post-rbn.yaml")
    argv = recipes.train_argv(r, save_dir="/tmp/x", gpu=False, exe=False,
                              extra=["--lr", "1e-3", "--max-epoch=2", "--rbn-mean-weight", "0",
                                     "--save-dir", "/tmp/y", "--new-flag"])
    assert argv.count("--lr") == 1 and argv[argv.index("--lr") + 1] == "1e-3"
    assert argv.count("--max-epoch") == 1 and argv[argv.index("--max-epoch") + 1] == "2"
    assert argv[argv.index("--rbn-mean-weight") + 1] == "0"
    assert argv.count("--save-dir") == 1 and argv[argv.index("--save-dir") + 1] == "/tmp/y"
    assert "--new-flag" in argv and "--cpu" in argv
    assert "--cpu" not in recipes.train_argv(r, gpu=True, exe=False)
    assert argv[0].endswith("iwslt14.tokenized.de-en") and Path(argv[0]).is_absolute()
    with pytest.raises(ConfigError, match="does not follow a --flag"):
        recipes.train_argv(r, extra=["data-bin/x"], exe=False)


def test_generate_argv_and_scoring_helpers():
    r = load_config(REPO / "configs" / "wang2022-iwslt14-deen-pre-bn-teststats.yaml")
    argv = recipes.generate_argv(r, "avg.pt", gpu=False)
    assert argv[argv.index("--model-overrides") + 1] == "{'bn_test_stats': 'batch'}"
    for flag, value in (("--beam", "5"), ("--lenpen", "1.0"), ("--max-len-a", "1"),
                        ("--max-len-b", "50"), ("--remove-bpe", "sentencepiece"),
                        ("--scoring", "bleu"), ("--gen-subset", "test"), ("--batch-size", "64")):
        assert argv[argv.index(flag) + 1] == value, flag
    assert "--cpu" in argv
    # fairseq's compound_split_bleu.sh: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'
    assert recipes.compound_split("a well-known x-ray - b") == \
        "a well ##AT##-##AT## known x ##AT##-##AT## ray - b"
    assert recipes.compound_split("a-b-c") == "a ##AT##-##AT## b-c"
    score, detail = recipes.tokenized_bleu(["the cat sat on the mat"], ["the cat sat on the mat"])
    assert score == pytest.approx(100.0) and detail.startswith("BLEU4 = 100.00")
    low, _ = recipes.tokenized_bleu(["The Cat sat on the mat"], ["the cat sat on the mat"],
                                    lowercase=True)
    assert low == pytest.approx(100.0)
    s, sig = recipes.detokenized_sacrebleu(["the cat sat on the mat ."],
                                           ["the cat sat on the mat ."], "en")
    assert s == pytest.approx(100.0) and sig.startswith("nrefs:1|")


def test_parse_generate_output():
    text = ("S-1\ta b\nT-1\tx y\nH-1\t-0.5\tx y\nD-1\t-0.5\tx y\nS-0\tc\nT-0\tz\nH-0\t-0.1\tz\n"
            "Generate test with beam=5: BLEU4 = 12.34, 50.0/40.0/30.0/20.0 (BP=1.000)\n")
    hyps, refs, bleu = recipes.parse_generate(text)
    assert hyps == ["z", "x y"] and refs == ["z", "x y"] and bleu == 12.34


# --------------------------------------------------------------------------- bad configs

GOOD = (REPO / "configs" / "demo" / "bn.yaml").read_text()


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("name: demo-bn\n", ""),
     r"missing key 'name' \(valid keys: name, dataset, .*\)"),
    (lambda t: t + "colour: blue\n", r"unknown key 'colour' \(valid keys: name, "),
    (lambda t: t.replace("published: null", "published: high"),
     r"key 'published' must be a integer or number or null, got str 'high'"),
    (lambda t: t.replace("  arch: transformer_iwslt_de_en_bn\n", ""), r"train: missing key 'arch'"),
    (lambda t: t.replace("  seed: 1\n", "  save-dir: /tmp/x\n"),
     r"train: 'save-dir' may not be set here"),
    (lambda t: t.replace("  seed: 1\n", "  --seed: 1\n"), r"train: '--seed' is not a fairseq-train flag"),
    (lambda t: t.replace("  beam: 5\n", ""), r"evaluate: missing key 'beam' \(valid keys: "),
    (lambda t: t.replace("  beam: 5\n", "  beams: 5\n"), r"evaluate: unknown key 'beams'"),
    (lambda t: t.replace("  beam: 5\n", "  beam: 0\n"), r"evaluate: 'beam' must be >= 1"),
    (lambda t: t.replace("notes:\n", "notes: [\n"), r"not valid YAML"),
    (lambda t: "- a\n- b\n", r"must be a YAML mapping"),
])
def test_bad_config_gives_one_clear_line(tmp_path, edit, message):
    bad = tmp_path / "bad.yaml"
    bad.write_text(edit(GOOD))
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    text = str(err.value)
    assert "\n" not in text and text.startswith(str(bad)), text
    assert re.search(message, text), text


def test_bad_config_on_the_command_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("  lenpen: 1.0\n", ""))
    for script in ("train.sh", "evaluate.sh", "reproduce.sh"):
        proc = subprocess.run(["bash", str(REPO / "scripts" / script), str(bad)],
                              capture_output=True, text=True, timeout=120,
                              env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable,
                                   "PYTHONWARNINGS": "ignore"})
        assert proc.returncode == 2, (script, proc.stdout, proc.stderr)
        errors = [line for line in proc.stderr.splitlines() if "error" in line]
        assert errors == [f"normplug: error: {bad}: evaluate: missing key 'lenpen' "
                          f"(valid keys: {', '.join(recipes.EVALUATE_KEYS)})"], proc.stderr
    missing = subprocess.run(["bash", str(REPO / "scripts" / "train.sh"), str(tmp_path / "no.yaml")],
                             capture_output=True, text=True, timeout=120,
                             env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable})
    assert missing.returncode == 2 and "no.yaml: config file not found" in missing.stderr
