"""normplug.recipes, the driver, below the end-to-end runs of tests/test_reproduce.py:
command lines (extra arguments, the device), the config format (base: merging,
duplicate keys) and its errors and fairseq's own for its flags (one line each), scoring, data
made with another BPE, runs and scores tied to their data, and the official WMT references.
The configs are written here (the recipes' own are tested by tests/test_configs.py)."""
import ast
import dataclasses
import csv
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from conftest import REPO

from normplug import recipes
from normplug.recipes import ConfigError, Launch, load_config

GOOD = """\
name: demo-bn
dataset: synthetic (scripts/synthetic.py, seed 1)
setting: Post-Norm
norm: BN
paper: "none: toy task"
published: null
metric: "sacreBLEU on the synthetic test set (500 pairs)"
provenance: demo.md
data: demo-out/data-bin/synthetic
source_lang: src
target_lang: tgt
train:
  arch: transformer_iwslt_de_en_bn
  encoder-layers: 2
  decoder-layers: 2
  encoder-embed-dim: 64
  decoder-embed-dim: 64
  share-all-embeddings: true
  optimizer: adam
  adam-betas: "(0.9, 0.98)"
  lr: 0.0015
  lr-scheduler: inverse_sqrt
  warmup-updates: 400
  warmup-init-lr: 1.0e-07
  dropout: 0.1
  criterion: label_smoothed_cross_entropy
  label-smoothing: 0.1
  max-tokens: 2048
  max-epoch: 5
  seed: 1
evaluate:
  average_last_epochs: 1    # the final checkpoint
  gen_subset: test
  beam: 5
  lenpen: 1.0
  max_len_a: 1
  max_len_b: 50
  batch_size: 128
  remove_bpe: null          # whole words
  lowercase: false          # lowercase already
  compound_split: false
  detok_lang: en
"""
IWSLT = "data: data/data-bin/iwslt14.tokenized.de-en\nsource_lang: de\ntarget_lang: en\n"


def variant(*replacements, text=GOOD):
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new)
    return text


TEXTS = {
    "demo": GOOD,
    # IWSLT14 as Xu et al.: update-freq 2, lowercased, fairseq's default maximum length
    "xu": variant(("data: demo-out/data-bin/synthetic\nsource_lang: src\ntarget_lang: tgt\n", IWSLT),
                  ("  arch: transformer_iwslt_de_en_bn\n", "  arch: transformer_iwslt_de_en_ln_prenorm\n"
                                                          "  update-freq: 2\n"),
                  ("  max_len_a: 1\n  max_len_b: 50\n", "  max_len_a: 0\n  max_len_b: 200\n"),
                  ("  remove_bpe: null ", '  remove_bpe: "@@ " '), ("  lowercase: false ", "  lowercase: true ")),
    "post-bn": variant(("  arch: transformer_iwslt_de_en_bn\n", "  arch: transformer_iwslt_de_en_bn\n  update-freq: 1\n")),
    # Wang et al.'s test-batch statistics at test time
    "teststats": variant(("data: demo-out/data-bin/synthetic\nsource_lang: src\ntarget_lang: tgt\n", IWSLT),
                         ("  batch_size: 128\n", "  batch_size: 64\n  model_overrides: {bn_test_stats: batch}\n"),
                         ("  remove_bpe: null ", '  remove_bpe: "@@ " ')),
    # WMT: compound splitting, sacreBLEU on the official references
    "wmt": variant(("source_lang: src\ntarget_lang: tgt\n", "source_lang: en\ntarget_lang: de\n"),
                   ("  compound_split: false\n  detok_lang: en\n",
                    "  compound_split: true\n  detok_lang: de\n  sacrebleu_test_set: wmt14/full\n")),
    "lm": """\
name: wang2022-ptb-post-ln
dataset: PTB
setting: Post-Norm
norm: "LN"
paper: "Wang, Wu, Huang 2022"
published: 53.2
metric: "test perplexity"
provenance: wang2022.md
data: data/data-bin/ptb
train:
  task: language_modeling
  arch: transformer_lm_ptb_ln
  dropout: 0.3
  sample-break-mode: none
  tokens-per-sample: 32
  batch-size: 120
  optimizer: adam
  lr: 0.00025
  lr-scheduler: cosine
  max-update: 20000
  criterion: cross_entropy
  seed: 1111
evaluate:
  checkpoint: best
  gen_subset: test
  batch_size: 10
  context_window: 16
""",
}


@pytest.fixture
def config(tmp_path):
    """``config(name)``: the path of TEXTS[name] written into tmp_path."""
    def write(name, text=None):
        path = tmp_path / f"{name}.yaml"
        path.write_text(TEXTS[name] if text is None else text)
        return path
    return write


def value(argv, flag):
    assert argv.count(flag) == 1, (flag, argv)
    return argv[argv.index(flag) + 1]


def on(recipe, data):
    """A recipe read with --data DATA."""
    return dataclasses.replace(recipe, data=str(data))


def trained(recipe, extra, data=None):
    """A recipe with fairseq-train's extra arguments (and --data), as the driver merges them."""
    return recipes.with_training_arguments(dataclasses.replace(recipe, data=str(data)) if data else recipe, extra)


def parse(argv):
    """fairseq-train's own reading of a command line (without the executable)."""
    from fairseq import options

    return options.parse_args_and_arch(options.get_training_parser(), argv)


# --------------------------------------------------------------------------- command lines

def test_extra_arguments_replace_config_flags(config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a config's data path is relative to the current directory
    r = load_config(config("xu"))
    argv = recipes.train_argv(trained(r, ["--lr", "1e-3", "--max-epoch=2", "--rbn-mean-weight", "0", "--new-flag"]),
                              save_dir="/tmp/x", gpu=False, exe=False)
    assert value(argv, "--lr") == "1e-3" and value(argv, "--max-epoch") == "2"
    assert value(argv, "--rbn-mean-weight") == "0" and value(argv, "--save-dir") == "/tmp/x"
    assert "--new-flag" in argv and "--cpu" in argv
    assert argv[0] == str(tmp_path / "data" / "data-bin" / "iwslt14.tokenized.de-en")
    with pytest.raises(ConfigError, match="does not follow a --flag"):
        trained(r, ["data-bin/x"])


def test_one_gpu_is_pinned_the_cpu_stays_as_it_was(tiny_data, config):
    """fairseq 0.12 takes every visible GPU unless told: the recipes pin one; more are fairseq's own
    flags among the extra arguments."""
    r = load_config(config("xu"))
    gpu = recipes.train_argv(r, "x", gpu=True, exe=False)
    assert value(gpu, "--distributed-world-size") == "1" and "--cpu" not in gpu
    assert value(gpu, "--update-freq") == "2"
    cpu = recipes.train_argv(r, "x", gpu=False, exe=False)
    assert "--cpu" in cpu and "--distributed-world-size" not in cpu
    assert "--distributed-world-size" not in recipes.train_argv(trained(r, ["--cpu"]), "x", gpu=True, exe=False)
    args = parse(recipes.train_argv(trained(r, ["--distributed-world-size", "2", "--update-freq", "1"], tiny_data),
                                    "x", gpu=True, exe=False))
    assert (args.distributed_world_size, args.update_freq, args.cpu) == (2, [1], False)


def test_gpus_keep_the_effective_batch(tiny_data, config, capsys):
    """--gpus N spreads a run over N GPUs with update-freq / N (the effective batch kept), BN statistics
    per GPU unless the plugin's --bn-sync-stats is passed; the table says how the row ran."""
    r = load_config(config("xu"))  # update-freq 2
    args = parse(recipes.train_argv(trained(r, Launch(2).batch_flags(r), tiny_data), "x", gpu=True, exe=False))
    assert (args.distributed_world_size, args.update_freq, args.bn_sync_stats) == (2, [1], None)
    assert Launch().batch_flags(r) == []
    with pytest.raises(ConfigError, match="--gpus 3 = 3 processes divide neither the update-freq 2 of"):
        Launch(3).batch_flags(r)
    with pytest.raises(SystemExit):
        recipes.main(["train", str(config("xu")), "--dry-run", "--gpus", "0"])
    assert "--gpus: must be a whole number over 0, got '0'" in capsys.readouterr().err
    assert recipes.main(["train", str(config("xu")), "--dry-run", "--gpus", "2", "--bn-sync-stats"]) == 0
    train = shlex.split(capsys.readouterr().out, comments=True)
    assert (value(train, "--distributed-world-size"), value(train, "--update-freq")) == ("2", "1")
    assert "--bn-sync-stats" in train
    for sync, said in (([], "2 GPUs, BN statistics per GPU"), (["--bn-sync-stats"], "2 GPUs, BN statistics synced")):
        extra = Launch(2).batch_flags(r) + sync
        run = {"rc": 0, "flags": recipes.merged_flags(trained(r, extra)), "extra": extra}
        assert said in recipes.row_status(r, run, {})
    assert recipes.row_status(r, {"rc": 0, "flags": recipes.merged_flags(r), "extra": []}, {}) == "full"


def test_reproduce_keeps_its_runs_in_out(tmp_path, config):
    with pytest.raises(ConfigError, match=r"--save-dir after --: the run goes to --out OUT \(OUT/<name>\)"):
        recipes.reproduce([config("xu")], tmp_path / "out", extra=["--save-dir", str(tmp_path / "elsewhere")])
    assert not (tmp_path / "out").exists()


def test_generate_argv(config):
    r = load_config(config("teststats"))
    argv = recipes.generate_argv(r, "avg.pt", gpu=False)
    assert value(argv, "--model-overrides") == '{"bn_test_stats": "batch"}'  # fairseq: ast.literal_eval
    assert recipes.python_dict({"a": "it's \"x\"", "b": 0.5, "c": True, "d": None}) == \
        '{"a": "it\'s \\"x\\"", "b": 0.5, "c": True, "d": None}'
    assert ast.literal_eval(recipes.python_dict({"a": "it's \"x\"\n", "b": [1]})) == {"a": "it's \"x\"\n", "b": [1]}
    for flag, expected in (("--beam", "5"), ("--lenpen", "1.0"), ("--max-len-a", "1"), ("--max-len-b", "50"),
                           ("--remove-bpe", "@@ "), ("--gen-subset", "test"), ("--batch-size", "64")):
        assert value(argv, flag) == expected, flag
    assert "--cpu" in argv
    # Xu et al. and Shen et al. decode with fairseq's default maximum length
    argv = recipes.generate_argv(load_config(config("xu")), "checkpoint_best.pt", gpu=True)
    assert value(argv, "--max-len-a") == "0" and value(argv, "--max-len-b") == "200" and "--cpu" not in argv


def test_dry_run_prints_the_commands_and_writes_nothing(tmp_path, monkeypatch, capsys, config):
    """--dry-run prints what train, evaluate and reproduce would run, as plain command lines: a shared
    training once; averaging, then fairseq-generate or fairseq-eval-lm twice. No data is needed."""
    monkeypatch.chdir(tmp_path)
    shared = tmp_path / "shared.yaml"
    shared.write_text(GOOD.replace("name: demo-bn\n", "name: demo-bn-teststats\nshares_training_with: demo-bn\n"))
    out = tmp_path / "out"
    assert recipes.main(["reproduce", str(config("demo")), str(shared), str(config("lm")), "--out", str(out),
                         "--dry-run", "--", "--max-epoch", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == [
        "#", "#", "fairseq-train", "normplug-average", "fairseq-generate", "#", "normplug-average", "fairseq-generate",
        "#", "fairseq-train", "fairseq-eval-lm", "fairseq-eval-lm"]
    assert lines[0] == recipes.dry_run_note(Launch())
    train = shlex.split(lines[2])
    assert train[1:] == recipes.train_argv(trained(load_config(config("demo")), ["--max-epoch", "2"]), out / "demo-bn",
                                           gpu=True, exe=False)
    assert shlex.split(lines[3]) == ["normplug-average", "--inputs", str(out / "demo-bn"), "--num-epoch-checkpoints",
                                     "1", "--output", str(out / "demo-bn" / "averaged_last1.pt")]
    assert value(shlex.split(lines[4]), "--path") == str(out / "demo-bn" / "averaged_last1.pt")
    assert [value(shlex.split(line), "--context-window") for line in lines[-2:]] == ["0", "16"]
    assert recipes.main(["evaluate", str(config("demo")), "--dry-run", "--checkpoint", "x.pt"]) == 0
    assert [line.split()[:1] for line in capsys.readouterr().out.splitlines()] == [["#"], ["fairseq-generate"]]
    assert recipes.main(["train", str(config("demo")), "--dry-run", "--lr", "1"]) == 0
    train = shlex.split(capsys.readouterr().out, comments=True)
    assert train[0] == "fairseq-train" and value(train, "--lr") == "1"
    assert value(train, "--save-dir") == str(tmp_path / "runs" / "demo-bn")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.yaml", "lm.yaml", "shared.yaml"]


@pytest.mark.parametrize("gpus", [1, 4])
def test_dry_run_prints_the_gpu_run_as_a_person_types_it(config, capsys, gpus):
    """Whatever machine prints them (this one has no GPU), the dry run's lines are the GPU run's: no --cpu,
    --distributed-world-size N; one comment line says so; JSON overrides in single quotes, no '"'"'."""
    teststats = config("teststats", variant(("  arch: transformer_iwslt_de_en_bn\n",
                                             "  arch: transformer_iwslt_de_en_bn\n  update-freq: 4\n"),
                                            text=TEXTS["teststats"]))
    assert recipes.main(["reproduce", str(teststats), "--dry-run", f"--gpus={gpus}"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == f"# the command lines as the driver runs them on {gpus} GPU{'s' * (gpus > 1)} " \
                       f"(--distributed-world-size {gpus}); on a machine without a GPU it adds --cpu"
    commands = [shlex.split(line) for line in lines if not line.startswith("#")]
    assert len(commands) == len(lines) - 2 == 3 and not any("--cpu" in argv for argv in commands)
    assert "'\"'\"'" not in out
    for line in (line for line in lines if line.startswith("fairseq-train")):
        assert value(shlex.split(line), "--distributed-world-size") == str(gpus)
    assert " --model-overrides '{\"bn_test_stats\": \"batch\"}'" in out
    assert recipes.main(["evaluate", str(teststats), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "# the command lines as the driver runs them on a GPU; on a machine without a GPU it adds --cpu"
    assert "--cpu" not in shlex.split(lines[-1])
    assert lines[-1].endswith(" --model-overrides '{\"bn_test_stats\": \"batch\"}'")
    # any word with a single quote: in double quotes when nothing in it expands there
    words = ["x", "{'a': 1}", "it's $HOME", "a b"]
    assert recipes.command_line(words) == """x "{'a': 1}" 'it'"'"'s $HOME' 'a b'"""
    assert shlex.split(recipes.command_line(words)) == words


def test_the_config_s_checkpoints_are_averaged_in_process(tmp_path, config):
    """average_last_epochs: N averages the last N epoch checkpoints (normplug-average's function, in
    this process) into averaged_lastN.pt, reused while its inputs are unchanged."""
    import argparse

    import torch

    from normplug.recipes.runs import choose_checkpoint

    recipe = load_config(config("two", GOOD.replace("average_last_epochs: 1 ", "average_last_epochs: 2 ")))
    for epoch in (1, 2, 3):
        torch.save({"model": {"w": torch.full((2,), float(epoch))}, "args": argparse.Namespace(),
                    "optimizer_history": [{"num_updates": 10 * epoch}]}, tmp_path / f"checkpoint{epoch}.pt")
    said = []
    path, inputs = choose_checkpoint(recipe, tmp_path, said.append)
    assert (path, [p.name for p in inputs]) == (tmp_path / "averaged_last2.pt", ["checkpoint2.pt", "checkpoint3.pt"])
    assert torch.equal(torch.load(path)["model"]["w"], torch.full((2,), 2.5))
    assert choose_checkpoint(recipe, tmp_path, said.append)[0] == path and said[-1].startswith(f"reusing {path}")


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


def test_sacrebleu_of_detokenized_text(config):
    assert recipes.detokenize(["the cat sat on the mat ."], "en") == ["the cat sat on the mat."]
    scores = recipes.score(load_config(config("xu")), ["The cat sat on the mat ."], ["the cat sat on the mat ."])
    assert scores["sacrebleu"] == pytest.approx(100.0) and scores["sacrebleu_signature"].startswith("nrefs:1|case:lc|")


def test_a_task_without_recipes_is_refused(tmp_path):
    """The fairseq task picks the config's keys and its evaluation: translation or language_modeling."""
    path = tmp_path / "s2t.yaml"
    path.write_text(GOOD.replace("  seed: 1\n", "  seed: 1\n  task: speech_to_text\n"))
    with pytest.raises(ConfigError, match=r"train: task 'speech_to_text' has no recipes here "
                                          r"\(known: translation, language_modeling\)"):
        load_config(path)


# --------------------------------------------------------------------------- language models

def test_language_model_command_lines(config):
    """fairseq-train gets no languages; fairseq-eval-lm scores windows of the training length:
    without overlap or extra context (the published figure), and fairseq's sliding window."""
    r = load_config(config("lm"))
    assert r.task == "language_modeling" and r.source_lang is None
    train = recipes.train_argv(r, "x", gpu=False, exe=False)
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
    bad.write_text(edit(TEXTS["lm"]))
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
     r"key 'published' must be a number or null, got str 'high'$"),
    (lambda t: t.replace("  beam: 5\n", "  beam: five\n"), r"evaluate: key 'beam' must be an integer, got str 'five'$"),
    (lambda t: t.replace("  seed: 1\n", "  save-dir: /tmp/x\n"), r"train: 'save-dir' may not be set here"),
    (lambda t: t.replace("  seed: 1\n", "  distributed_world_size: 4\n"),
     r"train: 'distributed_world_size' may not be set here: the driver pins 1 GPU"),
    (lambda t: t.replace("  seed: 1\n", "  seed: {a: 1}\n"), r"train: 'seed' must be a value or a list"),
    (lambda t: t.replace("  beam: 5\n", ""), r"evaluate: missing key 'beam' \(valid keys: "),
    (lambda t: t.replace("  beam: 5\n", "  beams: 5\n"), r"evaluate: unknown key 'beams'"),
    (lambda t: t.replace("  beam: 5\n", "  beam: 0\n"), r"evaluate: 'beam' must be >= 1"),
    (lambda t: t.replace("  lowercase: false ", "  lowercase: 1 "), r"evaluate: key 'lowercase' must be true or false, got int 1$"),
    (lambda t: t.replace("  average_last_epochs: 1 ", "  checkpoint: best\n  average_last_epochs: 1 "),
     r"evaluate: set exactly one of .* got 'checkpoint' and 'average_last_epochs'"),
    (lambda t: t.replace("  average_last_epochs: 1 ", "  model_overrides: null "),
     r"evaluate: set exactly one of 'checkpoint', 'average_last_epochs', 'average_last_updates' "
     r"\(which checkpoint is evaluated\), got none"),
    (lambda t: t.replace("  average_last_epochs: 1 ", "  checkpoint: newest "),
     r"evaluate: 'checkpoint' must be one of best, last, got 'newest'"),
    (lambda t: t.replace("  average_last_epochs: 1 ", "  average_last_updates: 0 "),
     r"evaluate: 'average_last_updates' must be >= 1, got 0"),
    (lambda t: t.replace("  detok_lang: en\n", "  detok_lang: en\n  sacrebleu_test_set: wmt99\n"),
     r"sacrebleu_test_set 'wmt99' is not a sacrebleu test set"),
    (lambda t: t.replace("evaluate:\n", "evaluate: [\n"), r"not valid YAML"),
    (lambda t: t.replace("provenance: demo.md\n", ""), r"missing key 'provenance' \(valid keys: "),
    (lambda t: t.replace("provenance: demo.md\n", "provenance: demo.md\nnotes: [a]\n"), r"unknown key 'notes'"),
    (lambda t: t.replace("  beam: 5\n", "  beam: 5\n  beam: 4\n"), r": duplicate key 'beam' \(line 35\)$"),
    (lambda t: t + "name: other\n", r": duplicate key 'name' \(line 43\)$"),
    (lambda t: "base: base/none.yaml\n" + t, r": base file .*/base/none\.yaml not found$"),
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
    (lambda t: t.replace("  seed: 1\n", "  bn-momentum: 1.5\n"), "argument --bn-momentum: must be in (0, 1], got 1.5"),
    # what the plugin refuses when fairseq-train builds the criterion and the model
    (lambda t: t.replace("  criterion: label_smoothed_cross_entropy\n", "  criterion: label_smoothed_cross_entropy_rbn"
                         "\n  rbn-mean-weight: -60\n"), "--rbn-mean-weight must be a finite number >= 0, got -60.0"),
    (lambda t: t.replace("  arch: transformer_iwslt_de_en_bn\n", "  arch: transformer_iwslt_de_en_ln\n").replace(
        "  criterion: label_smoothed_cross_entropy\n", "  criterion: label_smoothed_cross_entropy_rbn\n"
        "  rbn-var-weight: 0.01\n"), "--rbn-mean-weight 0 / --rbn-var-weight 0.01 need batch-norm layers"),
    (lambda t: t.replace("  arch: transformer_iwslt_de_en_bn\n", "  arch: transformer_iwslt_de_en_pn\n"
                         "  power-groups: 3\n"), "norm 'power': groups=3 does not divide dim=64"),
    # a stopping rule that trains nothing: fairseq-train would exit 0 without a checkpoint
    (lambda t: t.replace("  max-epoch: 5\n", "  max-epoch: -3\n"), "--max-epoch -3 trains nothing: give a number over "
     "0 (below 0 fairseq-train stops at once and exits 0; it reads 0 as no limit: leave the flag out for that)"),
    (lambda t: t.replace("  max-epoch: 5\n", "  max-update: 0\n"), "--max-update 0 trains nothing"),
])
def test_fairseq_checks_the_train_flags(tmp_path, tiny_data, edit, message):
    """What fairseq-train would refuse, or train nothing with, is refused before it starts, in one line naming
    the config: its parser's verdict, the plugin's checks of the model and criterion it builds, and a stopping
    rule <= 0."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(edit(GOOD))
    recipe = load_config(bad, tiny_data)  # the format is fine
    with pytest.raises(ConfigError) as err:
        recipes.check_flags(recipe, recipes.train_argv(recipe, "x", gpu=False, exe=False))
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"{bad}: fairseq-train refuses its arguments: "), text
    assert message in text, text
    good = tmp_path / "good.yaml"
    good.write_text(GOOD.replace("  max-epoch: 5\n", "  max-epoch: 5\n  max-update: 1\n"))
    recipes.check_flags(recipe, recipes.train_argv(load_config(good, tiny_data), "x", gpu=False, exe=False))


def _cli(*args):
    """``python -m normplug.recipes ARGS`` as a user runs it (normplug-recipe)."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore",
           **({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {})}
    return subprocess.run([sys.executable, "-m", "normplug.recipes", *map(str, args)],
                          capture_output=True, text=True, timeout=120, env=env)


def test_bad_config_on_the_command_line(tmp_path, capsys):
    """Every command: one line and exit status 2 (in process, as the console script runs main)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("  lenpen: 1.0\n", ""))
    for command in ("train", "evaluate", "reproduce", "table", "check"):
        assert recipes.main([command, str(bad)]) == 2, command
        assert capsys.readouterr().err.splitlines() == [
            f"normplug-recipe: error: {bad}: evaluate: missing key 'lenpen' "
            f"(valid keys: {', '.join(recipes.TRANSLATION_EVALUATE_KEYS)})"], command


def test_without_fairseq_one_line_names_the_install_command(tmp_path, monkeypatch, capsys):
    """What needs fairseq says, in one line, what failed and what installs it (tests/test_tid_tool.py has the
    cases of that command)."""
    from normplug.errors import NormplugError

    with pytest.raises(NormplugError) as err:
        recipes.fairseq_exe("fairseq-nonesuch")
    assert str(err.value).endswith("nor on PATH; fairseq is installed: put the folder of its console scripts on PATH")
    good = tmp_path / "good.yaml"
    good.write_text(GOOD)
    monkeypatch.setitem(sys.modules, "fairseq", None)  # import fairseq -> ImportError
    monkeypatch.setattr("normplug.tools.common.install_fairseq_hint", lambda: "install it: HOW")
    assert recipes.main(["check", str(good)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "normplug-recipe: error: normplug-recipe check needs fairseq, which does not import (ModuleNotFoundError: "
        "import of fairseq halted; None in sys.modules); install it: HOW"]
    assert recipes.main(["table", str(good), "--out", str(tmp_path / "out")]) == 0  # reading needs no fairseq


def test_ctrl_c_stops_the_child_and_keeps_its_last_words_in_the_log(tmp_path, terminal_sigint):
    """^C sent to the driver alone (``kill -INT``) stops its child too; what the child says then goes
    to the log, not to the terminal (tests/test_reproduce.py: ^C from a terminal, end to end)."""
    import time

    child = [sys.executable, "-c", "import time\ntry:\n    print('ready', flush=True)\n    time.sleep(60)\n"
                                   "except KeyboardInterrupt:\n    print('stopped')"]
    echoed = []

    def interrupt(line):
        echoed.append(line)
        raise KeyboardInterrupt

    t0 = time.time()
    with pytest.raises(KeyboardInterrupt):
        recipes.run_logged(child, tmp_path / "log", interrupt)
    assert time.time() - t0 < 30 and echoed == ["ready\n"]
    assert (tmp_path / "log").read_text() == "ready\nstopped\n"


@pytest.mark.slow
def test_the_module_runs_as_a_command(tmp_path):
    missing = _cli("train", tmp_path / "no.yaml")  # python -m normplug.recipes, as normplug-recipe
    assert missing.returncode == 2 and missing.stderr.splitlines() == [
        f"normplug-recipe: error: {tmp_path / 'no.yaml'}: config file not found"]


def test_check_refuses_data_the_config_cannot_use(tmp_path, tiny_data, lm_data, capsys, config):
    """`check` reads the data folder: missing, or without the dictionaries of the config's language
    pair (dict.txt for a language model) or a binarized split it trains, validates or tests on, is
    one line naming what is missing."""
    good = tmp_path / "good.yaml"
    good.write_text(GOOD)
    assert recipes.main(["check", str(good), "--data", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.splitlines() == [f"normplug-recipe: error: {good}: data folder "
                                                    f"{tmp_path / 'nowhere'} not found (prepare it, or pass --data DIR)"]
    assert recipes.main(["check", str(good), "--data", str(tiny_data)]) == 0
    assert capsys.readouterr().out == f"{good}: ok (demo-bn, transformer_iwslt_de_en_bn)\n"
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    for name, lacks in (("dict.src.txt", "dict.src.txt"), ("dict.tgt.txt", "dict.tgt.txt"),
                        ("valid.src-tgt.tgt.idx", "valid.src-tgt.tgt.idx"), ("test.src-tgt.src.bin", "test.src-tgt.src.bin")):
        (data / name).rename(data / (name + ".away"))
        assert recipes.main(["check", str(good), "--data", str(data)]) == 2
        assert capsys.readouterr().err.splitlines() == [
            f"normplug-recipe: error: {good}: data folder {data} lacks {lacks}, which the config reads (prepare "
            "its data, or pass --data DIR)"]
        (data / (name + ".away")).rename(data / name)
    # the dictionaries of another pair: the de-en config on src-tgt data
    iwslt = load_config(config("xu"))
    with pytest.raises(ConfigError, match=r"lacks dict\.de\.txt, dict\.en\.txt, train\.de-en\.de\.bin and 11 more, "):
        recipes.check_data(on(iwslt, tiny_data))
    lm = load_config(config("lm"))
    recipes.check_data(on(lm, lm_data))
    with pytest.raises(ConfigError, match=r"lacks dict\.txt, train\.bin, train\.idx and 4 more, which"):
        recipes.check_data(on(lm, tiny_data))


@pytest.mark.slow
def test_bad_flag_on_the_command_line_writes_nothing(tmp_path, tiny_data):
    """A typo in a fairseq-train flag: one line, before a save dir or run record exists."""
    save, good = tmp_path / "runs", tmp_path / "good.yaml"
    good.write_text(GOOD)
    proc = _cli("train", good, "--data", tiny_data, "--out", save, "--max-epochs", "3")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [f"normplug-recipe: error: {good}: "
                                        "fairseq-train refuses its arguments: unrecognized arguments: "
                                        "--max-epochs 3"]
    assert not save.exists()


# --------------------------------------------------------------------------- base configs

def test_a_config_merges_its_base_chain(tmp_path):
    """Mappings merge key by key (the config wins); any other value replaces the base's; the
    base's path is relative to the config's folder."""
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "paper.yaml").write_text(variant(("  seed: 1\n", "  seed: 1\n  ddp-backend: [a, b]\n")))
    (tmp_path / "base" / "dataset.yaml").write_text(
        "base: paper.yaml\ntrain:\n  lr: 0.0005\n  ddp-backend: [c]\nevaluate:\n  beam: 4\n")
    run = tmp_path / "run.yaml"
    run.write_text("base: base/dataset.yaml\nname: run-1\npublished: 35.5\ntrain:\n  max-epoch: null\n"
                   "evaluate:\n  lenpen: 0.6\n")
    r = load_config(run)
    whole = load_config(tmp_path / "base" / "paper.yaml")
    assert (r.name, r.published, r.provenance, r.source_lang) == ("run-1", 35.5, "demo.md", "src")
    assert r.train == {**whole.train, "lr": 0.0005, "ddp-backend": ["c"], "max-epoch": None}
    assert list(r.train)[:2] == ["arch", "encoder-layers"]  # the base's order, then the config's keys
    assert r.evaluate == {**whole.evaluate, "beam": 4, "lenpen": 0.6}
    assert "--max-epoch" not in recipes.train_argv(r, "x", gpu=False, exe=False)
    (tmp_path / "base" / "paper.yaml").write_text("base: dataset.yaml\n")
    with pytest.raises(ConfigError) as err:  # a loop is reported from the config given, with its chain
        load_config(run)
    base = tmp_path / "base"
    assert str(err.value) == (f"{run}: its base files form a loop: {run} -> {base / 'dataset.yaml'} -> "
                              f"{base / 'paper.yaml'} -> {base / 'dataset.yaml'}")


# --------------------------------------------------------------------------- data and references

def _config_on(tmp_path, data, remove_bpe="null"):
    path = tmp_path / f"demo-{len(list(tmp_path.glob('*.yaml')))}.yaml"
    path.write_text(GOOD.replace("data: demo-out/data-bin/synthetic", f"data: {data}")
                    .replace("  remove_bpe: null ", f"  remove_bpe: {remove_bpe} "))
    return path


def test_data_made_with_another_bpe_is_refused(tmp_path, tiny_data, capsys):
    """prepare.json (scripts/prepare-*.sh) says which --remove-bpe the data needs."""
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
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
    capsys.readouterr()
    assert recipes.main(["evaluate", str(config), "--out", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"normplug-recipe: error: {text}"]


def test_a_run_is_reused_only_on_its_data(tmp_path, tiny_data):
    """A finished run is reused when its flags, data folder and dictionaries are the same; on
    other data (another folder, or the same folder with another dictionary) train and reproduce
    refuse in one line, before anything is written: an earlier result is never overwritten."""
    config = _config_on(tmp_path, tiny_data)
    recipe = load_config(config)
    out = tmp_path / "out"
    run = out / recipe.name
    run.mkdir(parents=True)
    identity = recipes.data_identity(recipe)
    assert identity == {"data": str(tiny_data), "dictionaries": {
        name: hashlib.sha256((tiny_data / name).read_bytes()).hexdigest()[:16] for name in ("dict.src.txt", "dict.tgt.txt")}}
    record = {"flags": recipes.merged_flags(recipe), "extra": [], "rc": 0, "seconds": 1.0, **identity}
    (run / recipes.RUN_RECORD).write_text(json.dumps(record))
    (run / "checkpoint_last.pt").write_bytes(b"")
    said = []
    assert recipes.train(recipe, run, log=said.append) == 0
    assert said == [f"== demo-bn: reusing the finished run in {run}"]

    other = tmp_path / "other"
    shutil.copytree(tiny_data, other)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    for attempt in (lambda: recipes.train(on(recipe, other), run, log=said.append),
                    lambda: recipes.reproduce([config], out, data=other, log=said.append)):
        with pytest.raises(ConfigError) as err:
            attempt()
        assert str(err.value) == (f"{run} holds a run on other data ({tiny_data}: its data differs from "
                                  f"{other} now): use another folder or remove that one")
    with open(other / "dict.src.txt", "a") as f:
        f.write("extra 1\n")
    (run / recipes.RUN_RECORD).write_text(json.dumps({**record, "data": str(other)}))
    with pytest.raises(ConfigError, match="holds a run on other data"):  # same folder, another dictionary
        recipes.train(on(recipe, other), run)
    # a record of an older driver names no dictionaries: its data folder is compared
    (run / recipes.RUN_RECORD).write_text(json.dumps({k: v for k, v in record.items() if k != "dictionaries"}))
    assert recipes.train(recipe, run, log=said.append) == 0 and said[-1].endswith("reusing the finished run in " + str(run))
    with pytest.raises(ConfigError, match="holds a run on other data"):
        recipes.train(on(recipe, other), run)
    (run / recipes.RUN_RECORD).write_text(json.dumps(record))
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before and len(said) == 2


def test_a_run_without_a_checkpoint_is_never_recorded_as_done(tmp_path, tiny_data, monkeypatch, capsys):
    """fairseq-train exiting 0 without a checkpoint (it trained nothing, or saved nothing): the run record says
    failed, `train` exits 1 in one line, and `reproduce` fails the row and the rows sharing its training
    without training them again."""
    calls = tmp_path / "calls"
    fake = tmp_path / "fairseq-train"  # fairseq-train's last words on --max-epoch -3, and nothing saved
    fake.write_text(f"#!/bin/sh\necho run >> {calls}\necho 'done training in 0.0 seconds'\n")
    fake.chmod(0o755)
    monkeypatch.setattr("normplug.recipes.commands.fairseq_exe", lambda tool: str(fake))
    good, shared = tmp_path / "good.yaml", tmp_path / "shared.yaml"
    good.write_text(GOOD)
    shared.write_text(GOOD.replace("name: demo-bn\n", "name: demo-bn-teststats\nshares_training_with: demo-bn\n"))
    save = tmp_path / "runs" / "demo-bn"
    assert recipes.main(["train", str(good), "--data", str(tiny_data), "--out", str(save.parent)]) == 1
    said = "fairseq-train exited 0 without writing a checkpoint"
    assert capsys.readouterr().err.splitlines() == [
        f"normplug-recipe: error: {said} in {save}: recorded as failed (see {save / 'train.log'})"]
    record = json.loads((save / recipes.RUN_RECORD).read_text())
    assert (record["rc"], record["error"]) == (0, said)
    assert recipes.row_status(load_config(good), record, None) == f"failed: {said}"
    out = tmp_path / "out"
    assert recipes.main(["reproduce", str(good), str(shared), "--data", str(tiny_data), "--out", str(out)]) == 1
    assert calls.read_text() == "run\nrun\n"  # once by train, once by reproduce for both rows
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [row["status"] for row in rows] == [
        f"failed: {said} in {out / 'demo-bn'}: recorded as failed (see {out / 'demo-bn' / 'train.log'})"] * 2


def test_more_gpus_than_visible_is_one_line_before_anything_starts(tmp_path, tiny_data, monkeypatch, capsys):
    """--gpus N beyond the visible GPUs: one line, exit 2, no save dir, no run record, no fairseq-train."""
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setattr("normplug.recipes.runs.run_logged", lambda *args, **kwargs: pytest.fail("fairseq started"))
    good = tmp_path / "good.yaml"
    good.write_text(GOOD.replace("  max-tokens: 2048\n", "  max-tokens: 2048\n  update-freq: 2\n"))
    for command in (["train", str(good), "--out", str(tmp_path / "run")],
                    ["reproduce", str(good), "--out", str(tmp_path / "out")]):
        assert recipes.main([*command, "--data", str(tiny_data), "--gpus", "2"]) == 2
        assert capsys.readouterr().err.splitlines() == [
            "normplug-recipe: error: --gpus 2: 1 GPU visible here (CUDA_VISIBLE_DEVICES=3); --dry-run prints the "
            "2-GPU command lines on any machine"]
    # fairseq's own flag among the extra arguments: refused as fairseq-train would, but before it starts
    assert recipes.main(["train", str(good), "--data", str(tiny_data), "--out", str(tmp_path / "run"),
                         "--distributed-world-size", "2", "--update-freq", "1"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"normplug-recipe: error: {good}: fairseq-train refuses its arguments: --distributed-world-size 2: 1 GPU "
        "visible here (CUDA_VISIBLE_DEVICES=3); --dry-run prints the 2-GPU command lines on any machine"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.yaml"]


def test_only_a_run_with_checkpoints_binds_its_folder(tmp_path, tiny_data):
    """A run that failed (or was stopped) before its first checkpoint leaves nothing that blocks the
    next; once it has checkpoints, other data or other flags are refused (fairseq-train would resume
    them), and evaluate refuses, in one line, a run whose config changed since (stale)."""
    recipe = load_config(_config_on(tmp_path, tiny_data))
    run, other = tmp_path / "run", tmp_path / "other"
    shutil.copytree(tiny_data, other)
    run.mkdir()
    record = {"flags": recipes.merged_flags(recipe), "extra": [], "rc": 1, **recipes.data_identity(on(recipe, other))}
    (run / recipes.RUN_RECORD).write_text(json.dumps(record))
    assert recipes.prior_run(recipe, run)[0] is None
    (run / "checkpoint1.pt").write_bytes(b"")
    with pytest.raises(ConfigError, match="holds a run on other data"):
        recipes.prior_run(recipe, run)
    assert recipes.prior_run(on(recipe, other), run)[0] == record
    with pytest.raises(ConfigError) as err:
        recipes.prior_run(trained(recipe, ["--lr", "0.5", "--cpu"], other), run)
    assert str(err.value) == (f"{run} holds a run with other fairseq-train flags (--lr 0.0015 -> 0.5, --cpu (unset) "
                              "-> (set)): use another folder or remove that one")
    changed = tmp_path / "changed.yaml"
    changed.write_text(GOOD.replace("  lr: 0.0015\n", "  lr: 0.001\n"))
    with pytest.raises(ConfigError) as err:
        recipes.evaluate(on(load_config(changed), other), run)
    assert str(err.value) == (f"{run} is stale: trained with other flags than {changed} gives now (--lr 0.0015 -> "
                              "0.001); train it again, or name a checkpoint to score with --checkpoint")


def test_scores_record_their_data(tmp_path, tiny_data):
    """A score names the data it was computed on: evaluate refuses to overwrite scores of other
    data, and the table calls a score on other data than the run's stale."""
    config = _config_on(tmp_path, tiny_data)
    recipe = load_config(config)
    out, other = tmp_path / "out", tmp_path / "other"
    shutil.copytree(tiny_data, other)
    run = out / recipe.name
    run.mkdir(parents=True)
    identity = recipes.data_identity(recipe)
    (run / recipes.RUN_RECORD).write_text(json.dumps(
        {"flags": recipes.merged_flags(recipe), "extra": [], "rc": 0, **identity}))
    scores = {"tokenized_bleu": 1.0, "averaged": ["checkpoint1.pt"], **recipes.data_identity(on(recipe, other))}
    (run / "scores-demo-bn.json").write_text(json.dumps(scores))
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(run))} holds scores-demo-bn.json, scored on other "
                                          rf"data \({re.escape(str(other))}: "):
        recipes.evaluate(recipe, run)  # before choosing (there is no checkpoint) or decoding
    assert recipes.reproduce([config], out, table_only=True, log=lambda *a: None) == 0
    assert (out / "results.md").read_text().count(f"stale: scored on other data ({other}) than the run trained on") == 1
    (run / "scores-demo-bn.json").write_text(json.dumps({**scores, **identity}))
    assert recipes.reproduce([config], out, table_only=True, log=lambda *a: None) == 0
    assert "| full |" in (out / "results.md").read_text()


def test_wmt_sacrebleu_uses_the_official_references(tmp_path, monkeypatch, config):
    import sacrebleu.utils

    official = ["Ein Haus am See.", "Der well-known Test."]
    ref_file = tmp_path / "wmt14_full.en-de.ref"
    ref_file.write_text("\n".join(official) + "\n")
    asked = []
    monkeypatch.setattr(sacrebleu.utils, "get_reference_files",
                        lambda test_set, langpair: asked.append((test_set, langpair)) or [str(ref_file)])
    assert recipes.official_references("wmt14/full", "en-de") == official
    assert asked == [("wmt14/full", "en-de")]

    r = load_config(config("wmt"))
    hyps = ["ein Haus am See .", "Der well-known Test ."]  # tokenized system output
    refs = ["ein Haus am See .", "Der well-known Test ."]  # the binarized test set's references
    scores = recipes.score(r, hyps, refs, official=official)
    assert scores["sacrebleu_references"] == "official wmt14/full en-de references (cased)"
    assert scores["sacrebleu"] < 100  # cased: 'ein' is not 'Ein'
    assert scores["tokenized_bleu"] == 100.0  # tokenized BLEU stays on the binarized references
    assert "case:mixed" in scores["sacrebleu_signature"]
    with pytest.raises(ConfigError, match="binarized test set has 1 sentences, the official "
                                           "wmt14/full en-de references 2"):
        recipes.score(r, hyps[:1], refs[:1], official=official)
    iwslt = recipes.score(load_config(config("xu")), ["the house ."], ["the house ."])
    assert iwslt["sacrebleu_references"].startswith("lowercased references of the binarized test set")


def test_wmt_references_offline_give_one_line(tmp_path, monkeypatch):
    """sacrebleu's own download path, offline: one clear error naming what to copy."""
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
    with pytest.raises(RuntimeError) as err:
        recipes.official_references("wmt14/full", "en-de")
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith("cannot fetch the official wmt14/full en-de references (<urlopen error")
    assert f"offline, copy {root / 'wmt14/full'} from a machine where `sacrebleu -t wmt14/full -l en-de " in text
