"""scripts/recipes.py, the driver, below the end-to-end runs of tests/test_reproduce.py:
command lines (extra arguments, the device, --gpus), the config format's errors and
fairseq's own for its flags (one line each), scoring, data made with another BPE, and the
official WMT references."""
import json
import re
import subprocess
import sys

import pytest
import yaml

from conftest import REPO

import recipes
from recipes import ConfigError, load_config

GOOD = (REPO / "configs" / "demo" / "bn.yaml").read_text()
XU = REPO / "configs" / "xu2019-iwslt14-deen-pre-ln.yaml"  # update-freq 2
WMT = REPO / "configs" / "wang2022-wmt16-ende-post-ln.yaml"
LM = REPO / "configs" / "wang2022-ptb-post-ln.yaml"


def value(argv, flag):
    assert argv.count(flag) == 1, (flag, argv)
    return argv[argv.index(flag) + 1]


def parse(argv):
    """fairseq-train's own reading of a command line (without the executable)."""
    from fairseq import options

    return options.parse_args_and_arch(options.get_training_parser(), argv)


# --------------------------------------------------------------------------- command lines

def test_extra_arguments_replace_config_flags():
    r = load_config(REPO / "configs" / "wang2022-iwslt14-deen-post-rbn.yaml")
    argv = recipes.train_argv(r, save_dir="/tmp/x", gpu=False, exe=False,
                              extra=["--lr", "1e-3", "--max-epoch=2", "--rbn-mean-weight", "0",
                                     "--save-dir", "/tmp/y", "--new-flag"])
    assert value(argv, "--lr") == "1e-3" and value(argv, "--max-epoch") == "2"
    assert value(argv, "--rbn-mean-weight") == "0" and value(argv, "--save-dir") == "/tmp/y"
    assert "--new-flag" in argv and "--cpu" in argv
    assert argv[0].endswith("iwslt14.tokenized.de-en") and argv[0].startswith(str(REPO))
    with pytest.raises(ConfigError, match="does not follow a --flag"):
        recipes.train_argv(r, extra=["data-bin/x"], exe=False)


def test_one_gpu_is_pinned_the_cpu_stays_as_it_was():
    """fairseq 0.12 takes every visible GPU unless told: the recipes pin one."""
    r = load_config(XU)
    gpu = recipes.train_argv(r, gpu=True, exe=False)
    assert value(gpu, "--distributed-world-size") == "1" and "--cpu" not in gpu
    assert value(gpu, "--update-freq") == "2"
    cpu = recipes.train_argv(r, gpu=False, exe=False)
    assert "--cpu" in cpu and "--distributed-world-size" not in cpu


def test_gpus_keep_the_effective_batch(tiny_data):
    r = load_config(XU)
    args = parse(recipes.train_argv(r, data=tiny_data, gpu=True, exe=False, gpus=2))
    assert args.distributed_world_size == 2 and args.update_freq == [1]  # 2 GPUs x 1 = 1 x 2
    assert not args.bn_sync_stats and not args.cpu
    args = parse(recipes.train_argv(r, data=tiny_data, gpu=True, exe=False, gpus=2, bn_sync_stats=True))
    assert args.bn_sync_stats
    # an update-freq given on the command line is the one divided
    argv = recipes.train_argv(r, gpu=True, exe=False, gpus=4, extra=["--update-freq", "8"])
    assert value(argv, "--update-freq") == "2" and value(argv, "--distributed-world-size") == "4"


@pytest.mark.parametrize("path, kwargs, message", [
    (XU, dict(gpus=4), "--gpus 4 does not divide the recipe's update-freq 2"),
    (REPO / "configs" / "wang2022-iwslt14-deen-post-bn.yaml", dict(gpus=2),
     "--gpus 2 does not divide the recipe's update-freq 1"),
    (XU, dict(gpus=0), "--gpus must be 1 or more, got 0"),
    (XU, dict(bn_sync_stats=True), "--bn-sync-stats syncs BN statistics across GPUs: it needs --gpus N"),
    (XU, dict(gpus=2, gpu=False), "--gpus 2 needs CUDA GPUs; this run is on the CPU"),
    (XU, dict(gpus=2, extra=["--cpu"]), "--gpus 2 needs CUDA GPUs; this run is on the CPU"),
    (XU, dict(extra=["--distributed-world-size", "2"]), "use the driver's --gpus N"),
])
def test_bad_device_choices_give_one_line(path, kwargs, message):
    kwargs.setdefault("gpu", True)
    with pytest.raises(ConfigError) as err:
        recipes.train_argv(load_config(path), exe=False, **kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_reproduce_keeps_its_runs_in_out(tmp_path):
    with pytest.raises(ConfigError, match="reproduce trains each config into --out/<name>: --save-dir"):
        recipes.reproduce([XU], tmp_path / "out", extra=["--save-dir", str(tmp_path / "elsewhere")])
    assert not (tmp_path / "out").exists()


def test_generate_argv():
    r = load_config(REPO / "configs" / "wang2022-iwslt14-deen-pre-bn-teststats.yaml")
    argv = recipes.generate_argv(r, "avg.pt", gpu=False)
    assert value(argv, "--model-overrides") == "{'bn_test_stats': 'batch'}"
    for flag, expected in (("--beam", "5"), ("--lenpen", "1.0"), ("--max-len-a", "1"), ("--max-len-b", "50"),
                           ("--remove-bpe", "@@ "), ("--gen-subset", "test"), ("--batch-size", "64")):
        assert value(argv, flag) == expected, flag
    assert "--cpu" in argv
    # Xu et al. and Shen et al. decode with fairseq's default maximum length
    argv = recipes.generate_argv(load_config(XU), "checkpoint_best.pt", gpu=True)
    assert value(argv, "--max-len-a") == "0" and value(argv, "--max-len-b") == "200" and "--cpu" not in argv


# --------------------------------------------------------------------------- scoring

def test_parse_generate_output():
    text = ("S-1\ta b\nT-1\tx y\nH-1\t-0.5\tx y\nD-1\t-0.5\tx y\nS-0\tc\nT-0\tz\nH-0\t-0.1\n"
            "Generate test with beam=5: BLEU4 = 12.34, 50.0/40.0/30.0/20.0 (BP=1.000)\n")
    assert recipes.parse_generate(text) == (["", "x y"], ["z", "x y"])
    with pytest.raises(RuntimeError, match="no hypothesis for 1 sentence"):
        recipes.parse_generate("T-0\tz\nT-1\ty\nH-1\t-0.1\ty\n")


def test_tokenized_bleu_is_multi_bleu():
    """fairseq's scorer on the tokens as they are (the papers' BLEU) equals sacreBLEU's with
    no tokenization and no smoothing, an independent implementation of the same formula."""
    from sacrebleu.metrics import BLEU

    refs = ["the cat sat on the mat .", "a well-known x-ray of the lungs", "he said : no , thanks"]
    hyps = ["the cat sat on a mat .", "a well-known x-ray of lungs", "he said no thanks !"]
    score, detail = recipes.tokenized_bleu(hyps, refs)
    oracle = BLEU(tokenize="none", smooth_method="none").corpus_score(hyps, [refs]).score
    assert score == pytest.approx(oracle, abs=0.01) and 0 < score < 100
    assert detail.startswith(f"BLEU4 = {score:.2f}")
    upper = recipes.tokenized_bleu([h.upper() for h in hyps], refs, lowercase=True)[0]
    assert upper == pytest.approx(score)
    # compound splitting gives credit for the halves of a hyphenated word (WMT)
    split = recipes.tokenized_bleu(hyps, refs, split=True)[0]
    oracle = BLEU(tokenize="none", smooth_method="none").corpus_score(
        [recipes.compound_split(h) for h in hyps], [[recipes.compound_split(r) for r in refs]]).score
    assert split == pytest.approx(oracle, abs=0.01) and split != pytest.approx(score)
    # fairseq's compound_split_bleu.sh: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'
    assert recipes.compound_split("a well-known x-ray - b") == "a well ##AT##-##AT## known x ##AT##-##AT## ray - b"
    assert recipes.compound_split("a-b-c") == "a ##AT##-##AT## b-c"


def test_sacrebleu_of_detokenized_text():
    assert recipes.detokenize(["the cat sat on the mat ."], "en") == ["the cat sat on the mat."]
    s, sig = recipes.sacrebleu_score(["The cat sat on the mat."], ["the cat sat on the mat."], lowercase=True)
    assert s == pytest.approx(100.0) and sig.startswith("nrefs:1|case:lc|")


def test_a_task_without_recipes_is_refused(tmp_path):
    """The fairseq task picks the config's keys and its evaluation: translation or language_modeling."""
    path = tmp_path / "s2t.yaml"
    path.write_text(GOOD.replace("  seed: 1\n", "  seed: 1\n  task: speech_to_text\n"))
    with pytest.raises(ConfigError, match=r"train: task 'speech_to_text' has no recipes here "
                                          r"\(known: translation, language_modeling\)"):
        load_config(path)


# --------------------------------------------------------------------------- language models

def test_language_model_command_lines():
    """fairseq-train gets no languages; fairseq-eval-lm scores windows of the training length:
    without overlap or extra context (the published figure), and fairseq's sliding window."""
    r = load_config(LM)
    assert r.task == "language_modeling" and r.source_lang is None
    train = recipes.train_argv(r, gpu=False, exe=False)
    assert "--source-lang" not in train and value(train, "--task") == "language_modeling"
    length = str(r.train["tokens-per-sample"])
    for context in (0, r.evaluate["context_window"]):
        argv = recipes.eval_lm_argv(r, "best.pt", context, gpu=False)
        assert value(argv, "--tokens-per-sample") == length and value(argv, "--context-window") == str(context)
        assert value(argv, "--sample-break-mode") == "none" and value(argv, "--path") == "best.pt"
        assert value(argv, "--gen-subset") == "test" and "--cpu" in argv
        assert value(argv, "--batch-size") == str(r.evaluate["batch_size"])
    assert "--cpu" not in recipes.eval_lm_argv(r, "best.pt", 0, gpu=True)


EVAL_LM_LOG = """\
2026-12-05 03:25:36 | INFO | fairseq_cli.eval_lm | num. model params: 9,824
2026-12-05 03:25:36 | INFO | fairseq_cli.eval_lm | data-bin/ptb test 2,577 examples
2026-12-05 03:25:37 | INFO | fairseq_cli.eval_lm | Evaluated 82,430 tokens in 3.1s (26590.32 tokens/s)
2026-12-05 03:25:37 | INFO | fairseq_cli.eval_lm | Loss (base 2): 5.7234, Perplexity: 52.84
"""


def test_parse_eval_lm_output():
    assert recipes.parse_eval_lm(EVAL_LM_LOG) == (82430, 5.7234)
    for broken in (EVAL_LM_LOG.replace("Loss (base 2)", "Loss"), EVAL_LM_LOG.replace("Evaluated", "Scored"),
                   EVAL_LM_LOG + EVAL_LM_LOG):
        with pytest.raises(RuntimeError, match="no single 'Evaluated N tokens' and 'Loss \\(base 2\\)' line"):
            recipes.parse_eval_lm(broken)


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("data: ", "source_lang: en\ndata: "), r"unknown key 'source_lang' \(valid keys: name, "),
    (lambda t: t.replace("  gen_subset: test\n", "  gen_subset: test\n  beam: 5\n"),
     r"evaluate: unknown key 'beam' \(valid keys: checkpoint, average_last_epochs, average_last_updates, "
     r"gen_subset, batch_size, context_window\)"),
    (lambda t: re.sub(r"  context_window: \d+", "  context_window: 32", t),
     r"evaluate: 'context_window' must be in 1 \.\. 31 \(the training length 32 minus at least one scored "
     r"token\), got 32"),
    (lambda t: re.sub(r"  context_window: \d+", "  context_window: 0", t), r"'context_window' must be in 1 \.\. 31"),
    (lambda t: re.sub(r"  context_window: \d+.*\n", "", t), r"evaluate: missing key 'context_window'"),
    (lambda t: re.sub(r"  tokens-per-sample: \d+\n", "", t),
     r"train: 'tokens-per-sample' must be set to the training length \(an integer >= 2; evaluation uses "
     r"windows of that length\), got None"),
])
def test_bad_language_model_config_gives_one_clear_line(tmp_path, edit, message):
    bad = tmp_path / "bad.yaml"
    bad.write_text(edit(yaml.safe_dump(recipes.merged_mapping(LM), sort_keys=False)))  # the base merged in
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    text = str(err.value)
    assert "\n" not in text and text.startswith(str(bad)), text
    assert re.search(message, text), text


# --------------------------------------------------------------------------- bad configs

@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("name: demo-bn\n", ""), r"missing key 'name' \(valid keys: name, dataset, .*\)"),
    (lambda t: t + "colour: blue\n", r"unknown key 'colour' \(valid keys: name, "),
    (lambda t: t.replace("name: demo-bn", "name: demo/bn"), r"key 'name' must be a folder name"),
    (lambda t: t.replace("published: null", "published: high"),
     r"key 'published' must be a integer or number or null, got str 'high'"),
    (lambda t: t.replace("  seed: 1\n", "  save-dir: /tmp/x\n"), r"train: 'save-dir' may not be set here"),
    (lambda t: t.replace("  seed: 1\n", "  distributed_world_size: 4\n"),
     r"train: 'distributed_world_size' may not be set here: the driver's --gpus N sets it"),
    (lambda t: t.replace("  seed: 1\n", "  seed: {a: 1}\n"), r"train: 'seed' must be a value or a list"),
    (lambda t: t.replace("  beam: 5\n", ""), r"evaluate: missing key 'beam' \(valid keys: "),
    (lambda t: t.replace("  beam: 5\n", "  beams: 5\n"), r"evaluate: unknown key 'beams'"),
    (lambda t: t.replace("  beam: 5\n", "  beam: 0\n"), r"evaluate: 'beam' must be >= 1"),
    (lambda t: t.replace("  lowercase: false ", "  lowercase: 1 "), r"evaluate: key 'lowercase' must be a true/false"),
    (lambda t: t.replace("  average_last_epochs: 1 ", "  checkpoint: best\n  average_last_epochs: 1 "),
     r"evaluate: set exactly one of .* got 'checkpoint' and 'average_last_epochs'"),
    (lambda t: t.replace("  average_last_epochs: 1 ", "  # average_last_epochs: 1 "),
     r"evaluate: set exactly one of 'checkpoint', 'average_last_epochs', 'average_last_updates' "
     r"\(which checkpoint is evaluated\), got none"),
    (lambda t: t.replace("  average_last_epochs: 1 ", "  checkpoint: newest "),
     r"evaluate: 'checkpoint' must be one of best, last, got 'newest'"),
    (lambda t: t.replace("  average_last_epochs: 1 ", "  average_last_updates: 0 "),
     r"evaluate: 'average_last_updates' must be >= 1, got 0"),
    (lambda t: t.replace("  detok_lang: en\n", "  detok_lang: en\n  sacrebleu_test_set: wmt99\n"),
     r"sacrebleu_test_set 'wmt99' is not a sacrebleu test set"),
    (lambda t: t.replace("train:\n", "train: [\n"), r"not valid YAML"),
    (lambda t: t + "name: demo-ln\n", r"duplicate key 'name' \(line \d+\)"),
    (lambda t: "base: missing.yaml\n" + t, r"base file .*missing\.yaml not found"),
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


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("  seed: 1\n", "  colour: blue\n"), "unrecognized arguments: --colour blue"),
    (lambda t: t.replace("  seed: 1\n", "  --seed: 1\n"), "unrecognized arguments: ----seed 1"),
    (lambda t: t.replace("  lr: 0.0015\n", "  lr: fast\n"), "argument --lr: invalid"),
    (lambda t: t.replace("  arch: transformer_iwslt_de_en_bn\n", "  arch: transformer_iwslt_de_en_xx\n"),
     "argument --arch/-a: invalid choice: 'transformer_iwslt_de_en_xx'"),
])
def test_fairseq_checks_the_train_flags(tmp_path, edit, message):
    """The flags are fairseq's: its parser says what is wrong, in one line naming the config."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(edit(GOOD))
    recipe = load_config(bad)  # the format is fine
    with pytest.raises(ConfigError) as err:
        recipes.check_flags(recipe, recipes.train_argv(recipe, gpu=False, exe=False))
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"{bad}: fairseq-train refuses its arguments: "), text
    assert message in text, text
    recipes.check_flags(recipe, recipes.train_argv(load_config(REPO / "configs" / "demo" / "bn.yaml"),
                                                   gpu=False, exe=False))


def _script(script, *args, home=None):
    return subprocess.run(["bash", str(REPO / "scripts" / script), *map(str, args)],
                          capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "PYTHONWARNINGS": "ignore",
                               **({"HOME": str(home)} if home else {})})


def test_bad_config_on_the_command_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("  lenpen: 1.0\n", ""))
    for script in ("train.sh", "evaluate.sh", "reproduce.sh"):
        proc = _script(script, bad)
        assert proc.returncode == 2, (script, proc.stdout, proc.stderr)
        assert proc.stderr.splitlines() == [f"normplug: error: {bad}: evaluate: missing key 'lenpen' "
                                            f"(valid keys: {', '.join(recipes.TRANSLATION_EVALUATE_KEYS)})"], proc.stderr
    missing = _script("train.sh", tmp_path / "no.yaml")
    assert missing.returncode == 2 and "no.yaml: config file not found" in missing.stderr


@pytest.mark.slow
def test_bad_flag_on_the_command_line_writes_nothing(tmp_path):
    """A typo in a fairseq-train flag: one line, before a save dir or run record exists."""
    save = tmp_path / "run"
    proc = _script("train.sh", REPO / "configs" / "demo" / "bn.yaml", "--save-dir", save, "--max-epochs", "3")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [f"normplug: error: {REPO / 'configs' / 'demo' / 'bn.yaml'}: "
                                        "fairseq-train refuses its arguments: unrecognized arguments: "
                                        "--max-epochs 3"]
    assert not save.exists()


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
        {"dataset": "iwslt15.en-vi", "bpe": "none", "bpe_size": None,
         "remove_bpe": None, "sizes": {"train": 3, "valid": 1, "test": 1}}))
    with pytest.raises(ConfigError) as err:
        recipes.check_data(load_config(config))
    text = str(err.value)
    assert "\n" not in text and 'remove_bpe is "@@ ", but the data needs null' in text
    recipes.check_data(load_config(_config_on(tmp_path, data, remove_bpe="null")))
    # on the command line: one error line, before any decoding
    proc = _script("evaluate.sh", config, "--checkpoint-dir", tmp_path / "none", home=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"normplug: error: {text}"]


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
    iwslt = recipes.score(load_config(XU), ["the house ."], ["the house ."])
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
