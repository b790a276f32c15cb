"""configs/*.yaml: every published row has a config, its notes name the released script it
follows (no test restates a config's values), and fairseq-train accepts its
arguments (parsed in-process; model and criterion built and run on a tiny corpus with
shrunk dimensions). Bad configs fail with one clear line; data made with another BPE
is refused; WMT sacreBLEU is scored against sacrebleu's official references."""
import functools
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


@functools.lru_cache(maxsize=None)
def _recipe(path):
    """A config, read once per session (reading one takes ~30 ms; the tests only read it)."""
    return load_config(path)


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
}


def _row_key(r):
    key = (r.dataset, r.setting, r.norm)
    if key == ("IWSLT14 De-En", "Pre-Norm", "LN"):
        key += ("xu" if r.name.startswith("xu") else "shen",)
    return key


def test_every_published_row_has_exactly_one_config():
    rows = {}
    for path in CONFIGS:
        r = _recipe(path)
        key = _row_key(r)
        assert key not in rows, f"{path.name} and {rows[key]} are the same row {key}"
        rows[key] = path.name
        assert key in PUBLISHED, f"{path.name}: {key} is not a published row"
        assert r.published == PUBLISHED[key], path.name
    assert set(rows) == set(PUBLISHED), set(PUBLISHED) - set(rows)


@pytest.mark.parametrize("path", ALL, ids=_id)
def test_config_is_complete(path):
    r = _recipe(path)
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
    r = _recipe(path)
    first = r.notes[0]
    released = first.startswith("Release: ") and any(rel in first for rel in RELEASES)
    assert released or first.startswith("No script was released"), first
    assert re.search(r"\.sh|README\.md", first), "the note names the script's path"
    published = [n for n in r.notes if n.startswith("Published: ")]
    assert len(published) == 1 and published[0].startswith(f"Published: {r.published}")
    if released:  # what still differs from the script, item by item
        assert any(n.startswith("Differs") for n in r.notes)


def _prepare_default(script, var):
    text = (REPO / "scripts" / script).read_text()
    return re.search(rf"^{var}=(\S+)", text, re.M).group(1)


DATA_OF = {
    "IWSLT14 De-En": ("prepare-iwslt14.sh", "de", "en"),
    "WMT16 En-De": ("prepare-wmt16.sh", "en", "de"),
    "IWSLT15 En-Vi": ("prepare-iwslt15-envi.sh", "en", "vi"),
}


@pytest.mark.parametrize("path", CONFIGS, ids=_id)
def test_data_is_what_the_prepare_script_makes_by_default(path):
    """Path, languages, the BPE to remove and the casing of scripts/prepare-*.sh's defaults."""
    from prepare_text import REMOVE_BPE

    r = _recipe(path)
    script, src, tgt = DATA_OF[r.dataset]
    assert r.data == "data/data-bin/" + _prepare_default(script, "PL_DEST_NAME")
    assert (r.source_lang, r.target_lang) == (src, tgt)
    assert r.evaluate["remove_bpe"] == REMOVE_BPE[_prepare_default(script, "PL_BPE")]
    assert r.evaluate["lowercase"] == (_prepare_default(script, "PL_LOWERCASED") == "1")


@pytest.mark.parametrize("path", ALL, ids=_id)
def test_training_keeps_what_evaluation_decodes(path):
    """The checkpoints evaluation averages are the ones training keeps; a run stopped on
    patience validates at epoch ends only (a mid-epoch validation would count towards it)."""
    r = _recipe(path)
    t, ev = r.train, r.evaluate
    if ev.get("average_last_epochs"):
        keep = t.get("keep-last-epochs", -1)  # fairseq's default -1 keeps them all
        assert not t.get("no-epoch-checkpoints") and (keep < 0 or keep >= ev["average_last_epochs"])
    if ev.get("average_last_updates"):
        assert t["keep-interval-updates"] >= ev["average_last_updates"]
        assert t["max-update"] % t["save-interval-updates"] == 0  # the last one is the final model
    if "patience" in t:
        assert "save-interval-updates" not in t and "validate-interval-updates" not in t


def test_shared_trainings_are_identical_trainings():
    """A config that reuses another's training differs from it in evaluation only."""
    by_name = {r.name: r for r in map(_recipe, CONFIGS)}
    shared = [r for r in by_name.values() if r.shares_training_with]
    assert shared
    for r in shared:
        base = by_name[r.shares_training_with]
        assert base.shares_training_with is None
        assert r.train == base.train, r.name
        assert (r.data, r.source_lang, r.target_lang) == (base.data, base.source_lang,
                                                          base.target_lang)
        assert r.evaluate != base.evaluate, r.name


# --------------------------------------------------------------------------- fairseq dry run

def _parse(argv):
    from fairseq import options

    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, argv)


@pytest.mark.parametrize("path", ALL, ids=_id)
def test_full_size_arguments_parse(path, tiny_data, tmp_path):
    """fairseq-train's parser, with the plugin loaded, accepts the config's full command line,
    reads every flag as the config means it, and finds its architecture and criterion."""
    from fairseq.criterions import CRITERION_REGISTRY
    from fairseq.models import ARCH_MODEL_REGISTRY

    r = _recipe(path)
    args = _parse(recipes.train_argv(r, save_dir=tmp_path, data=tiny_data, gpu=False, exe=False))
    assert args.user_dir == str(recipes.PLUGIN_DIR) and args.cpu
    assert args.arch in ARCH_MODEL_REGISTRY and args.criterion in CRITERION_REGISTRY
    # the row's setting is the model's: Pre-Norm normalises each sublayer's input
    assert args.encoder_normalize_before == args.decoder_normalize_before == (r.setting == "Pre-Norm")
    for key, value in r.train.items():
        parsed = getattr(args, key.replace("-", "_"))
        if isinstance(parsed, list) and len(parsed) == 1:
            parsed = parsed[0]  # --lr, --update-freq
        if isinstance(value, bool) or isinstance(value, str):
            assert parsed == value, key
        else:
            assert math.isclose(float(parsed), float(value)), key


@pytest.fixture(scope="module")
def tiny_task(tiny_data):
    """The translation task on the tiny corpus and one of its batches (padding on both sides);
    every config's task reads the same files."""
    from fairseq import tasks

    r = _recipe(ALL[0])
    args = _parse(recipes.train_argv(r, save_dir="unused", extra=TINY_EXTRA, data=tiny_data,
                                     gpu=False, exe=False))
    task = tasks.setup_task(args)
    task.load_dataset("valid")
    itr = task.get_batch_iterator(dataset=task.dataset("valid"), max_tokens=400,
                                  seed=1).next_epoch_itr(shuffle=False)
    return task, next(iter(itr))


TINY_EXTRA = [*TINY_MODEL, "--source-lang", "src", "--target-lang", "tgt"]
# the norm a published row is about (the model may use LayerNorm elsewhere)
ROW_NORM = {"LN": "layer", "LN-simple": "layer_simple", "DetachNorm": "detach", "AdaNorm": "adanorm",
            "no norm": "identity", "BN": "batch", "RBN": "batch", "BN, test-time batch stats": "batch",
            "PowerNorm": "power"}


@pytest.mark.parametrize("path", ALL, ids=_id)
def test_dry_run_builds_and_runs_model_and_criterion(path, tiny_task, tiny_data, tmp_path):
    """The config's model and criterion, built by fairseq from its parsed command line (tiny
    dimensions), take a training step: finite loss and gradients. The model holds its row's
    norm; published rows whose model has batch statistics log every such layer's TID; RBN rows
    add a penalty, the others none; the model as evaluated (with the evaluation's
    --model-overrides) runs, with test-batch statistics exactly in the rows about them."""
    r = _recipe(path)
    args = _parse(recipes.train_argv(r, save_dir=tmp_path, extra=TINY_EXTRA, data=tiny_data,
                                     gpu=False, exe=False))
    assert args.encoder_embed_dim == 16  # the extra arguments won
    task, sample = tiny_task
    torch.manual_seed(0)
    model = task.build_model(args)
    criterion = task.build_criterion(args)
    model.train()
    loss, sample_size, logs = criterion(model, sample)
    loss.backward()
    assert torch.isfinite(loss) and sample_size > 0
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    if path in CONFIGS:  # a published row with batch statistics logs each such layer's TID
        assert {k for k in logs if k.startswith("tid_var/")} == {f"tid_var/{s}" for s in model.batch_stat_norms()}
    if "rbn_penalty" in logs or r.norm == "RBN":
        assert (logs["rbn_penalty"] > 0) == (r.norm == "RBN")
    assert ROW_NORM[r.norm] in {m.norm_name for m in model.modules() if hasattr(m, "norm_name")}
    overrides = r.evaluate["model_overrides"] or {}
    for key, value in overrides.items():
        setattr(args, key, value)
    model = task.build_model(args) if overrides else model
    model.eval()
    with torch.no_grad():
        loss, _, _ = criterion(model, sample)
    assert torch.isfinite(loss)
    assert any(getattr(m, "uses_batch_stats_in_eval", False) for m in model.modules()) == \
        ("test-time batch stats" in r.norm)


@pytest.mark.slow
def test_fairseq_train_configuration_of_every_config(tiny_data, tmp_path):
    """fairseq-train turns the parsed arguments into its hydra configuration before it builds
    anything: every config's command survives that step and builds its model and criterion."""
    from fairseq import tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    for path in ALL:
        r = _recipe(path)
        args = _parse(recipes.train_argv(r, save_dir=tmp_path, extra=TINY_EXTRA, data=tiny_data,
                                         gpu=False, exe=False))
        cfg = convert_namespace_to_omegaconf(args)
        task = tasks.setup_task(cfg.task)
        assert task.build_model(cfg.model) is not None and task.build_criterion(cfg.criterion) is not None


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
