"""Bad input where a user touches the plugin: one clear ``error:`` line that names
the problem, no traceback from inside fairseq, and nothing written over a good
checkpoint.

Every failing ``fairseq-train`` below runs in a copy of a save directory that
holds good checkpoints of the same architecture (so fairseq would resume from
them), and the test checks that every file there is byte-for-byte unchanged
and that no file was added (no crash.pt, no new checkpoint).
"""
import hashlib
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import USER_DIR, run_cli, run_workers, train_args

ARCH = "transformer_iwslt_de_en_pn"


def _train(data, save, *extra, updates=2):
    # the RBN criterion (weights 0 unless given) throughout: fairseq refuses to resume
    # a checkpoint written with another criterion class
    return train_args(data, save, ARCH, "--power-warmup", "1", "--save-interval-updates", "2",
                      "--criterion", "label_smoothed_cross_entropy_rbn", *extra, updates=updates)


@pytest.fixture(scope="module")
def good(tiny_data, tmp_path_factory):
    """A save directory with good checkpoints (update 2)."""
    save = tmp_path_factory.mktemp("good") / "ck"
    run_cli("fairseq-train", *_train(tiny_data, save))
    assert {p.name for p in save.iterdir()} >= {"checkpoint_last.pt", "checkpoint_1_2.pt"}
    return save


def _snapshot(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _copy(good, dest):
    shutil.copytree(good, dest)
    return dest


def _parallel(*calls):
    """Run independent CLI calls two at a time (each is mostly start-up time)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda c: c(), calls))


def _assert_clear_error(proc, *needles, code=None):
    err = proc.stderr
    assert proc.returncode != 0, proc.stdout[-2000:]
    if code is not None:
        assert proc.returncode == code, (proc.returncode, err[-2000:])
    assert "Traceback" not in err, err[-4000:]
    last = err.strip().splitlines()[-1]
    assert "error:" in last, err[-2000:]
    for needle in needles:
        assert needle in last, (needle, last)
    return last


def test_bad_norm_options_stop_before_anything_is_written(tiny_data, tmp_path, good):
    dirs = [_copy(good, tmp_path / f"s{i}") for i in range(5)]
    before = _snapshot(good)
    cases = [
        # RBN weights on a model without a batch norm (PowerNorm only); validation
        # off, so the check fires in the first training step
        (_train(tiny_data, dirs[0], "--rbn-mean-weight", "60", "--disable-validation", updates=4),
         ("--rbn-mean-weight", "no 'batch' norm", "power"), None),
        # PowerNorm groups that do not divide the dimension (16)
        (_train(tiny_data, dirs[1], "--power-groups", "3", updates=4),
         ("groups=3 does not divide dim=16", "--encoder-attn-norm power"), 1),
        # BN momentum outside (0, 1]
        (_train(tiny_data, dirs[2], "--encoder-norm", "batch", "--bn-momentum", "-0.1", updates=4),
         ("--bn-momentum", "(0, 1]", "-0.1"), 2),
        (_train(tiny_data, dirs[3], "--encoder-norm", "batch", "--bn-momentum", "1.5", updates=4),
         ("--bn-momentum", "(0, 1]", "1.5"), 2),
        (_train(tiny_data, dirs[4], "--power-alpha-fwd", "2", updates=4),
         ("--power-alpha-fwd", "(0, 1]"), 2),
    ]
    procs = _parallel(*[lambda a=args: run_cli("fairseq-train", *a, check=False) for args, _, _ in cases])
    for (args, needles, code), proc, folder in zip(cases, procs, dirs):
        _assert_clear_error(proc, *needles, code=code)
        assert _snapshot(folder) == before, args


def _truncate(src, dest, keep=0.5):
    data = src.read_bytes()
    dest.write_bytes(data[: int(len(data) * keep)])
    return dest


def test_truncated_checkpoints(tiny_data, tmp_path, good):
    before = _snapshot(good)
    # (a) --restore-file pointing to a truncated file, in a directory of good checkpoints
    restore_dir = _copy(good, tmp_path / "restore")
    bad_file = _truncate(good / "checkpoint_last.pt", tmp_path / "truncated.pt")
    # (b) checkpoint_last.pt truncated in the save directory (a kill during fairseq's copy)
    last_dir = _copy(good, tmp_path / "last")
    _truncate(good / "checkpoint_last.pt", last_dir / "checkpoint_last.pt", keep=0.9)
    last_before = _snapshot(last_dir)
    # (c) fairseq-generate on a truncated file (other damage: test_checkpoint_problem_helper)
    restore, last, gen_trunc = _parallel(
        lambda: run_cli("fairseq-train", *_train(tiny_data, restore_dir, "--restore-file", bad_file,
                                                 updates=4), check=False),
        lambda: run_cli("fairseq-train", *_train(tiny_data, last_dir, updates=4), check=False),
        lambda: run_cli("fairseq-generate", tiny_data, "--user-dir", USER_DIR, "--path", bad_file,
                        "--cpu", "--beam", "2", "--batch-size", "8", check=False),
    )
    _assert_clear_error(restore, str(bad_file), "truncated")
    assert _snapshot(restore_dir) == before

    msg = _assert_clear_error(last, "checkpoint_last.pt", "truncated", "--restore-file")
    assert "checkpoint_1_2.pt" in msg  # an intact checkpoint to resume from
    assert _snapshot(last_dir) == last_before

    _assert_clear_error(gen_trunc, str(bad_file), "truncated")

    # following the message resumes from the intact checkpoint
    resumed = run_cli("fairseq-train", *_train(tiny_data, last_dir, "--restore-file",
                                               last_dir / "checkpoint_1_2.pt", updates=3))
    assert "num_updates 3" in resumed.stdout + resumed.stderr


def test_truncated_checkpoint_stops_every_distributed_worker(tiny_data, tmp_path, good):
    """fairseq reads the checkpoint on rank 0 only and broadcasts it: without the
    check, rank 0 would fail and rank 1 would wait. Both stop with the message."""
    save = _copy(good, tmp_path / "ck")
    _truncate(good / "checkpoint_last.pt", save / "checkpoint_last.pt")
    before = _snapshot(save)
    args = _train(tiny_data, save, updates=4)
    results = run_workers([args, args], timeout=120)
    for rank, (rc, out, err) in enumerate(results):
        assert rc != 0 and "Traceback" not in err, (rank, err[-3000:])
        assert "normplug: error: checkpoint" in err and "truncated" in err, (rank, err[-3000:])
    assert _snapshot(save) == before


def test_data_directory_without_dictionaries(tiny_data, tmp_path, good):
    nodict = tmp_path / "nodict"
    nodict.mkdir()
    for f in tiny_data.iterdir():
        if not f.name.startswith("dict."):
            shutil.copy(f, nodict / f.name)
    empty = tmp_path / "empty"
    empty.mkdir()
    save = _copy(good, tmp_path / "ck")
    before = _snapshot(save)
    train, train_empty, gen = _parallel(
        lambda: run_cli("fairseq-train", *_train(nodict, save, updates=4), check=False),
        lambda: run_cli("fairseq-train", *_train(empty, save, updates=4), check=False),
        lambda: run_cli("fairseq-generate", nodict, "--user-dir", USER_DIR, "--path",
                        good / "checkpoint_last.pt", "--cpu", check=False),
    )
    _assert_clear_error(train, str(nodict), "dict.src.txt", "fairseq-preprocess")
    _assert_clear_error(train_empty, str(empty), "language pair", "fairseq-preprocess")
    _assert_clear_error(gen, str(nodict), "dict.src.txt")
    assert _snapshot(save) == before


def test_checkpoint_problem_helper(tmp_path, good):
    import zipfile
    from argparse import Namespace

    import torch

    from normplug.errors import checkpoint_problem, explain, intact_checkpoints, restore_path

    assert checkpoint_problem(str(good / "checkpoint_last.pt")) is None
    cut = _truncate(good / "checkpoint_last.pt", tmp_path / "cut.pt", keep=0.99)
    assert "truncated" in checkpoint_problem(str(cut))
    assert "cannot be read" in checkpoint_problem(str(tmp_path / "missing.pt"))
    (tmp_path / "empty.pt").write_bytes(b"")
    assert "empty" in checkpoint_problem(str(tmp_path / "empty.pt"))
    (tmp_path / "notes.pt").write_text("not a checkpoint\n")
    assert "not a PyTorch checkpoint" in checkpoint_problem(str(tmp_path / "notes.pt"))
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as z:
        z.writestr("a.txt", "x")
    assert "no data.pkl" in checkpoint_problem(str(tmp_path / "other.zip"))
    torch.save({"x": torch.ones(2)}, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    assert checkpoint_problem(str(tmp_path / "legacy.pt")) is None
    legacy_cut = _truncate(tmp_path / "legacy.pt", tmp_path / "legacy_cut.pt")
    assert "cannot be loaded" in checkpoint_problem(str(legacy_cut))

    # the excepthook's explanation: only for fairseq's loader on a damaged file
    from fairseq import checkpoint_utils

    for path, expected in ((cut, "truncated"), (good / "checkpoint_last.pt", None)):
        try:
            checkpoint_utils.load_checkpoint_to_cpu(str(path))
            if path == cut:
                raise AssertionError("a truncated checkpoint loaded")
            raise RuntimeError("an unrelated failure after a good load")
        except Exception as exc:  # noqa: BLE001
            msg = explain(exc)
            if expected is None:
                assert msg is None  # anything else keeps its traceback
            else:
                assert msg.startswith("normplug: error: checkpoint") and expected in msg
    assert intact_checkpoints(str(good))[0].endswith(".pt")
    assert restore_path(Namespace(save_dir=str(good), restore_file="checkpoint_last.pt")) == str(
        good / "checkpoint_last.pt")
    assert restore_path(Namespace(save_dir=str(tmp_path), restore_file="checkpoint_last.pt")) is None
    assert restore_path(Namespace(save_dir=str(tmp_path), restore_file=str(cut))) == str(cut)
