"""normplug-recipe reproduce: end to end on the tiny corpus (two tiny configs, a handful of
updates each, one averaging epoch and one update checkpoints), a finished run reused,
and the table of every row -- run, modified, not run, failed, stale, interrupted --
with `table`; language models end to end on the tiny LM corpus, their perplexities
against an independent float64 computation, and their rows in the same table."""
import csv
import json
import math
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import REPO

from normplug import recipes
from normplug.recipes import RESULT_COLUMNS

TINY_CONFIG = """\
name: {name}
dataset: tiny (tests/conftest.py)
setting: Post-Norm
norm: {norm}
paper: "test paper {norm}"
published: {published}
metric: "tokenized BLEU on the tiny test set"
data: {data}
source_lang: src
target_lang: tgt
train:
  arch: {arch}
  encoder-layers: 1
  decoder-layers: 1
  encoder-embed-dim: 16
  decoder-embed-dim: 16
  encoder-ffn-embed-dim: 32
  decoder-ffn-embed-dim: 32
  encoder-attention-heads: 2
  decoder-attention-heads: 2
  share-all-embeddings: true
  optimizer: adam
  adam-betas: "(0.9, 0.98)"
  clip-norm: 0.0
  weight-decay: 0.0001
  lr: 0.001
  lr-scheduler: inverse_sqrt
  warmup-updates: 2
  dropout: 0.1
{criterion}  max-tokens: 400
  max-epoch: 5
  seed: 1
  num-workers: 0
  log-format: simple
  log-interval: 1
{checkpoints}evaluate:
  {choice}
  beam: 2
  lenpen: 1.0
  max_len_a: 1
  max_len_b: 5
  batch_size: 16
  remove_bpe: null
provenance: test.md
"""


def write_config(folder, name, norm, arch, published, data, rbn=False, updates=False):
    """A tiny config; ``updates``: average the last 2 update checkpoints (every 3 updates, no
    epoch checkpoints, as the WMT configs), else the last 2 epoch checkpoints."""
    criterion = ("  criterion: label_smoothed_cross_entropy_rbn\n  label-smoothing: 0.1\n"
                 "  rbn-mean-weight: 60\n  rbn-var-weight: 0\n") if rbn else \
        "  criterion: label_smoothed_cross_entropy\n  label-smoothing: 0.1\n"
    checkpoints = ("  no-epoch-checkpoints: true\n  save-interval-updates: 3\n"
                   "  keep-interval-updates: 2\n") if updates else ""
    choice = "average_last_updates: 2" if updates else "average_last_epochs: 2"
    path = folder / f"{name}.yaml"
    path.write_text(TINY_CONFIG.format(name=name, norm=norm, arch=arch, published=published,
                                       data=data, criterion=criterion, checkpoints=checkpoints,
                                       choice=choice))
    return path


TINY_LM_CONFIG = """\
name: {name}
dataset: tiny LM (tests/conftest.py)
setting: Post-Norm
norm: {norm}
paper: "test paper {norm}"
published: {published}
metric: "test perplexity on the tiny LM corpus"
data: {data}
train:
  task: language_modeling
  arch: {arch}
  decoder-layers: 1
  decoder-embed-dim: 32
  decoder-ffn-embed-dim: 64
  decoder-attention-heads: 2
  dropout: 0.0
  sample-break-mode: none
  tokens-per-sample: 8
  batch-size: 12
  required-batch-size-multiple: 1
  optimizer: adam
  adam-betas: "(0.9, 0.999)"
  lr: 0.005
  lr-scheduler: cosine
  warmup-updates: 0
  min-lr: 0.0
  max-update: 150
  clip-norm: 0.25
  weight-decay: 0.0
  criterion: {criterion}
  seed: 1111
  validate-interval-updates: 50
  save-interval-updates: 50
  keep-interval-updates: 1
  validate-interval: 1000000
  no-epoch-checkpoints: true
  num-workers: 0
  data-buffer-size: 0
  log-format: simple
  log-interval: 10
evaluate:
  checkpoint: best
  batch_size: 10
  context_window: 4
provenance: test.md
"""


def write_lm_config(folder, name, norm, arch, published, data, criterion="cross_entropy"):
    """A tiny language-model config: 150 updates of windows of 8 tokens, validated and saved
    every 50; evaluated on checkpoint_best.pt, the sliding window with 4 tokens of context."""
    path = folder / f"{name}.yaml"
    path.write_text(TINY_LM_CONFIG.format(name=name, norm=norm, arch=arch, published=published, data=data,
                                          criterion=criterion))
    return path


def table(out):
    rows = list(csv.DictReader(open(out / "results.csv", newline="")))
    assert list(rows[0]) == RESULT_COLUMNS
    md = [line for line in (out / "results.md").read_text().splitlines() if line.startswith("|")]
    return rows, md


@pytest.mark.slow
def test_reproduce_writes_results_table(tiny_data, tmp_path, monkeypatch, capsys):
    ln = write_config(tmp_path, "tiny-ln", "LN", "transformer_iwslt_de_en_ln", 1.5, tiny_data)
    rbn = write_config(tmp_path, "tiny-rbn", "RBN", "transformer_iwslt_de_en_rbn", "null",
                       tiny_data, rbn=True, updates=True)
    never = write_config(tmp_path, "tiny-never", "BN", "transformer_iwslt_de_en_bn", 2.0, tiny_data)
    out = tmp_path / "out"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")

    def reproduce(*args):
        proc = subprocess.run([sys.executable, "-m", "normplug.recipes", *map(str, args)],
                              capture_output=True, text=True, timeout=600, env=env)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout

    # the configs train 5 epochs; the extra argument shortens that to 2 (~10 updates)
    reproduce("reproduce", ln, rbn, "--out", out, "--", "--max-epoch", "2")
    rows, md = table(out)
    assert [r["config"] for r in rows] == ["tiny-ln", "tiny-rbn"]
    for r in rows:
        assert r["status"] == "modified (extra args: --max-epoch 2)"
        assert 0 <= float(r["ours"]) <= 100 and 0 <= float(r["sacrebleu"]) <= 100
        assert r["sacrebleu_signature"].startswith("nrefs:1|")
        assert r["sacrebleu_references"] == ("cased references of the binarized test set, "
                                             "sacremoses-detokenized")
        assert float(r["train_seconds"]) > 0
    assert rows[0]["evaluated"] == "test src→tgt: average of the last 2 epoch checkpoints"
    assert rows[0]["checkpoints_averaged"] == "checkpoint1.pt checkpoint2.pt"
    assert rows[1]["evaluated"] == "test src→tgt: average of the last 2 update checkpoints"
    averaged = rows[1]["checkpoints_averaged"].split()
    kept = sorted((out / "tiny-rbn").glob("checkpoint_*_*.pt"), key=lambda p: int(p.stem.split("_")[-1]))
    assert averaged == [p.name for p in kept] and len(kept) == 2  # keep-interval-updates 2
    assert not list((out / "tiny-rbn").glob("checkpoint[0-9]*.pt"))  # no epoch checkpoints
    assert rows[0]["published"] == "1.5"
    assert float(rows[0]["delta"]) == round(float(rows[0]["ours"]) - 1.5, 2)
    assert rows[1]["published"] == "" and rows[1]["delta"] == ""
    assert md[0] == ("| config | dataset | setting | norm | metric | published | ours | Δ | also "
                     "| TID mean / var | evaluated | status |")
    assert md[2].startswith("| tiny-ln | tiny (tests/conftest.py) | Post-Norm | LN | BLEU ↑ | 1.5 | ")
    assert md[3].startswith("| tiny-rbn | tiny (tests/conftest.py) | Post-Norm | RBN | BLEU ↑ | — | ")
    assert f"| sacreBLEU {float(rows[0]['sacrebleu']):.2f} |" in md[2]
    assert len(md) == 4 and md[2].endswith("| modified (extra args: --max-epoch 2) |")
    text = (out / "results.md").read_text()
    assert "test paper LN" in text and "nrefs:1|" in text
    assert "- the cased references of the binarized test set" in text

    # each run: checkpoints averaged (normplug-average), scores next to them
    for name in ("tiny-ln", "tiny-rbn"):
        run = out / name
        scores = json.loads((run / f"scores-{name}.json").read_text())
        assert scores["sentences"] == 24
        # fairseq-generate's own scorer (its last line) agrees with ours: same tokens, same BLEU
        generated = (run / f"generate-{name}.txt").read_text()
        assert float(re.search(r"BLEU4 = ([\d.]+)", generated)[1]) == pytest.approx(scores["tokenized_bleu"], abs=0.01)
        assert scores["tokenized_bleu"] == float(rows[0 if name == "tiny-ln" else 1]["ours"])  # the table shows it
        record = json.loads((run / "normplug-run.json").read_text())
        assert (record["rc"], record["device"]) == (0, "cpu")
        log = (run / "train.log").read_text()
        assert "--max-epoch 2" in log or "max_epoch': 2" in log or "max_epoch=2" in log
    assert (out / "tiny-ln" / "checkpoint2.pt").exists() and not (out / "tiny-ln" / "checkpoint3.pt").exists()
    assert (out / "tiny-ln" / "averaged_last2.pt").exists()
    assert (out / "tiny-rbn" / "averaged_last2_updates.pt").exists()
    assert "rbn_penalty" in (out / "tiny-rbn" / "train.log").read_text()

    # a finished run is reused, not trained again (a patience-stopped run would resume); the
    # driver's main runs in this process (its start-up is fairseq's import), as normplug-recipe runs it
    before = (out / "tiny-ln" / "train.log").stat().st_mtime_ns
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # for the fairseq-generate it starts
    capsys.readouterr()
    assert recipes.main(["reproduce", str(ln), "--out", str(out), "--", "--max-epoch", "2"]) == 0
    assert "reusing the finished run" in capsys.readouterr().out
    assert (out / "tiny-ln" / "train.log").stat().st_mtime_ns == before

    # every row, run or not, without training anything
    reproduce("table", ln, never, rbn, "--out", out)
    rows, md = table(out)
    assert [(r["config"], r["status"]) for r in rows] == [
        ("tiny-ln", "modified (extra args: --max-epoch 2)"), ("tiny-never", "not run"),
        ("tiny-rbn", "modified (extra args: --max-epoch 2)")]
    assert rows[1]["ours"] == "" and rows[1]["published"] == "2.0"
    assert md[3] == ("| tiny-never | tiny (tests/conftest.py) | Post-Norm | BN | BLEU ↑ | 2.0 | — | — | — | — | "
                     "average of the last 2 epoch checkpoints | not run |")
    assert not (out / "tiny-never").exists()


@pytest.mark.slow
def test_ctrl_c_leaves_a_run_that_a_relaunch_resumes(tiny_data, tmp_path, terminal_sigint):
    """^C (SIGINT to the process group, as a terminal sends it) after the first checkpoint: one line,
    exit status 130, the table says interrupted; the same command resumes from checkpoint_last.pt."""
    import signal
    import time

    config = write_config(tmp_path, "tiny-ln", "LN", "transformer_iwslt_de_en_ln", 1.0, tiny_data)
    out = tmp_path / "out"
    save = out / "tiny-ln"
    argv = [sys.executable, "-m", "normplug.recipes", "train", str(config), "--out", str(out), "--max-epoch", "5"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    log, deadline = save / "train.log", time.time() + 300
    while not (log.exists() and "Saved checkpoint" in log.read_text()):  # written after checkpoint_last.pt
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read()
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGINT)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130 and err.splitlines() == [
        f"normplug-recipe: interrupted: fairseq-train stopped; the same command resumes it from checkpoint_last.pt ({save})"]
    assert recipes.reproduce([config], out, table_only=True, log=lambda *a: None) == 0
    assert table(out)[0][0]["status"] == "interrupted (a relaunch resumes it)"

    again = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert re.search(r"Loaded checkpoint \S*checkpoint_last\.pt \(epoch \d+ @ [1-9]\d* updates\)", log.read_text())
    assert (save / "checkpoint5.pt").exists()
    assert recipes.reproduce([config], out, table_only=True, log=lambda *a: None) == 0
    assert table(out)[0][0]["status"] == "trained, not evaluated"


def test_reproduce_refuses_a_bad_config_before_training(tmp_path, tiny_data, capsys):
    good = write_config(tmp_path, "tiny-ln", "LN", "transformer_iwslt_de_en_ln", 1.5, tiny_data)
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("  beam: 2\n", ""))
    assert recipes.main(["reproduce", str(good), str(bad), "--out", str(tmp_path / "out")]) == 2
    assert f"normplug-recipe: error: {bad}: evaluate: missing key 'beam'" in capsys.readouterr().err
    assert not (tmp_path / "out" / "tiny-ln").exists()


def test_table_statuses_from_what_runs_left(tmp_path, tiny_data, capsys):
    """The table reads scores and run records: full, modified, stale, failed, interrupted, trained but
    not evaluated, not run."""
    runs = {  # name: (the run record's extra arguments, its exit status, scores?); None: no run record
        "full": ([], 0, True), "short": (["--max-update", "9"], 0, True), "stale": ([], 0, True),
        "failed": ([], 1, False), "never": None, "unrecorded": True, "trained": ([], 0, False),
        "interrupted": ([], None, False), "killed": ([], None, True)}
    configs = {n: write_config(tmp_path, n, "LN", "transformer_iwslt_de_en_ln", 1.0, tiny_data) for n in runs}
    out = tmp_path / "out"
    for name, run in runs.items():
        (out / name).mkdir(parents=True)
        if run is True or (run and run[2]):
            (out / name / f"scores-{name}.json").write_text(json.dumps({
                "tokenized_bleu": 1.25, "sacrebleu": 1.5, "sacrebleu_signature": "nrefs:1|x",
                "sacrebleu_references": "cased references of the binarized test set",
                "averaged": ["checkpoint4.pt", "checkpoint5.pt"]}))
        if run in (None, True):
            continue
        extra, rc, _ = run
        flags = recipes.merged_flags(recipes.with_training_arguments(recipes.load_config(configs[name]), extra))
        if name == "stale":
            flags["lr"] = ["0.5"]  # the config changed after the run
        (out / name / recipes.RUN_RECORD).write_text(json.dumps(
            {"flags": flags, "extra": extra, "rc": rc, "seconds": 3.0, "interrupted": name == "interrupted"}))
    assert recipes.main(["table", *map(str, configs.values()), "--out", str(out)]) == 0
    rows, md = table(out)
    assert {r["config"]: r["status"] for r in rows} == {
        "full": "full", "short": "modified (extra args: --max-update 9)",
        "stale": "stale: the config changed after this run (--lr 0.5 -> 0.001)",
        "failed": "failed: fairseq-train exited 1", "never": "not run", "unrecorded": "full (training not recorded)",
        "trained": "trained, not evaluated", "interrupted": "interrupted (a relaunch resumes it)",
        "killed": "unfinished: training, or killed"}
    full = rows[0]
    assert (full["ours"], full["delta"], full["sacrebleu"], full["train_seconds"]) == \
        ("1.25", "0.25", "1.5", "3.0")
    assert md[2] == ("| full | tiny (tests/conftest.py) | Post-Norm | LN | BLEU ↑ | 1.0 | 1.25 | 0.25 | sacreBLEU 1.50 | — | "
                     "average of the last 2 epoch checkpoints | full |")
    # extra training arguments make no sense without training
    assert recipes.main(["table", str(configs["full"]), "--out", str(out), "--", "--lr", "1"]) == 2
    assert capsys.readouterr().err.startswith("normplug-recipe: error: table trains nothing")


def test_table_of_language_model_rows(tmp_path, lm_data):
    """Perplexity rows in the same table: lower is better, Δ = ours − published (negative: better
    than the paper), fairseq's sliding-window figure beside it, labelled with its context."""
    configs = [write_lm_config(tmp_path, name, "LN", "transformer_lm_ptb_ln", 6.0, lm_data)
               for name in ("lm-run", "lm-never")]
    out = tmp_path / "out"
    (out / "lm-run").mkdir(parents=True)
    (out / "lm-run" / "scores-lm-run.json").write_text(json.dumps({
        "perplexity": 5.9, "sliding_window_perplexity": 5.72, "sliding_window_context": 4,
        "averaged": ["checkpoint_best.pt"]}))
    assert recipes.reproduce(configs, out, table_only=True, log=lambda *a: None) == 0
    rows, md = table(out)
    run, never = rows
    assert (run["metric"], run["better"], run["ours"], run["delta"]) == \
        ("test perplexity on the tiny LM corpus", "lower", "5.9", "-0.1")
    assert (run["sliding_window_perplexity"], run["sliding_window_context"], run["sacrebleu"]) == ("5.72", "4", "")
    assert md[2] == ("| lm-run | tiny LM (tests/conftest.py) | Post-Norm | LN | perplexity ↓ | 6.0 | 5.90 | -0.10 "
                     "| sliding window, context 4: 5.72 | — | checkpoint_best.pt | full (training not recorded) |")
    assert md[3] == ("| lm-never | tiny LM (tests/conftest.py) | Post-Norm | LN | perplexity ↓ | 6.0 | — | — | — "
                     "| — | checkpoint_best.pt | not run |")
    assert "perplexity ↓: negative does" in (out / "results.md").read_text()


def reference_perplexity(checkpoint, data, length, context):
    """exp(mean token loss in nats), float64, written from what fairseq-eval-lm is meant to score:
    the test split as one stream (an end-of-line token per line), cut into windows of
    ``length - context`` tokens, each token predicted from the tokens before it in its window and
    the ``context`` tokens before the window (the first token of the split from the end-of-line
    symbol). Returns (perplexity, tokens)."""
    import argparse

    import torch
    from fairseq import checkpoint_utils, utils
    from fairseq.data import data_utils

    from conftest import USER_DIR

    utils.import_user_module(argparse.Namespace(user_dir=USER_DIR))
    (model,), _, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)])
    model = model.double().eval()
    dataset = data_utils.load_indexed_dataset(str(data / "test"), task.dictionary)
    stream = [t for i in range(len(dataset)) for t in dataset[i].tolist()]
    inputs = [task.dictionary.eos()] + stream[:-1]  # the token before each one
    scored, nll = length - context, 0.0
    for start in range(0, len(stream), scored):
        targets = stream[start:start + scored]
        window = torch.tensor([inputs[max(0, start - context):start + len(targets)]])
        with torch.no_grad():
            lprobs = model.get_normalized_probs(model(window), log_probs=True)[0, -len(targets):]
        nll -= lprobs.gather(1, torch.tensor(targets)[:, None]).sum().item()
    return math.exp(nll / len(stream)), len(stream)


@pytest.mark.slow
def test_reproduce_a_language_model_end_to_end(tmp_path, lm_data):
    """A tiny language model (BN with the RBN penalty) trained and evaluated by reproduce:
    the checkpoint with the best validation loss, perplexity = exp(mean token loss) on
    non-overlapping windows of the training length, and fairseq's sliding window beside it,
    both equal to an independent float64 computation; its row in the table."""
    config = write_lm_config(tmp_path, "tiny-lm-rbn", "RBN", "transformer_lm_ptb_rbn", 6.0, lm_data,
                             criterion="cross_entropy_rbn\n  rbn-mean-weight: 0.5\n  rbn-var-weight: 0.1")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "normplug.recipes", "reproduce", str(config), "--out", str(out)],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,), md = table(out)
    assert (row["config"], row["status"], row["better"]) == ("tiny-lm-rbn", "full", "lower")
    run = out / "tiny-lm-rbn"
    assert "rbn_penalty" in (run / "train.log").read_text()
    scores = json.loads((run / "scores-tiny-lm-rbn.json").read_text())
    assert scores["checkpoint"] == str(run / "checkpoint_best.pt")
    for prefix, context in (("", 0), ("sliding_window_", 4)):
        expected, tokens = reference_perplexity(run / "checkpoint_best.pt", lm_data, 8, context)
        assert scores["tokens"] == tokens
        # fairseq prints the loss in bits to 4 decimals; ours is rounded to 2
        assert scores[prefix + "perplexity"] == pytest.approx(expected, abs=0.005 + 1e-4 * expected)
    # every scored token sees at least 4 tokens before it: the model has learned the counting language
    assert scores["sliding_window_perplexity"] < scores["perplexity"]
    assert (float(row["ours"]), float(row["sliding_window_perplexity"])) == \
        (scores["perplexity"], scores["sliding_window_perplexity"])
    assert float(row["delta"]) == round(scores["perplexity"] - 6.0, 2)
    assert md[2].startswith("| tiny-lm-rbn | tiny LM (tests/conftest.py) | Post-Norm | RBN | perplexity ↓ | 6.0 | ")


def _files(root):
    return {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*")}


@pytest.mark.slow
def test_paper_script_refuses_more_gpus_than_visible_before_any_download(tmp_path):
    """scripts/wmt16.sh --gpus=4 where fewer GPUs are visible: the driver's one line, exit 2, before the data
    preparation (a 1.2 GB download) starts; a --gpus that is not a count, the script's own line."""
    repo = tmp_path / "repo"
    for part in ("normplug", "scripts", "configs"):
        shutil.copytree(REPO / part, repo / part, ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ, PYTHON=sys.executable, PYTHONWARNINGS="ignore", CUDA_VISIBLE_DEVICES="")
    for gpus, said in (("4", "normplug-recipe: error: --gpus 4: 0 GPUs visible here (CUDA_VISIBLE_DEVICES=); "
                             "--dry-run prints the 4-GPU command lines on any machine"),
                       ("x", "scripts/wmt16.sh: --gpus must be a whole number over 0, got 'x'")):
        proc = subprocess.run(["bash", str(repo / "scripts" / "wmt16.sh"), f"--gpus={gpus}"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert (proc.returncode, proc.stderr.splitlines(), proc.stdout) == (2, [said], "")
    assert sorted(p.name for p in repo.iterdir()) == ["configs", "normplug", "scripts"]


@pytest.mark.slow
@pytest.mark.parametrize("script, arch, rows, trainings", [
    ("iwslt14", "transformer_iwslt_de_en_rbn", 10, 8), ("wmt16", "transformer_wmt_en_de_rbn", 3, 3)])
def test_paper_script_dry_run_prints_plain_fairseq_and_writes_nothing(script, arch, rows, trainings, tmp_path):
    """scripts/iwslt14.sh and wmt16.sh --dry-run: each row's fairseq-train and fairseq-generate lines,
    which fairseq's own parsers accept as they are; no file written in the repository or $HOME."""
    import shlex

    from fairseq import options

    repo, home = tmp_path / "repo", tmp_path / "home"  # a copy without __pycache__: a .pyc written shows
    for part in ("normplug", "scripts", "configs"):
        shutil.copytree(REPO / part, repo / part, ignore=shutil.ignore_patterns("__pycache__"))
    home.mkdir()
    before = _files(repo)
    env = dict(os.environ, HOME=str(home), TMPDIR=str(home), PYTHON=sys.executable, PYTHONWARNINGS="ignore")
    proc = subprocess.run(["bash", str(repo / "scripts" / f"{script}.sh"), "--dry-run"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert _files(repo) == before and list(home.iterdir()) == []
    assert f"--user-dir {repo / 'normplug'} " in proc.stdout  # the copy's plugin ran
    lines = proc.stdout.splitlines()
    # the GPU run's lines, printed on this CPU machine
    assert lines[0] == recipes.dry_run_note(recipes.Launch()) and " --cpu" not in proc.stdout.partition("\n")[2]
    assert sum(line.startswith("# wang2022-") for line in lines) == rows
    train = [shlex.split(line) for line in lines if line.startswith("fairseq-train ")]
    generate = [shlex.split(line) for line in lines if line.startswith("fairseq-generate ")]
    assert (len(train), len(generate)) == (trainings, rows)
    assert f"{script}-{'deen' if script == 'iwslt14' else 'ende'}-post-rbn" in " ".join(
        argv[argv.index("--save-dir") + 1] for argv in train if argv[argv.index("--arch") + 1] == arch)
    for argv, parser in [(a, options.get_training_parser) for a in train] + \
            [(a, options.get_generation_parser) for a in generate]:  # the plugin this process imported
        argv[argv.index("--user-dir") + 1] = str(REPO / "normplug")
        options.parse_args_and_arch(parser(), argv[1:])

