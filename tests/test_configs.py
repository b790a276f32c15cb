"""configs/*.yaml: every published row has a config, its provenance file names the released
script it follows and the table of its figure (no test restates a config's values), run files
hold only what differs from their base, and fairseq-train accepts its
arguments (parsed in-process; model and criterion built and run on a tiny corpus with
shrunk dimensions: the translation corpus, or the language-model one). The driver's own
behaviour is tested in tests/test_recipes.py."""
import functools
import math
from dataclasses import replace
import re

import pytest
import torch
import yaml

from conftest import REPO, TINY_MODEL

from normplug import recipes
from normplug.recipes import load_config

CONFIGS = sorted((REPO / "configs").glob("*.yaml"))
DEMO_CONFIGS = sorted((REPO / "configs" / "demo").glob("*.yaml"))
TEXT_CONFIGS = sorted((REPO / "configs" / "text").glob("*.yaml"))  # a prepare-text.sh corpus
ALL = CONFIGS + DEMO_CONFIGS + TEXT_CONFIGS


def _id(path):
    return str(path.relative_to(REPO / "configs"))


@functools.lru_cache(maxsize=None)
def _recipe(path):
    """A config, read once per session (reading one takes ~30 ms; the tests only read it)."""
    return load_config(path)


# every published row: (paper, dataset, setting, norm) -> BLEU or perplexity. Xu et al.'s are in
# the authors' poster (lancopku/AdaNorm adanorm_poster.pdf, Tables 1-3): En-Vi LN-simple is 31.6.
# Shen et al. (arXiv 2003.07845v1): translation Table I; language models Table II, test
# perplexity of Tensor-Transformer_1core + LN / BN / PN (Table III's 51.6 is a validation figure).
PUBLISHED = {
    ("wang2022", "IWSLT14 De-En", "Post-Norm", "BN"): 34.0,
    ("wang2022", "IWSLT14 De-En", "Post-Norm", "RBN"): 35.5,
    ("wang2022", "IWSLT14 De-En", "Post-Norm", "BN, test-time batch stats"): 34.8,
    ("wang2022", "IWSLT14 De-En", "Pre-Norm", "BN"): 34.8,
    ("wang2022", "IWSLT14 De-En", "Pre-Norm", "BN, test-time batch stats"): 27.2,
    ("wang2022", "WMT16 En-De", "Post-Norm", "LN"): 27.3,
    ("wang2022", "WMT16 En-De", "Post-Norm", "BN"): 25.0,
    ("wang2022", "WMT16 En-De", "Post-Norm", "RBN"): 26.5,
    ("wang2022", "PTB", "Post-Norm", "LN"): 53.2,
    ("wang2022", "PTB", "Post-Norm", "BN"): 45.9,
    ("wang2022", "PTB", "Post-Norm", "RBN"): 44.6,
    ("wang2022", "WikiText-103", "Post-Norm", "BN"): 17.2,
    ("wang2022", "WikiText-103", "Post-Norm", "RBN"): 17.1,
    ("xu2019", "IWSLT14 De-En", "Pre-Norm", "LN"): 35.5,
    ("xu2019", "IWSLT14 De-En", "Pre-Norm", "LN-simple"): 35.5,
    ("xu2019", "IWSLT14 De-En", "Pre-Norm", "DetachNorm"): 33.9,
    ("xu2019", "IWSLT14 De-En", "Pre-Norm", "AdaNorm"): 35.6,
    ("xu2019", "IWSLT14 De-En", "Pre-Norm", "no norm"): 34.0,
    ("xu2019", "IWSLT15 En-Vi", "Pre-Norm", "LN"): 31.2,
    ("xu2019", "IWSLT15 En-Vi", "Pre-Norm", "LN-simple"): 31.6,
    ("xu2019", "IWSLT15 En-Vi", "Pre-Norm", "AdaNorm"): 31.4,
    ("shen2020", "IWSLT14 De-En", "Pre-Norm", "LN"): 35.5,
    ("shen2020", "IWSLT14 De-En", "Pre-Norm", "BN"): 34.4,
    ("shen2020", "IWSLT14 De-En", "Pre-Norm", "PowerNorm"): 35.9,
    ("shen2020", "WMT14 En-De", "Pre-Norm", "LN"): 29.5,
    ("shen2020", "WMT14 En-De", "Pre-Norm", "PowerNorm"): 30.1,
    ("shen2020", "PTB", "Post-Norm", "LN"): 53.2,
    ("shen2020", "PTB", "Post-Norm", "BN"): 60.7,
    ("shen2020", "PTB", "Post-Norm", "PowerNorm"): 47.6,
    ("shen2020", "WikiText-103", "Post-Norm", "LN"): 20.9,
    ("shen2020", "WikiText-103", "Post-Norm", "BN"): 27.2,
    ("shen2020", "WikiText-103", "Post-Norm", "PowerNorm"): 17.9,
}


def _row_key(r):
    return (r.name.split("-")[0], r.dataset, r.setting, r.norm)


def test_every_published_row_has_exactly_one_config():
    rows = {}
    for path in CONFIGS:
        r = _recipe(path)
        if r.published is None:  # a released run without a published figure (its provenance says why)
            continue
        key = _row_key(r)
        assert key not in rows, f"{path.name} and {rows[key]} are the same row {key}"
        rows[key] = path.name
        assert key in PUBLISHED, f"{path.name}: {key} is not a published row"
        assert r.published == PUBLISHED[key], path.name
    assert set(rows) == set(PUBLISHED), set(PUBLISHED) - set(rows)


# the fairseq-train flags every config of a task sets: the recipe written out, not left to defaults
REQUIRED_TRAIN = {
    "translation": ("arch", "optimizer", "lr", "lr-scheduler", "criterion", "label-smoothing", "max-tokens",
                    "dropout", "seed", "share-all-embeddings", "clip-norm", "weight-decay", "adam-betas"),
    "language_modeling": ("arch", "optimizer", "lr", "lr-scheduler", "criterion", "tokens-per-sample",
                          "batch-size", "sample-break-mode", "dropout", "seed", "clip-norm", "weight-decay",
                          "adam-betas"),
}
RBN_CRITERIA = {"label_smoothed_cross_entropy_rbn", "cross_entropy_rbn", "adaptive_loss_rbn"}


@pytest.mark.parametrize("path", ALL, ids=_id)
def test_config_is_complete(path):
    r = _recipe(path)
    assert r.name == path.stem or path.parent.name in ("demo", "text")
    assert r.provenance.endswith(".md") and (path.parent / r.provenance).is_file(), r.provenance
    assert r.paper and r.metric
    for key in REQUIRED_TRAIN[r.task]:
        assert key in r.train, f"{path.name}: train.{key} missing"
    assert {"max-epoch", "max-update", "patience"} & set(r.train)  # a stopping rule
    if r.published is not None:
        assert ("BLEU" if r.task == "translation" else "perplexity") in r.metric
    if "rbn" in r.train["arch"]:
        assert r.train["criterion"] in RBN_CRITERIA
        assert "rbn-mean-weight" in r.train and "rbn-var-weight" in r.train


RELEASES = {"wang2022": "wjxts/RegularizedBN@57a5394", "xu2019": "lancopku/AdaNorm@546faea",
            "shen2020": "sIncerass/powernorm@9ea6226"}
# no release holds the language-model code: the configs follow the scripts of the codebase the
# papers edited (Ma et al. 2019), one per corpus
LM_CODE = "szhangtju/The-compression-of-Transformer@c614f39"
LM_SCRIPTS = {"PTB": "BTD-Transformer/run_ptb.sh", "WikiText-103": "BTD-Transformer/run_wt103.sh"}


def _paper(path):
    return path.stem.split("-")[0]


def _runs_table(md):
    """A provenance file's table of runs: config name -> (what it follows, published cell)."""
    rows = {}
    for line in md.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 3 and (REPO / "configs" / f"{cells[0]}.yaml").exists():
            assert cells[0] not in rows, f"{md.name}: {cells[0]} listed twice"
            rows[cells[0]] = cells[1:]
    return rows


@pytest.mark.parametrize("path", CONFIGS, ids=_id)
def test_provenance_names_the_release_and_the_published_figure(path):
    """Each run links its paper's provenance file, whose table of runs names the released file
    the run follows and the table its figure comes from (or says it is not published)."""
    r = _recipe(path)
    md = path.parent / r.provenance
    assert r.provenance == f"{_paper(path)}.md" and md.is_file(), r.provenance
    text = md.read_text(encoding="utf-8")
    assert RELEASES[_paper(path)] in text
    rows = _runs_table(md)
    assert r.name in rows, f"{md.name} has no row for {r.name}"
    follows, published = rows[r.name]
    assert re.search(r"[\w./-]+\.sh\b|README\.md", follows), follows
    if r.task == "language_modeling":
        assert LM_SCRIPTS[r.dataset] in follows and LM_CODE in text
    if r.published is None:
        assert published == "not published", published
    else:
        assert published.startswith(f"{r.published} ") and "table" in published.lower(), published
    assert "Differs" in text  # what still differs from the release, item by item


@pytest.mark.parametrize("paper", sorted(RELEASES))
def test_provenance_lists_exactly_the_papers_configs(paper):
    assert set(_runs_table(REPO / "configs" / f"{paper}.md")) == {
        p.stem for p in CONFIGS if _paper(p) == paper}


def test_run_files_hold_only_what_differs_from_their_base():
    """A value every run of a base shares lives in the base; every base is used."""
    from normplug.recipes.config import read_merged

    used = {}
    for path in CONFIGS + TEXT_CONFIGS:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        base = (path.parent / raw["base"]).resolve()
        assert base.parent == (REPO / "configs" / "base").resolve(), raw["base"]
        used.setdefault(base, []).append(raw)
    assert set(used) == {p.resolve() for p in (REPO / "configs" / "base").glob("*.yaml")}
    for base, runs in used.items():
        merged = read_merged(base)
        for section in ("train", "evaluate"):
            for key in set.intersection(*(set(run.get(section) or {}) for run in runs)):
                values = [run[section][key] for run in runs]
                assert len(runs) == 1 or not all(v == values[0] and type(v) is type(values[0]) for v in values), \
                    f"{base.name}: every run sets {section}.{key}: {values[0]!r}; it belongs in the base"
            for run in runs:
                for key, value in (run.get(section) or {}).items():
                    assert (merged.get(section) or {}).get(key, KeyError) != value, \
                        f"{run['name']}: {section}.{key} repeats {base.name}'s value {value!r}"


def test_configs_are_values_and_their_sources_are_in_the_repository():
    """Configs hold values (one-line comments at most); nothing cites a file outside the
    repository's sources or says what was not read."""
    yamls = sorted((REPO / "configs").glob("**/*.yaml"))
    assert sum(p.stat().st_size for p in yamls) <= 100_000
    for md in (REPO / "configs").glob("**/*.md"):
        assert len(md.read_text(encoding="utf-8").splitlines()) <= 400, md.name
    for path in yamls + sorted((REPO / "configs").glob("**/*.md")):
        text = path.read_text(encoding="utf-8")
        assert "SPEC" not in text and "notes:" not in text, path.name
        assert not re.search(r"could not be (read|verified)|not (read|verifiable) here", text), path.name


def _prepare_default(script):
    """What scripts/prepare-NAME.sh makes by default (scripts/prepare.py's DATASETS)."""
    from prepare import DATASETS

    return DATASETS[script.removeprefix("prepare-").removesuffix(".sh")]


DATA_OF = {
    "IWSLT14 De-En": ("prepare-iwslt14.sh", "de", "en"),
    "WMT16 En-De": ("prepare-wmt16.sh", "en", "de"),
    "IWSLT15 En-Vi": ("prepare-iwslt15-envi.sh", "en", "vi"),
    "WMT14 En-De": ("prepare-wmt14.sh", "en", "de"),
    "PTB": ("prepare-ptb.sh", None, None),
    "WikiText-103": ("prepare-wikitext103.sh", None, None),
}


@pytest.mark.parametrize("path", CONFIGS, ids=_id)
def test_data_is_what_the_prepare_script_makes_by_default(path):
    """Path, languages, the BPE to remove and the casing of scripts/prepare-*.sh's defaults; a
    language model's words as prepared, with no BPE to remove."""
    from steps import BPE, REMOVE_BPE

    r = _recipe(path)
    script, src, tgt = DATA_OF[r.dataset]
    made = _prepare_default(script)
    assert r.data == "data/data-bin/" + made.dest
    assert (r.source_lang, r.target_lang) == (src, tgt)
    if r.task == "language_modeling":
        assert made.bpe_size is None  # word level: perplexity per word
        return
    assert r.evaluate["remove_bpe"] == REMOVE_BPE[BPE]
    assert r.evaluate["lowercase"] == made.lowercased


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
    if ev.get("checkpoint") == "best":  # fairseq writes checkpoint_best.pt when it saves after a validation
        assert not t.get("disable-validation") and not t.get("no-save")
        if "validate-interval-updates" in t:
            assert t.get("save-interval-updates") == t["validate-interval-updates"]


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
    args = _parse(recipes.train_argv(replace(r, data=tiny_data), save_dir=tmp_path, gpu=False, exe=False))
    assert args.user_dir == str(recipes.PLUGIN_DIR) and args.cpu
    assert args.arch in ARCH_MODEL_REGISTRY and args.criterion in CRITERION_REGISTRY
    # the row's setting is the model's: Pre-Norm normalises each sublayer's input
    assert args.decoder_normalize_before == (r.setting == "Pre-Norm")
    if r.task == "translation":
        assert args.encoder_normalize_before == (r.setting == "Pre-Norm")
    for key, value in r.train.items():
        parsed = getattr(args, key.replace("-", "_"))
        if isinstance(parsed, list) and len(parsed) == 1:
            parsed = parsed[0]  # --lr, --update-freq
        if isinstance(value, bool) or isinstance(value, str):
            assert parsed == value, key
        else:
            assert math.isclose(float(parsed), float(value)), key


# Each task's tiny corpus and the arguments that shrink a config's model to run on it in a
# second: the translation corpus (source and target sides), and the language-model one, whose
# 40-type dictionary takes adaptive-softmax bands at 10 and 20 types.
TINY_EXTRA = {
    "translation": [*TINY_MODEL, "--source-lang", "src", "--target-lang", "tgt"],
    "language_modeling": ["--decoder-layers", "1", "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "32",
                          "--decoder-attention-heads", "2"],
}
TINY_ADAPTIVE = ["--adaptive-softmax-cutoff", "10,20", "--adaptive-input-cutoff", "10,20"]  # WikiText-103's


def _tiny_argv(r, data, save_dir="unused"):
    extra = TINY_EXTRA[r.task] + (TINY_ADAPTIVE if r.dataset == "WikiText-103" else [])
    return recipes.train_argv(recipes.with_training_arguments(replace(r, data=data), extra), save_dir=save_dir,
                              gpu=False, exe=False)


@pytest.fixture(scope="module")
def tiny_tasks(tiny_data, lm_data):
    """Each task on its tiny corpus and one of its batches (padding on both sides for
    translation; windows of the PTB configs' length for language models, which every LM
    config's positions hold); every config of a task reads the same files."""
    from fairseq import tasks

    out = {}
    for name, data in (("translation", tiny_data), ("language_modeling", lm_data)):
        r = next(_recipe(p) for p in ALL if _recipe(p).task == name)
        task = tasks.setup_task(_parse(_tiny_argv(r, data)))
        task.load_dataset("valid")
        itr = task.get_batch_iterator(dataset=task.dataset("valid"), max_tokens=400,
                                      seed=1).next_epoch_itr(shuffle=False)
        out[name] = (task, next(iter(itr)), data)
    return out


# the norm a published row is about (the model may use LayerNorm elsewhere)
ROW_NORM = {"LN": "layer", "LN-simple": "layer_simple", "DetachNorm": "detach", "AdaNorm": "adanorm",
            "no norm": "identity", "BN": "batch", "RBN": "batch", "PowerNorm": "power"}


def _row_norm(r):
    """The norm a row is about: 'RBN, mean penalty only' -> 'RBN', 'AdaNorm (C = 2)' -> 'AdaNorm'."""
    return re.split(r"[,(]", r.norm)[0].strip()


@pytest.mark.parametrize("path", ALL, ids=_id)
def test_dry_run_builds_and_runs_model_and_criterion(path, tiny_tasks, tmp_path):
    """The config's model and criterion, built by fairseq from its parsed command line (tiny
    dimensions), take a training step: finite loss and gradients. The model holds its row's
    norm; published rows whose model has batch statistics log every such layer's TID; RBN rows
    add a penalty, the others none; the model as evaluated (with the evaluation's
    --model-overrides) runs, with test-batch statistics exactly in the rows about them."""
    r = _recipe(path)
    task, sample, data = tiny_tasks[r.task]
    args = _parse(_tiny_argv(r, data, save_dir=tmp_path))
    assert args.decoder_embed_dim == 16  # the extra arguments won
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
    if "rbn_penalty" in logs or _row_norm(r) == "RBN":
        assert (logs["rbn_penalty"] > 0) == (_row_norm(r) == "RBN")
    assert ROW_NORM[_row_norm(r)] in {m.norm_name for m in model.modules() if hasattr(m, "norm_name")}
    overrides = r.evaluate.get("model_overrides") or {}
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
def test_fairseq_train_configuration_of_every_config(tiny_data, lm_data, tmp_path):
    """fairseq-train turns the parsed arguments into its hydra configuration before it builds
    anything: every config's command survives that step and builds its model and criterion."""
    from fairseq import tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    for path in ALL:
        r = _recipe(path)
        args = _parse(_tiny_argv(r, tiny_data if r.task == "translation" else lm_data, save_dir=tmp_path))
        cfg = convert_namespace_to_omegaconf(args)
        task = tasks.setup_task(cfg.task)
        assert task.build_model(cfg.model) is not None and task.build_criterion(cfg.criterion) is not None


@pytest.mark.slow
def test_the_driver_s_check_passes_every_config_at_full_size(tiny_data, lm_data, tmp_path):
    """`normplug-recipe check` builds each config's task, full-size model and criterion as fairseq-train would
    (on the meta device): none is refused, on the tiny corpora (their languages, and adaptive-softmax bands
    that fit their dictionary)."""
    for path in ALL:
        r = _recipe(path)
        extra = TINY_EXTRA[r.task][-4:] if r.task == "translation" else []  # --source-lang src --target-lang tgt
        extra += TINY_ADAPTIVE if r.dataset == "WikiText-103" else []
        data = tiny_data if r.task == "translation" else lm_data
        r = recipes.with_training_arguments(replace(r, data=data), extra)
        recipes.check_flags(r, recipes.train_argv(r, save_dir=tmp_path, gpu=False, exe=False))
