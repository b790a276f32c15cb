"""The driver over several nodes, on loopback: `normplug-recipe train --nodes 2 --node-rank R --master-addr HOST` run
once a "node" (one gloo process each on a machine without a GPU), each with its own --out, is the one-host two-worker
run of the same fairseq-train arguments; only node 0 keeps a record and checkpoints; a relaunch of the same commands
reuses or resumes on every node (none waits for a node 0 with nothing to train)."""
import json
import subprocess
import sys
import time

import pytest
import torch

from conftest import HOOKED_TRAIN, free_port, kill_group, run_workers, start_process
from test_recipes import GOOD

from normplug import recipes
from normplug.recipes import Launch, load_config

pytestmark = pytest.mark.slow
STEPS = ["--max-update", "3", "--bn-sync-stats"]


def _drivers(config, tiny_data, outs, port, timeout=180):
    """Both nodes' drivers at once; [(returncode, stdout + stderr)] by node rank."""
    procs = [start_process([sys.executable, "-m", "normplug.recipes", "train", str(config), "--data", str(tiny_data),
                            "--out", str(out), "--nodes", "2", "--node-rank", str(rank), "--master-addr", "127.0.0.1",
                            "--master-port", str(port), "--", *STEPS],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for rank, out in enumerate(outs)]
    deadline, said = time.monotonic() + timeout, []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=max(deadline - time.monotonic(), 0.1))
            said.append((proc.returncode, out))
    except subprocess.TimeoutExpired:
        pytest.fail("a node's driver hung")
    finally:
        for proc in procs:
            if proc.poll() is None:
                kill_group(proc)
    return said


def test_two_nodes_through_the_driver(tiny_data, tmp_path):
    config = tmp_path / "demo.yaml"
    config.write_text(GOOD)
    outs = [tmp_path / "node0", tmp_path / "node1"]  # separate disks
    port = free_port()
    for rc, out in _drivers(config, tiny_data, outs, port):
        assert rc == 0, out[-3000:]
    run0, run1 = (out / "demo-bn" for out in outs)
    record = json.loads((run0 / recipes.RUN_RECORD).read_text())
    assert not (run1 / recipes.RUN_RECORD).exists() and not list(run1.glob("checkpoint*.pt"))
    # the effective batch kept: 2 processes do not divide update-freq 1, so max-tokens 2048 -> 1024 each
    assert record["extra"] == ["--distributed-world-size", "2", "--update-freq", "1", "--max-tokens", "1024", *STEPS]
    assert not {"distributed-rank", "distributed-init-method", "distributed-backend"} & set(record["flags"])

    # the one-host two-worker run of the same fairseq-train arguments, every rank's state dumped
    recipe = recipes.with_training_arguments(load_config(config, tiny_data), record["extra"])
    dump, save = tmp_path / "dump", tmp_path / "reference"
    dump.mkdir()
    argv = recipes.train_argv(recipe, save, gpu=False, exe=False)
    for rc, out, err in run_workers([argv] * 2, tool=HOOKED_TRAIN, env={"HOOK_DUMP_DIR": str(dump)}):
        assert rc == 0, err[-3000:]
    ours = torch.load(run0 / "checkpoint_last.pt", map_location="cpu", weights_only=False)["model"]
    for rank in (0, 1):
        theirs = torch.load(dump / f"rank{rank}_update3.pt", map_location="cpu", weights_only=False)["model"]
        assert ours.keys() == theirs.keys()
        for key in ours:  # parameters and every BN running statistic, bitwise
            assert torch.equal(ours[key], theirs[key]), (rank, key)
    assert any(key.endswith("running_var") for key in ours)

    # the same commands again: node 0 reuses its finished run, node 1 learns so and does not wait
    said = _drivers(config, tiny_data, outs, port)
    assert said[0][0] == said[1][0] == 0
    assert "reusing the finished run" in said[0][1] and "reusing the finished run" in said[1][1]
    # a run stopped after its last checkpoint: node 0 resumes it, node 1 (no checkpoint of its own) joins
    (run0 / recipes.RUN_RECORD).write_text(json.dumps({**record, "rc": None, "interrupted": True}))
    said = _drivers(config, tiny_data, outs, port)
    assert said[0][0] == said[1][0] == 0, said[1][1][-3000:]
    assert "node 1: node 0 resumes its checkpoint_last.pt" in said[1][1]
    assert "Loaded checkpoint" in (run0 / "train.log").read_text().rpartition("fairseq_cli.train | ")[0]
    assert json.loads((run0 / recipes.RUN_RECORD).read_text())["rc"] == 0


def test_a_node_launch_is_checked_before_anything_starts(tmp_path, capsys, monkeypatch):
    config = tmp_path / "demo.yaml"
    config.write_text(GOOD)
    for args, said in ((["--nodes", "2", "--node-rank", "0"], "--nodes 2 needs --master-addr HOST"),
                       (["--nodes", "2", "--node-rank", "2", "--master-addr", "h"], "--node-rank 2: give 0 .. 1 for"
                                                                                    " --nodes 2")):
        assert recipes.main(["train", str(config), "--out", str(tmp_path / "o"), *args]) == 2
        assert said in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "4")  # the driver itself started by torchrun: each would train alone
    assert recipes.main(["train", str(config), "--out", str(tmp_path / "o")]) == 2
    assert "normplug-recipe was started as one of 4 processes by torchrun: each would train alone" in \
        capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_the_effective_batch_over_nodes(tmp_path):
    """update-freq divided by the processes where it divides; else update-freq 1 and max-tokens scaled; else
    refused."""
    config = tmp_path / "c.yaml"
    config.write_text(GOOD.replace("  max-tokens: 2048\n", "  max-tokens: 4096\n  update-freq: 8\n"))
    r = load_config(config)
    assert Launch(8, 1).batch_flags(r) == ["--distributed-world-size", "8", "--update-freq", "1"]
    assert Launch(4, 2, 1, "h").batch_flags(r) == ["--distributed-world-size", "8", "--update-freq", "1"]
    assert Launch(8, 2, 1, "h").batch_flags(r) == ["--distributed-world-size", "16", "--update-freq", "1",
                                                   "--max-tokens", "2048"]
    assert "4096 x 8 tokens" in Launch(8, 4, 0, "h").batch_note(r)
    with pytest.raises(recipes.ConfigError, match="3 processes divide neither the update-freq 8"):
        Launch(3).batch_flags(r)
    # what the dry run prints for node 1: torchrun, and the srun line beside it
    lines = recipes.train_commands(recipes.with_training_arguments(r, Launch(8, 2, 1, "node0").batch_flags(r)),
                                   tmp_path / "run", Launch(8, 2, 1, "node0"))
    assert lines[0].startswith("torchrun --nnodes 2 --nproc-per-node 8 --node-rank 1 --master-addr node0 "
                               "--master-port 29500 fairseq-train ")
    assert lines[2].startswith("srun --nodes 2 --ntasks-per-node 1 --gpus-per-node 8 fairseq-train ")
    assert lines[2].endswith("--distributed-port 29500") and "--distributed-world-size 16" in lines[2]


def test_the_paper_scripts_take_the_node_options_and_fairseq_arguments(tmp_path):
    """scripts/wmt16.sh --nodes=2 --node-rank=1 --master-addr=HOST --gpus=8 ROW -- --bn-sync-stats: the driver's
    torchrun line for node 1 with the synced statistics; a node option that is not a number: the script's line."""
    from conftest import REPO
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(REPO / "scripts" / "wmt16.sh"), "--dry-run", "--nodes=2", "--node-rank=1",
                           "--master-addr=node0", "--gpus=8", "post-rbn", "--", "--bn-sync-stats"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    torchrun = next(line for line in proc.stdout.splitlines() if line.startswith("torchrun "))
    assert torchrun.startswith("torchrun --nnodes 2 --nproc-per-node 8 --node-rank 1 --master-addr node0 ")
    assert "--bn-sync-stats" in torchrun and "--distributed-world-size 16" in torchrun
    assert "--update-freq 1 --max-tokens 2048 keeps the effective batch of 4096 x 8 tokens" in proc.stdout
    proc = subprocess.run(["bash", str(REPO / "scripts" / "wmt16.sh"), "--nodes=two"], capture_output=True,
                          text=True, env=env, timeout=60)
    assert (proc.returncode, proc.stderr) == (2, "scripts/wmt16.sh: --nodes must be a whole number, got 'two'\n")


def test_the_state_a_resume_broadcasts_loads_weights_only(tmp_path, tiny_data):
    """What rank 0 broadcasts to the others when a run of several processes resumes (fairseq's broadcast_object:
    the checkpoint as load_checkpoint_to_cpu returns it, pickled, then torch.load-ed weights-only) needs exactly
    the allow-listed types."""
    from fairseq import checkpoint_utils
    from fairseq.distributed.utils import _split_tensors_from_obj

    from conftest import run_cli
    from normplug.checkpoints import SAFE_GLOBALS, broadcast_globals
    config = tmp_path / "demo.yaml"
    config.write_text(GOOD)
    recipe = recipes.with_training_arguments(load_config(config, tiny_data), ["--max-update", "1"])
    run_cli("fairseq-train", *recipes.train_argv(recipe, tmp_path / "run", gpu=False, exe=False))
    state = checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "run" / "checkpoint_last.pt"))
    torch.save(_split_tensors_from_obj(state, []), tmp_path / "broadcast.pt")  # as broadcast_object sends it
    allowed = torch.serialization.get_safe_globals()
    torch.serialization.clear_safe_globals()  # the plugin's import allow-listed them: ask torch afresh
    try:
        needed = set(torch.serialization.get_unsafe_globals_in_checkpoint(str(tmp_path / "broadcast.pt")))
    finally:
        torch.serialization.add_safe_globals(allowed)
    assert needed == {f"{t.__module__}.{getattr(t, '__qualname__', getattr(t, '_name', ''))}"
                      for t in SAFE_GLOBALS + broadcast_globals()} - {"argparse.Namespace"}
