"""configs/*.yaml: every published row has a config, each follows its paper's released
scripts (value by value), its notes cite the release, and fairseq-train accepts its
arguments (parsed in-process; model and criterion built and run on a tiny corpus with
shrunk dimensions). Bad configs fail with one clear line; data made with another BPE
is refused; WMT sacreBLEU is scored against sacrebleu's official references."""
import json
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


# every published translation row: (dataset, setting, norm) -> BLEU. Xu et al.'s are in the
# authors' poster (lancopku/AdaNorm adanorm_poster.pdf, Tables 1-3): En-Vi LN-simple is 31.6
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
    ("WMT14 En-De", "Pre-Norm", "LN"): 29.5,
    ("WMT14 En-De", "Pre-Norm", "PowerNorm"): 30.1,
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
        if r.published is None:  # a released run without a figure in our sources (notes say why)
            continue
        key = _row_key(r)
        assert key not in rows, f"{path.name} and {rows[key]} are the same row {key}"
        rows[key] = path.name
        assert key in PUBLISHED, f"{path.name}: {key} is not a published row"
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
    assert {"max-epoch", "max-update", "patience"} & set(r.train)  # a stopping rule
    if r.published is not None:
        assert "BLEU" in r.metric
    if "rbn" in r.train["arch"]:
        assert r.train["criterion"] == "label_smoothed_cross_entropy_rbn"
        assert "rbn-mean-weight" in r.train and "rbn-var-weight" in r.train


RELEASES = ("wjxts/RegularizedBN@57a5394", "lancopku/AdaNorm@546faea", "sIncerass/powernorm@9ea6226")


@pytest.mark.parametrize("path", CONFIGS, ids=_id)
def test_notes_cite_the_release_and_the_published_number(path):
    r = load_config(path)
    first = r.notes[0]
    released = first.startswith("Release: ") and any(rel in first for rel in RELEASES)
    assert released or first.startswith("No script was released"), first
    assert re.search(r"\.sh|README\.md", first), "the note names the script's path"
    published = [n for n in r.notes if n.startswith("Published: ")]
    assert len(published) == 1 and published[0].startswith(
        f"Published: {r.published}" if r.published is not None else "Published: none")
    if released:  # what still differs from the script, item by item
        assert any(n.startswith("Differs") for n in r.notes)


@pytest.mark.parametrize("path", CONFIGS, ids=_id)
def test_batch_statistics_models_log_tid(path):
    """BN and PowerNorm rows train with the RBN criterion, at zero weights for the baselines,
    so every such run logs TID (tests/test_criterion.py: zero weights change nothing else)."""
    r = load_config(path)
    kind = r.train["arch"].split("_")[-2 if r.train["arch"].endswith("_prenorm") else -1]
    if kind in ("bn", "rbn", "pn"):
        assert r.train["criterion"] == "label_smoothed_cross_entropy_rbn"
        weights = (r.train["rbn-mean-weight"], r.train["rbn-var-weight"])
        assert (weights != (0, 0)) == (kind == "rbn")
    else:
        assert r.train["criterion"] == "label_smoothed_cross_entropy"


def _prepare_default(script, var):
    text = (REPO / "scripts" / script).read_text()
    return re.search(rf"^{var}=(\S+)", text, re.M).group(1)


DATA_OF = {
    "IWSLT14 De-En": ("prepare-iwslt14.sh", "de", "en"),
    "WMT16 En-De": ("prepare-wmt16.sh", "en", "de"),
    "IWSLT15 En-Vi": ("prepare-iwslt15-envi.sh", "en", "vi"),
    "WMT14 En-De": ("prepare-wmt14.sh", "en", "de"),
}


@pytest.mark.parametrize("path", CONFIGS, ids=_id)
def test_data_is_what_the_prepare_script_makes_by_default(path):
    """Path, languages, the BPE to remove and the casing of scripts/prepare-*.sh's defaults."""
    from prepare_text import REMOVE_BPE

    r = load_config(path)
    script, src, tgt = DATA_OF[r.dataset]
    assert r.data == "data/data-bin/" + _prepare_default(script, "PL_DEST_NAME")
    assert (r.source_lang, r.target_lang) == (src, tgt)
    assert r.evaluate["remove_bpe"] == REMOVE_BPE[_prepare_default(script, "PL_BPE")]
    assert r.evaluate["lowercase"] == (_prepare_default(script, "PL_LOWERCASED") == "1")


def _paper(r):
    return r.name.split("-")[0]


@pytest.mark.parametrize("path", CONFIGS, ids=_id)
def test_released_recipe_values(path):
    """Each paper's released scripts, value by value (WMT16: fairseq's scaling_nmt recipe)."""
    r = load_config(path)
    t, ev = r.train, r.evaluate
    pre = r.setting == "Pre-Norm"
    arch = t["arch"]
    assert arch.endswith("_prenorm") == pre
    assert t["share-all-embeddings"] is True and t["seed"] == 1
    assert t["optimizer"] == "adam" and t["adam-betas"] == "(0.9, 0.98)"
    assert t["clip-norm"] == 0 and t["label-smoothing"] == 0.1
    assert t["max-tokens"] == 4096 and t["lr-scheduler"] == "inverse_sqrt"
    assert "fp16" not in t  # fp32
    assert ev["compound_split"] == (r.dataset in ("WMT16 En-De", "WMT14 En-De"))
    if r.dataset == "WMT14 En-De":  # trans-scripts/train/train-wmt-big.sh, test/test-wmt.sh
        assert arch.startswith("transformer_vaswani_wmt_en_de_big_") and pre
        assert (t["dropout"], t["attention-dropout"], t["activation-dropout"]) == (0.3, 0.1, 0.1)
        assert (t["lr"], t["warmup-updates"], t["weight-decay"]) == (0.003, 8000, 0)
        assert t["patience"] == 10 and t["keep-last-epochs"] == ev["average_last_epochs"] == 10
        assert t["update-freq"] == 128  # 128 GPUs x update-freq 1
        assert (ev["beam"], ev["lenpen"], ev["max_len_a"], ev["max_len_b"]) == (4, 0.6, 0, 200)
        assert ev["sacrebleu_test_set"] == "wmt14/full"
        return
    if r.dataset == "WMT16 En-De":  # no release: scaling_nmt on the base model
        assert arch.startswith("transformer_wmt_en_de_")
        assert (ev["beam"], ev["lenpen"], ev["max_len_a"], ev["max_len_b"]) == (4, 0.6, 0, 200)
        # the last N update checkpoints, the last one written at max-update
        assert t["no-epoch-checkpoints"] is True and "max-epoch" not in t
        assert ev["average_last_updates"] == t["keep-interval-updates"]
        assert t["max-update"] % t["save-interval-updates"] == 0
        assert ev["sacrebleu_test_set"] == "wmt14/full"
        return
    assert arch.startswith("transformer_iwslt_de_en_") and ev["sacrebleu_test_set"] is None
    assert (t["dropout"], t["attention-dropout"], t["activation-dropout"]) == (0.3, 0.1, 0.1)
    assert t["weight-decay"] == 0.0001 and t["warmup-updates"] == 8000
    if pre:
        assert t["lr"] == 0.0015 and t["warmup-init-lr"] == 1e-7 and t["stop-min-lr"] == 1e-9
    else:
        assert t["lr"] == 0.0005 and t["warmup-init-lr"] == 0
    assert (ev["beam"], ev["lenpen"]) == (5, 1)
    paper = _paper(r)
    if paper == "wang2022":  # iwslt14_bash/train-iwslt14-{post,pre}-max-epoch.sh
        assert t["max-epoch"] == 60 and t["update-freq"] == 1 and t["keep-last-epochs"] == 7
        assert ev["average_last_epochs"] == 6
        assert (ev["max_len_a"], ev["max_len_b"], ev["batch_size"]) == (1, 50, 64)
        assert (t["encoder-ffn-init"], t["decoder-ffn-init"], t["attn-init"]) == \
            ("pytorch", "xavier", "fairseq")
        if "rbn" in arch:
            weights = (t["rbn-mean-weight"], t["rbn-var-weight"])
            released = (0.1, 0.01) if pre else (60, 0)
            if r.norm == "RBN":
                assert weights == released
            else:  # the ablation: one released weight, the other 0
                assert weights in ((released[0], 0), (0, released[1]))
    elif paper == "xu2019":  # machine translation/baseline-prenorm-km.sh, README.md
        assert t["update-freq"] == 2 and "max-epoch" not in t
        short = r.norm == "no norm" or r.norm.startswith("DetachNorm (") or "30k" in r.norm
        assert t["max-update"] == (30000 if short else 90000)
        assert t["no-epoch-checkpoints"] is True
        assert (t["save-interval-updates"], t["keep-interval-updates"]) == (10000, 5)
        assert ev["checkpoint"] == "best"  # no averaging
        assert (ev["max_len_a"], ev["max_len_b"], ev["batch_size"]) == (0, 200, 128)
        assert (t["attn-init"], t["encoder-ffn-init"], t["decoder-ffn-init"]) == \
            ("kaiming", "xavier", "xavier")
        # only the stacks' final norms are swapped, for every variant
        final = {"LN": "layer", "LN-simple": "layer_simple", "DetachNorm": "detach",
                 "AdaNorm": "adanorm", "no norm": "identity"}[r.norm.split(" (")[0]]
        assert arch == "transformer_iwslt_de_en_ln_prenorm"
        assert t.get("encoder-norm", "layer") == t.get("decoder-norm", "layer") == "layer"
        assert t.get("encoder-final-norm", "layer") == t.get("decoder-final-norm", "layer") == final
        if r.norm == "AdaNorm":
            assert (t["adanorm-k"], t["adanorm-scale"]) == (0.1, 1.0)  # the README's command
        if r.norm.startswith("DetachNorm"):
            assert t["detach-mode"] == {"DetachNorm": "both", "DetachNorm (mean only)": "mean",
                                        "DetachNorm (std only)": "std"}[r.norm]
        if r.norm.startswith("AdaNorm ("):  # baseline-adanorm-km.sh: C as the run's name says
            assert t["adanorm-k"] == 0.1 and f"C = {t['adanorm-scale']:g}" in r.norm
    elif paper == "shen2020":  # trans-scripts/train/train-iwslt14.sh
        assert t["patience"] == 5 and not {"max-epoch", "max-update"} & set(t)
        assert "save-interval-updates" not in t  # mid-epoch validations would count as patience
        assert t["update-freq"] == 1 and t["keep-last-epochs"] == 5
        assert ev["average_last_epochs"] == 5
        assert (ev["max_len_a"], ev["max_len_b"], ev["batch_size"]) == (0, 200, 128)
        assert (t["encoder-ffn-init"], t["decoder-ffn-init"], t["attn-init"]) == \
            ("xavier", "xavier", "fairseq")
        assert r.shares_training_with is None  # the two releases differ
        if r.norm == "PowerNorm":
            assert arch == "transformer_iwslt_de_en_pn_prenorm"
            assert (t["power-warmup"], t["power-final-warmup"], t["power-groups"]) == (8000, 1000, 4)
    else:
        raise AssertionError(f"{path.name}: unknown paper {paper}")
    if "teststats" in r.name:
        assert ev["model_overrides"] == {"bn_test_stats": "batch"}
        assert r.shares_training_with
    else:
        assert not ev["model_overrides"]


def test_shared_trainings_are_identical_trainings():
    by_name = {load_config(p).name: load_config(p) for p in CONFIGS}
    shared = [r for r in by_name.values() if r.shares_training_with]
    assert sorted(r.name for r in shared) == ["wang2022-iwslt14-deen-post-bn-teststats",
                                              "wang2022-iwslt14-deen-pre-bn-teststats"]
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
    "transformer_vaswani_wmt_en_de_big_": (1024, 4096, 16, 6),
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
    for key, value in r.train.items():  # fairseq read every flag as the config means it
        parsed = getattr(args, key.replace("-", "_"))
        if isinstance(parsed, list) and len(parsed) == 1:
            parsed = parsed[0]  # --lr, --update-freq
        if isinstance(value, bool) or isinstance(value, str):
            assert parsed == value, key
        else:
            assert math.isclose(float(parsed), float(value)), key
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
    if r.train["criterion"].endswith("_rbn"):  # every BN/PN layer's TID is logged
        assert "rbn_penalty" in logs and any(k.startswith("tid_var/") for k in logs)
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
                        ("--max-len-b", "50"), ("--remove-bpe", "@@ "),
                        ("--scoring", "bleu"), ("--gen-subset", "test"), ("--batch-size", "64")):
        assert argv[argv.index(flag) + 1] == value, flag
    assert "--cpu" in argv
    # Xu et al. and Shen et al. decode with fairseq's default maximum length
    argv = recipes.generate_argv(load_config(REPO / "configs" / "xu2019-iwslt14-deen-pre-ln.yaml"),
                                 "checkpoint_best.pt", gpu=True)
    assert argv[argv.index("--max-len-a") + 1] == "0" and argv[argv.index("--max-len-b") + 1] == "200"
    assert "--cpu" not in argv
    # fairseq's compound_split_bleu.sh: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'
    assert recipes.compound_split("a well-known x-ray - b") == \
        "a well ##AT##-##AT## known x ##AT##-##AT## ray - b"
    assert recipes.compound_split("a-b-c") == "a ##AT##-##AT## b-c"
    score, detail = recipes.tokenized_bleu(["the cat sat on the mat"], ["the cat sat on the mat"])
    assert score == pytest.approx(100.0) and detail.startswith("BLEU4 = 100.00")
    low, _ = recipes.tokenized_bleu(["The Cat sat on the mat"], ["the cat sat on the mat"],
                                    lowercase=True)
    assert low == pytest.approx(100.0)
    assert recipes.detokenize(["the cat sat on the mat ."], "en") == ["the cat sat on the mat."]
    s, sig = recipes.sacrebleu_score(["The cat sat on the mat."], ["the cat sat on the mat."],
                                     lowercase=True)
    assert s == pytest.approx(100.0) and sig.startswith("nrefs:1|case:lc|")


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
    (lambda t: t.replace("  average_last_epochs: 1 ", "  checkpoint: best\n  average_last_epochs: 1 "),
     r"evaluate: set exactly one of .* got 'checkpoint' and 'average_last_epochs'"),
    (lambda t: t.replace("  average_last_epochs: 1 ", "  gen_subset: test "),
     r"evaluate: set exactly one of 'checkpoint', 'average_last_epochs', 'average_last_updates' "
     r"\(which checkpoint is decoded\), got none"),
    (lambda t: t.replace("  average_last_epochs: 1 ", "  checkpoint: newest "),
     r"evaluate: 'checkpoint' must be one of best, last, got 'newest'"),
    (lambda t: t.replace("  average_last_epochs: 1 ", "  average_last_updates: 0 "),
     r"evaluate: 'average_last_updates' must be >= 1, got 0"),
    (lambda t: t.replace("  detok_lang: en\n", "  detok_lang: en\n  sacrebleu_test_set: wmt99\n"),
     r"sacrebleu_test_set 'wmt99' is not a sacrebleu test set"),
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


# --------------------------------------------------------------------------- data and references

def _config_on(tmp_path, data, remove_bpe="null"):
    path = tmp_path / f"demo-{len(list(tmp_path.glob('*.yaml')))}.yaml"
    path.write_text(GOOD.replace("data: demo-out/data-bin/synthetic", f"data: {data}")
                    .replace("  remove_bpe: null ", f"  remove_bpe: {remove_bpe} "))
    return path


def test_data_made_with_another_bpe_is_refused(tmp_path):
    """prepare.json (scripts/prepare-*.sh) says which --remove-bpe the data needs."""
    data = tmp_path / "data"
    data.mkdir()
    config = _config_on(tmp_path, data, remove_bpe='"@@ "')
    recipes.check_data(load_config(config))  # no prepare.json: data made otherwise, no check
    (data / "prepare.json").write_text(json.dumps(
        {"dataset": "iwslt14.de-en", "bpe": "sentencepiece", "bpe_size": 10000,
         "remove_bpe": "sentencepiece", "sizes": {"train": 3, "valid": 1, "test": 1}}))
    with pytest.raises(ConfigError) as err:
        recipes.check_data(load_config(config))
    text = str(err.value)
    assert "\n" not in text and 'remove_bpe is "@@ ", but the data needs "sentencepiece"' in text
    recipes.check_data(load_config(_config_on(tmp_path, data, remove_bpe="sentencepiece")))
    # on the command line: one error line, before any decoding
    proc = subprocess.run(["bash", str(REPO / "scripts" / "evaluate.sh"), str(config),
                           "--checkpoint-dir", str(tmp_path / "none")],
                          capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "HOME": str(tmp_path)})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"normplug: error: {text}"]


WMT = REPO / "configs" / "wang2022-wmt16-ende-post-ln.yaml"


def test_wmt_sacrebleu_uses_the_official_references(tmp_path, monkeypatch):
    import sacrebleu.utils

    official = ["Ein Haus am See.", "Der well-known Test."]
    ref_file = tmp_path / "wmt14_full.en-de.ref"
    ref_file.write_text("\n".join(official) + "\n")
    asked = []
    monkeypatch.setattr(sacrebleu.utils, "get_reference_files",
                        lambda test_set, langpair: asked.append((test_set, langpair)) or [str(ref_file)])
    assert recipes.official_references("wmt14/full", "en-de") == official
    assert asked == [("wmt14/full", "en-de")]

    r = load_config(WMT)
    hyps = ["ein Haus am See .", "Der well-known Test ."]  # tokenized system output
    refs = ["ein Haus am See .", "Der well-known Test ."]  # the binarized test set's references
    scores = recipes.score(r, hyps, refs, official=official)
    assert scores["sacrebleu_references"] == "official wmt14/full en-de references (cased)"
    assert scores["sacrebleu"] < 100  # cased: 'ein' is not 'Ein'
    assert scores["tokenized_bleu"] == 100.0  # tokenized BLEU stays on the binarized references
    assert "case:mixed" in scores["sacrebleu_signature"]
    with pytest.raises(RuntimeError, match="binarized test set has 1 sentences, the official "
                                           "wmt14/full en-de references 2"):
        recipes.score(r, hyps[:1], refs[:1], official=official)
    iwslt = recipes.score(load_config(REPO / "configs" / "xu2019-iwslt14-deen-pre-ln.yaml"),
                          ["the house ."], ["the house ."])
    assert iwslt["sacrebleu_references"].startswith("lowercased references of the binarized test set")


def test_wmt_references_offline_give_one_line_and_leave_no_lock(tmp_path, monkeypatch):
    """sacrebleu's own download path, offline: one clear error, $SACREBLEU left as it was."""
    import urllib.error
    import urllib.request

    import sacrebleu.utils
    from sacrebleu.dataset import DATASETS

    root = tmp_path / "sacrebleu"
    dataset = DATASETS["wmt14/full"]
    monkeypatch.setattr(sacrebleu.utils, "SACREBLEU_DIR", str(root))
    monkeypatch.setattr(dataset, "_outdir", str(root / "wmt14/full"))
    monkeypatch.setattr(dataset, "_rawdir", str(root / "wmt14/full/raw"))

    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -2] Name or service not known")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    root.mkdir()
    with pytest.raises(RuntimeError) as err:
        recipes.official_references("wmt14/full", "en-de")
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith("cannot fetch the official wmt14/full en-de references (<urlopen error")
    assert f"into {root / 'wmt14/full'}: offline, copy that folder" in text
    assert "sacrebleu -t wmt14/full -l en-de --echo ref" in text
    assert list(root.iterdir()) == []  # no lock file, no empty folders left behind
