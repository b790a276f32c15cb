"""Fault tolerance: a training run SIGKILLed after the checkpoint at update k, resumed
from checkpoint_last.pt, ends bitwise where an uninterrupted run with the same seed ends.

Why bitwise: on CPU with one thread every kernel is deterministic; fairseq reseeds
torch at every update (seed + num_updates, so dropout repeats), the checkpoint
holds the parameters, every buffer (BN running statistics; PowerNorm ψ², ν,
warm-up counter and update count), the Adam state, the LR-scheduler state and the
data iterator's position inside the epoch; all float32 values are stored exactly.

The run to kill goes through tests/hooked_train.py, which stops (sleeps) right
after writing the checkpoint at update k, so the SIGKILL lands at a known point;
the kill itself is real (no clean-up code runs). The uninterrupted and the
resumed runs are plain ``fairseq-train``.
"""
import signal
import sys
import time

import pytest
import torch

from conftest import HOOKED_TRAIN, kill_group, run_cli, start_process, train_args

K = 3  # killed after the checkpoint at this update
TOTAL = 10  # 8 batches an epoch at 400 tokens: the resumed run also crosses into epoch 2
POWER_WARMUP = 5  # PowerNorm warm-up straddles the interruption


def _args(data, save):
    return train_args(
        data, save, "norm_transformer",
        "--encoder-self-attn-norm", "batch", "--encoder-ffn-norm", "power",
        "--decoder-self-attn-norm", "rms", "--decoder-ffn-norm", "batch",
        "--power-warmup", str(POWER_WARMUP), "--bn-momentum", "0.1",
        "--criterion", "label_smoothed_cross_entropy_rbn",
        "--rbn-mean-weight", "0.5", "--rbn-var-weight", "0.05",
        "--save-interval-updates", str(K), "--keep-interval-updates", "10",
        updates=TOTAL,
    )


def _load(path):
    return torch.load(path, map_location="cpu", weights_only=False)


def _updates(state):
    return state["optimizer_history"][-1]["num_updates"]


def _assert_same_state(a, b, what):
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), f"{what}: model.{k}"
    opt_a, opt_b = a["last_optimizer_state"], b["last_optimizer_state"]
    assert opt_a["param_groups"] == opt_b["param_groups"], what
    for idx in opt_a["state"]:
        for k, v in opt_a["state"][idx].items():
            w = opt_b["state"][idx][k]
            assert torch.equal(v, w) if torch.is_tensor(v) else v == w, f"{what}: optimizer {idx}.{k}"
    assert a["extra_state"]["train_iterator"] == b["extra_state"]["train_iterator"], what
    assert a["optimizer_history"][-1]["lr_scheduler_state"] == b["optimizer_history"][-1]["lr_scheduler_state"]


def _kill_after_checkpoint(data, save, timeout=180):
    """Start a run, SIGKILL it once the checkpoint at update K is on disk."""
    err_path = save.parent / f"{save.name}.stderr"
    save.parent.mkdir(parents=True, exist_ok=True)
    with open(err_path, "w") as err:
        proc = start_process([sys.executable, HOOKED_TRAIN, *_args(data, save)],
                             env={"HOOK_PAUSE_AT_UPDATE": str(K)},
                             stdout=err, stderr=err)
        try:
            deadline = time.monotonic() + timeout
            while "HOOK-PAUSED" not in err_path.read_text():
                assert proc.poll() is None, f"run ended before update {K}:\n{err_path.read_text()[-3000:]}"
                assert time.monotonic() < deadline, "run did not reach the checkpoint in time"
                time.sleep(0.05)
            kill_group(proc, signal.SIGKILL)
        finally:
            if proc.poll() is None:
                kill_group(proc)
    assert proc.returncode == -signal.SIGKILL
    return err_path.read_text()


@pytest.fixture(scope="module")
def uninterrupted(tiny_data, tmp_path_factory):
    save = tmp_path_factory.mktemp("uninterrupted") / "ck"
    run_cli("fairseq-train", *_args(tiny_data, save))
    return save


@pytest.mark.slow
def test_sigkill_then_resume_is_bitwise_identical(tiny_data, tmp_path, uninterrupted):
    save = tmp_path / "ck"
    _kill_after_checkpoint(tiny_data, save)

    # what the kill left: the checkpoint at update K, nothing later
    last = _load(save / "checkpoint_last.pt")
    assert _updates(last) == K
    assert sorted(p.name for p in save.glob("checkpoint_*_*.pt")) == [f"checkpoint_1_{K}.pt"]
    pn = "encoder.layers.0.final_layer_norm."
    assert int(last["model"][pn + "num_updates"]) == K - 1 < POWER_WARMUP  # still in warm-up
    assert float(last["model"][pn + "nu"].abs().sum()) > 0
    # … and it is exactly the uninterrupted run's checkpoint at update K
    _assert_same_state(last, _load(uninterrupted / f"checkpoint_1_{K}.pt"), f"update {K}")

    resumed = run_cli("fairseq-train", *_args(tiny_data, save))
    log = resumed.stdout + resumed.stderr
    assert "Loaded checkpoint" in log and f"@ {K} updates" in log
    assert f"num_updates {TOTAL}" in log

    ref = _load(uninterrupted / "checkpoint_last.pt")
    got = _load(save / "checkpoint_last.pt")
    assert _updates(ref) == _updates(got) == TOTAL
    assert ref["extra_state"]["train_iterator"]["epoch"] == 2  # crossed an epoch boundary
    _assert_same_state(got, ref, f"update {TOTAL}")
    for name in ("checkpoint_1_6.pt", "checkpoint1.pt", "checkpoint_2_9.pt"):
        # the checkpoints after the interruption too (update 8 ends epoch 1)
        _assert_same_state(_load(save / name), _load(uninterrupted / name), name)
    # PowerNorm's warm-up ended after the interruption, on the same update in both runs
    assert int(got["model"][pn + "num_updates"]) == int(ref["model"][pn + "num_updates"]) == TOTAL - 1 >= POWER_WARMUP
