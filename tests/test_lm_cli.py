"""The real command lines of the language model, as subprocesses on the toy corpus: one
fairseq-train per kind (ln; bn, rbn, pn with cross_entropy_rbn, rbn with non-zero weights;
an adaptive-softmax WikiText-103-shaped rbn with adaptive_loss_rbn), a few updates each,
then fairseq-eval-lm on each checkpoint; and the errors of the command line, whose message
is the last line of stderr."""
import math
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import USER_DIR, run_cli
from test_lm import TINY_CUTOFFS, TINY_LM

pytestmark = pytest.mark.slow

WEIGHTS = {"rbn_mean": 0.5, "rbn_var": 0.1}
RBN = ["--rbn-mean-weight", str(WEIGHTS["rbn_mean"]), "--rbn-var-weight", str(WEIGHTS["rbn_var"])]
# zero weights: the bn and pn baselines still log their TIDs
RUNS = {
    "ln": ("transformer_lm_ptb_ln", ["--criterion", "cross_entropy"]),
    "bn": ("transformer_lm_ptb_bn", ["--criterion", "cross_entropy_rbn"]),
    "rbn": ("transformer_lm_ptb_rbn", ["--criterion", "cross_entropy_rbn", *RBN]),
    "pn": ("transformer_lm_ptb_pn", ["--criterion", "cross_entropy_rbn", "--power-warmup", "2"]),
    "adaptive": ("transformer_lm_wt103_rbn", [*TINY_CUTOFFS, "--criterion", "adaptive_loss_rbn", *RBN,
                                              "--ddp-backend", "legacy_ddp"]),
}
UPDATES = 3


def lm_train_args(data, save_dir, arch, *extra):
    return [data, "--task", "language_modeling", "--user-dir", USER_DIR, "--arch", arch, *TINY_LM,
            "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "256", "--max-update", str(UPDATES),
            "--cpu", "--seed", "1", "--save-dir", save_dir, "--no-progress-bar", "--log-interval", "1",
            "--log-format", "simple", "--num-workers", "0", "--data-buffer-size", "0",
            # fairseq drops a last batch whose size is not a multiple of this (default 8), in
            # validation too: the valid loss would leave out the longest lines that eval-lm scores
            "--required-batch-size-multiple", "1", *extra]


def eval_lm(data, checkpoint, *extra, check=True):
    """fairseq-eval-lm on the valid split; its task options are its own: training's are repeated."""
    return run_cli("fairseq-eval-lm", data, "--user-dir", USER_DIR, "--path", checkpoint, "--cpu",
                   "--gen-subset", "valid", "--max-tokens", "256", "--tokens-per-sample", "16",
                   "--sample-break-mode", "eos", *extra, check=check)


@pytest.fixture(scope="module")
def runs(lm_data, tmp_path_factory):
    """kind -> (training log, fairseq-eval-lm log on the valid split, checkpoint), two runs at a time."""
    root = tmp_path_factory.mktemp("lm_runs")

    def train_and_evaluate(kind):
        arch, extra = RUNS[kind]
        train = run_cli("fairseq-train", *lm_train_args(lm_data, root / kind, arch, *extra))
        checkpoint = root / kind / "checkpoint_last.pt"
        evaluation = eval_lm(lm_data, checkpoint)
        return train.stdout + train.stderr, evaluation.stdout + evaluation.stderr, checkpoint

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(RUNS, pool.map(train_and_evaluate, RUNS)))


def logged(line, key):
    match = re.search(rf"(?:^|[ |,]){re.escape(key)}[= ](-?[0-9.]+)", line)
    return None if match is None else float(match.group(1))


@pytest.mark.parametrize("kind", sorted(RUNS))
def test_trains_and_eval_lm_scores_the_valid_loss(runs, kind):
    """fairseq-eval-lm on the saved model gives the valid loss that training logged for the same
    updates: population statistics are saved and used, whatever the batches and their padding."""
    train, evaluation, _ = runs[kind]
    assert len([line for line in train.splitlines() if "| train_inner |" in line]) == UPDATES
    valid = [line for line in train.splitlines() if "| valid |" in line][-1]
    assert logged(valid, "num_updates") == UPDATES
    scored = re.search(r"Loss \(base 2\): ([0-9.]+), Perplexity: ([0-9.]+)", evaluation)
    assert scored, evaluation[-2000:]
    loss, perplexity = map(float, scored.groups())
    assert math.isfinite(loss) and perplexity == pytest.approx(2 ** loss, rel=1e-3)
    if kind == "adaptive":  # fairseq's adaptive_loss skips the words of in-cluster index padding_idx:
        return              # ids 11 and 21 of this tiny vocabulary (cutoffs 10,20)
    assert loss == pytest.approx(logged(valid, "loss"), abs=1.5e-3)  # the valid loss is rounded to 3 decimals


@pytest.mark.parametrize("kind", ["bn", "rbn", "pn", "adaptive"])
def test_penalty_and_tid_are_logged_apart(runs, kind):
    """Every step logs the task loss, the penalty and every layer's TID; the penalty is
    λ_μ·rbn_mean + λ_σ·rbn_var over the step's tokens (fairseq logs base-2 losses per token)."""
    train, _, _ = runs[kind]
    layers = [f"dec{i}.{site}" for i in range(2) for site in ("self_attn", "ffn")]
    for line in [line for line in train.splitlines() if "| train_inner |" in line]:
        for key in ("task_loss", "rbn_penalty", "tid_var", *(f"tid_var/{layer}" for layer in layers)):
            assert logged(line, key) is not None, (key, line)
        if kind == "pn":  # PowerNorm has no mean statistic, and no BN layer adds a penalty
            assert logged(line, "tid_mean") is None and logged(line, "rbn_penalty") == 0
            continue
        assert logged(line, "tid_mean/dec1.ffn") is not None
        weights = WEIGHTS if kind in ("rbn", "adaptive") else dict.fromkeys(WEIGHTS, 0)
        want = sum(w * logged(line, key) for key, w in weights.items()) / logged(line, "wpb") / math.log(2)
        assert logged(line, "rbn_penalty") == pytest.approx(want, rel=2e-3, abs=1e-4), line
        assert logged(line, "loss") == pytest.approx(logged(line, "task_loss") + logged(line, "rbn_penalty"),
                                                     abs=2e-3)


def test_command_line_errors_end_stderr(lm_data, runs, tmp_path):
    def refused(proc):
        """The message of the NormplugError that ended a run before it trained or scored: the
        last line of stderr, after one traceback of that error alone."""
        err = proc.stderr
        assert proc.returncode == 1 and err.count("Traceback (most recent call last)") == 1, err[-3000:]
        assert "During handling" not in err, err[-3000:]
        assert "Start iterating over samples" not in proc.stdout + err
        last = err.strip().splitlines()[-1]
        assert last.startswith("normplug.errors.NormplugError: "), last
        return last[len("normplug.errors.NormplugError: "):]

    save = tmp_path / "never"
    last = refused(run_cli("fairseq-train", *lm_train_args(
        lm_data, save, "transformer_lm_ptb_bn", "--criterion", "adaptive_loss_rbn", "--ddp-backend", "legacy_ddp"),
        check=False))
    assert last.startswith("--criterion adaptive_loss_rbn needs") and "cross_entropy_rbn" in last
    last = refused(run_cli("fairseq-train", *lm_train_args(
        lm_data, save, "transformer_lm_ptb_ln", "--criterion", "cross_entropy_rbn", *RBN), check=False))
    assert last.startswith("--rbn-mean-weight 0.5") and "no 'batch' norm" in last
    last = refused(run_cli("fairseq-train", *lm_train_args(
        lm_data, save, "transformer_lm_wt103_bn", *TINY_CUTOFFS, "--criterion", "cross_entropy_rbn"), check=False))
    assert last.startswith("--criterion cross_entropy_rbn needs a full softmax") and "adaptive_loss_rbn" in last
    assert not list(save.glob("*.pt"))
    # test-batch statistics would let eval-lm's positions see later tokens: refused
    last = refused(eval_lm(lm_data, runs["bn"][2], "--model-overrides", "{'bn_test_stats': 'batch'}", check=False))
    assert last.startswith("decoder norm") and "--bn-test-stats population" in last
