"""Fault tolerance: a training run SIGKILLed after any checkpoint fairseq writes (an interval
checkpoint inside epoch 1 or 2, the checkpoint at the end of epoch 1), resumed from
checkpoint_last.pt, ends bitwise where an uninterrupted run with the same seed ends.

Why bitwise: on CPU with one thread every kernel is deterministic; fairseq reseeds
torch at every update (seed + num_updates, so dropout repeats), the checkpoint
holds the parameters, every buffer (BN running statistics; PowerNorm ψ², ν,
warm-up counter and update count), the Adam state, the LR-scheduler state and the
data iterator's epoch and position; all float32 values are stored exactly.

The batches need ``--update-epoch-batch-itr True``: without it fairseq 0.12 groups the
sentences into batches once, when it creates the epoch iterator (length-sorted, ties
broken by a permutation seeded with seed + that epoch), and only reorders those batches in
later epochs. An uninterrupted run keeps epoch 1's batches; a resumed run creates its
iterator at the checkpoint's epoch, so from epoch 2 on (the end-of-epoch-1 checkpoint
included) its batches hold other sentences. With the flag every run builds epoch E's
batches from seed + E.

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

EPOCH = 8  # batches an epoch at 400 tokens
TOTAL = 12  # updates: four into epoch 2
INTERVAL = 3  # --save-interval-updates
POWER_WARMUP = 5  # PowerNorm warm-up straddles the interruption at update 3
# every checkpoint the uninterrupted run writes besides checkpoint_last.pt, by its update
CHECKPOINTS = {3: "checkpoint_1_3.pt", 6: "checkpoint_1_6.pt", EPOCH: "checkpoint1.pt",
               9: "checkpoint_2_9.pt", 12: "checkpoint_2_12.pt"}


def _args(data, save):
    return train_args(
        data, save, "norm_transformer",
        "--encoder-self-attn-norm", "batch", "--encoder-ffn-norm", "power",
        "--decoder-self-attn-norm", "rms", "--decoder-ffn-norm", "batch",
        "--power-warmup", str(POWER_WARMUP), "--bn-momentum", "0.1",
        "--criterion", "label_smoothed_cross_entropy_rbn",
        "--rbn-mean-weight", "0.5", "--rbn-var-weight", "0.05",
        "--save-interval-updates", str(INTERVAL), "--keep-interval-updates", "10",
        "--update-epoch-batch-itr", "True",
        updates=TOTAL,
    )


def _load(path):
    return torch.load(path, map_location="cpu", weights_only=False)


def _updates(state):
    return state["optimizer_history"][-1]["num_updates"]


def _scheduler(state):
    return state["optimizer_history"][-1]["lr_scheduler_state"]


def _assert_same_state(a, b, what, same_scheduler_best=True):
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
    scheduler_a, scheduler_b = _scheduler(a), _scheduler(b)
    if not same_scheduler_best:  # see the end-of-epoch case of the test
        scheduler_a, scheduler_b = ({k: v for k, v in s.items() if k != "best"} for s in (scheduler_a, scheduler_b))
    assert scheduler_a == scheduler_b, what


def _kill_after_checkpoint(data, save, k, timeout=180):
    """Start a run, SIGKILL it once the checkpoint at update k is on disk."""
    err_path = save.parent / f"{save.name}.stderr"
    save.parent.mkdir(parents=True, exist_ok=True)
    with open(err_path, "w") as err:
        proc = start_process([sys.executable, HOOKED_TRAIN, *_args(data, save)],
                             env={"HOOK_PAUSE_AT_UPDATE": str(k)},
                             stdout=err, stderr=err)
        try:
            deadline = time.monotonic() + timeout
            while "HOOK-PAUSED" not in err_path.read_text():
                assert proc.poll() is None, f"run ended before update {k}:\n{err_path.read_text()[-3000:]}"
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


# Where the run is killed, each time after the checkpoint at update k, and the data iterator's state
# that checkpoint holds. Each relaunch resumes from the checkpoint of the kill before.
KILLS = [
    (3, {"epoch": 1, "iterations_in_epoch": 3}),  # interval checkpoint, PowerNorm still in warm-up
    (EPOCH, {"epoch": 2, "iterations_in_epoch": 0}),  # end of epoch 1: the next run starts epoch 2
    (9, {"epoch": 2, "iterations_in_epoch": 1}),  # interval checkpoint inside epoch 2
]


@pytest.mark.slow
def test_sigkill_then_resume_is_bitwise_identical(tiny_data, tmp_path, uninterrupted):
    save = tmp_path / "ck"
    pn = "encoder.layers.0.final_layer_norm."
    # fairseq writes the end-of-epoch checkpoint before lr_step(epoch, validation loss) makes that loss the
    # scheduler's "best"; a run resumed from it never records it. inverse_sqrt sets the LR from the update
    # count alone (the optimizer's param_groups, LR included, are compared), so only that field differs.
    resumed_at_epoch_end = False
    resumed_from = None
    for k, iterator in KILLS:
        log = _kill_after_checkpoint(tiny_data, save, k)
        if resumed_from is not None:
            assert f"(epoch {resumed_from[1]['epoch']} @ {resumed_from[0]} updates)" in log
            resumed_at_epoch_end |= resumed_from[0] == EPOCH
        # what the kill left: the checkpoint at update k, nothing later
        last = _load(save / "checkpoint_last.pt")
        assert _updates(last) == k
        assert {key: last["extra_state"]["train_iterator"][key] for key in iterator} == iterator
        assert sorted(p.name for p in save.glob("checkpoint_*_*.pt")) == sorted(
            name for u, name in CHECKPOINTS.items() if u <= k and u % INTERVAL == 0)
        assert int(last["model"][pn + "num_updates"]) == k - 1
        # … and it is exactly the uninterrupted run's checkpoint at update k
        _assert_same_state(last, _load(uninterrupted / CHECKPOINTS[k]), f"update {k}",
                           same_scheduler_best=not resumed_at_epoch_end)
        if resumed_at_epoch_end:
            assert _scheduler(last)["best"] is None
        resumed_from = (k, iterator)
    first = _load(save / CHECKPOINTS[KILLS[0][0]])
    assert int(first["model"][pn + "num_updates"]) < POWER_WARMUP
    assert float(first["model"][pn + "nu"].abs().sum()) > 0

    resumed = run_cli("fairseq-train", *_args(tiny_data, save))
    log = resumed.stdout + resumed.stderr
    assert f"(epoch 2 @ {KILLS[-1][0]} updates)" in log
    assert f"num_updates {TOTAL}" in log

    ref = _load(uninterrupted / "checkpoint_last.pt")
    got = _load(save / "checkpoint_last.pt")
    assert _updates(ref) == _updates(got) == TOTAL
    _assert_same_state(got, ref, f"update {TOTAL}", same_scheduler_best=False)
    assert _scheduler(got)["best"] is None and _scheduler(ref)["best"] is not None
    _assert_same_state(_load(save / CHECKPOINTS[TOTAL]), _load(uninterrupted / CHECKPOINTS[TOTAL]),
                       CHECKPOINTS[TOTAL], same_scheduler_best=False)
    # PowerNorm's warm-up ended after the first interruption, on the same update in both runs
    assert int(got["model"][pn + "num_updates"]) == int(ref["model"][pn + "num_updates"]) == TOTAL - 1 >= POWER_WARMUP
