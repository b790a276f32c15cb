"""Data-parallel training on CPU: two fairseq-train workers in one gloo group.

Each fairseq run is started as one process per worker (``run_workers``), through
``tests/hooked_train.py`` so that every worker dumps its model state at each
checkpoint (fairseq writes checkpoints on rank 0 only). The runs use 600 tokens
a batch on the tiny corpus: 5 batches an epoch, so in the last step one worker
has no batch and fairseq feeds it its dummy batch (loss × 0).

Between them the two runs put every norm kind at some site:
* synced run (``--bn-sync-stats``), Post-Norm: batch, power, rms, layer;
* unsynced run, Pre-Norm: batch, power, layer_simple, detach, adanorm, scale, identity.
"""
import math
import os
import re
import tempfile

import pytest
import torch

from conftest import BIN, HOOKED_TRAIN, free_port, kill_group, run_cli, run_workers, start_process, train_args

from normplug.norms.power import PowerNorm

MOMENTUM = 0.05  # --bn-momentum default
BN_BUFFERS = ("running_mean", "running_var", "num_batches_tracked")
PN_BUFFERS = ("running_psi2", "nu", "num_updates")

SYNC_SITES = [
    "--encoder-self-attn-norm", "batch", "--encoder-ffn-norm", "power",
    "--decoder-self-attn-norm", "rms", "--decoder-cross-attn-norm", "layer",
    "--decoder-ffn-norm", "batch",
]
NOSYNC_SITES = [
    "--encoder-normalize-before", "--decoder-normalize-before",
    "--encoder-self-attn-norm", "batch", "--encoder-ffn-norm", "power",
    "--encoder-final-norm", "layer_simple", "--decoder-self-attn-norm", "detach",
    "--decoder-cross-attn-norm", "adanorm", "--decoder-ffn-norm", "scale",
    "--decoder-final-norm", "identity",
]
BN_LAYERS = {"enc0.self_attn": "encoder.layers.0.self_attn_layer_norm"}  # in both runs
SYNC_BN_LAYERS = dict(BN_LAYERS, **{"dec0.ffn": "decoder.layers.0.final_layer_norm"})


def _distributed_run(data, save, dump, sites, *extra, workers=2, **launch):
    """Train on ``workers`` processes (``launch``: run_workers's launch and ddp_backend)."""
    args = train_args(
        data, save, "norm_transformer", *sites, *extra,
        "--criterion", "label_smoothed_cross_entropy_rbn",
        "--rbn-mean-weight", "1", "--rbn-var-weight", "0.1", "--power-warmup", "2",
        "--max-tokens", "600", "--max-epoch", "1", "--save-interval-updates", "1",
        updates=100,
    )
    results = run_workers([args] * workers, tool=HOOKED_TRAIN, env={"HOOK_DUMP_DIR": str(dump)},
                          timeout=240, **launch)
    for rank, (rc, out, err) in enumerate(results):
        assert rc == 0, f"rank {rank} exited {rc}\n{out[-3000:]}\n{err[-3000:]}"
        assert "Traceback" not in err, err[-3000:]
    return results


def _dumps(folder):
    out = {}
    for name in os.listdir(folder):
        m = re.fullmatch(r"rank(\d)_update(\d+)\.pt", name)
        if m:
            out[int(m.group(1)), int(m.group(2))] = torch.load(os.path.join(folder, name),
                                                               weights_only=False)
    return out


def _inner_logs(text):
    """num_updates -> {key: float} of every train_inner line."""
    logs = {}
    for line in text.splitlines():
        if "| train_inner |" not in line:
            continue
        fields = dict(re.findall(r"([\w/.]+)=([-+0-9.einfa]+)", line))
        logs[int(fields["num_updates"])] = {k: float(v) for k, v in fields.items()}
    return logs


def _step1_terms(model, layers):
    """RBN/TID terms of update 1, recovered from the running statistics after it.

    Running statistics start at μ̂ = 0, σ̂² = 1, so after one step
    μ̂₁ = ρ μ_B and σ̂²₁ = (1 − ρ) + ρ σ²_B: the batch statistics follow exactly.
    """
    rho = MOMENTUM
    total_mean = total_var = 0.0
    tids = {}
    for short, prefix in layers.items():
        mu_hat = model[f"{prefix}.running_mean"].double()
        var_hat = model[f"{prefix}.running_var"].double()
        mu_b = mu_hat / rho
        var_b = (var_hat - (1 - rho)) / rho
        total_mean += float(((mu_hat - mu_b) ** 2).sum())
        total_var += float((var_hat - var_b).abs().sum())
        sigma_b = var_b.sqrt()
        tids[f"tid_mean/{short}"] = float(((mu_hat - mu_b).abs() / sigma_b).mean())
        tids[f"tid_var/{short}"] = float((var_hat.sqrt() / sigma_b - 1).abs().mean())
    return total_mean, total_var, tids


def _close(logged, expected):
    # fairseq prints these rounded to 4 decimals
    return math.isclose(logged, expected, rel_tol=2e-3, abs_tol=1.5e-4)


def _split(state):
    params = {k: v for k, v in state.items() if not k.endswith(BN_BUFFERS + PN_BUFFERS)}
    buffers = {k: v for k, v in state.items() if k.endswith(BN_BUFFERS + PN_BUFFERS)}
    return params, buffers


def _check_common(results, dumps, save):
    updates = sorted({u for _, u in dumps})
    assert updates == [1, 2, 3]
    # the epoch's 5 batches: 3 on one worker, 2 + fairseq's dummy batch on the other
    dummies = sorted(dumps[r, 3]["dummy_train_batches"] for r in range(2))
    assert dummies == [0, 1]
    # the parameters are those of one model on every worker, at every update
    for u in updates:
        p0, _ = _split(dumps[0, u]["model"])
        p1, _ = _split(dumps[1, u]["model"])
        assert p0.keys() == p1.keys()
        for k in p0:
            assert torch.equal(p0[k], p1[k]), (u, k)
    # fairseq saves rank 0's model
    saved = torch.load(save / "checkpoint_last.pt", weights_only=False)["model"]
    for k, v in dumps[0, 3]["model"].items():
        assert torch.equal(saved[k], v), k
    logs = _inner_logs(results[0][1] + results[0][2])
    assert sorted(logs) == [1, 2, 3]
    for u, fields in logs.items():
        for key in ("loss", "task_loss", "rbn_penalty", "rbn_mean", "rbn_var", "tid_mean",
                    "tid_var", "tid_mean/enc0.self_attn", "tid_var/enc0.ffn"):
            assert key in fields and math.isfinite(fields[key]), (u, key, fields)
        assert fields["rbn_penalty"] > 0
    return logs


def _synced_run(data, folder, **launch):
    """(results, dumps, save folder) of the two-worker --bn-sync-stats run."""
    save, dump = folder / "ck", folder / "dump"
    dump.mkdir()
    results = _distributed_run(data, save, dump, SYNC_SITES, "--bn-sync-stats", **launch)
    return results, _dumps(dump), save


@pytest.fixture(scope="module")
def synced_env_run(tiny_data, tmp_path_factory):
    """The one-host run the other launches must reproduce: two workers, env://, legacy_ddp."""
    return _synced_run(tiny_data, tmp_path_factory.mktemp("synced_env"))


@pytest.mark.slow
def test_two_workers_with_synced_statistics(synced_env_run):
    results, dumps, save = synced_env_run
    logs = _check_common(results, dumps, save)

    # --bn-sync-stats: batch and power norms keep identical statistics on both workers,
    # at every update, the dummy-batch step included
    for u in (1, 2, 3):
        _, b0 = _split(dumps[0, u]["model"])
        _, b1 = _split(dumps[1, u]["model"])
        assert len(b0) == 2 * len(BN_BUFFERS) + len(PN_BUFFERS)
        for k in b0:
            assert torch.equal(b0[k], b1[k]), (u, k)
    final = dumps[0, 3]["model"]
    assert int(final["encoder.layers.0.self_attn_layer_norm.num_batches_tracked"]) == 3
    assert int(final["encoder.layers.0.final_layer_norm.num_updates"]) == 2  # set before the third step
    assert float(final["encoder.layers.0.final_layer_norm.nu"].abs().sum()) > 0

    # the logged RBN terms and TIDs of update 1 are those of the union batch statistics
    rbn_mean, rbn_var, tids = _step1_terms(dumps[0, 1]["model"], SYNC_BN_LAYERS)
    first = logs[1]
    assert _close(first["rbn_mean"], rbn_mean), (first["rbn_mean"], rbn_mean)
    assert _close(first["rbn_var"], rbn_var), (first["rbn_var"], rbn_var)
    for key, value in tids.items():
        assert _close(first[key], value), (key, first[key], value)


@pytest.mark.slow
def test_two_workers_without_sync_keep_their_own_statistics(tiny_data, tmp_path):
    save, dump = tmp_path / "ck", tmp_path / "dump"
    dump.mkdir()
    results = _distributed_run(tiny_data, save, dump, NOSYNC_SITES)
    dumps = _dumps(dump)
    logs = _check_common(results, dumps, save)

    # each worker's running statistics follow its own batches; rank 0's are saved
    _, b0 = _split(dumps[0, 3]["model"])
    _, b1 = _split(dumps[1, 3]["model"])
    for k in ("encoder.layers.0.self_attn_layer_norm.running_mean",
              "encoder.layers.0.self_attn_layer_norm.running_var",
              "encoder.layers.0.final_layer_norm.running_psi2",
              "encoder.layers.0.final_layer_norm.nu"):
        assert not torch.equal(b0[k], b1[k]), k
    for k in ("encoder.layers.0.self_attn_layer_norm.num_batches_tracked",
              "encoder.layers.0.final_layer_norm.num_updates"):
        assert torch.equal(b0[k], b1[k]), k  # the dummy batch counts as a step

    # the logged terms of update 1 are the mean of the two workers' own terms
    per_rank = [_step1_terms(dumps[r, 1]["model"], BN_LAYERS) for r in range(2)]
    first = logs[1]
    assert _close(first["rbn_mean"], (per_rank[0][0] + per_rank[1][0]) / 2)
    assert _close(first["rbn_var"], (per_rank[0][1] + per_rank[1][1]) / 2)
    for key in per_rank[0][2]:
        assert _close(first[key], (per_rank[0][2][key] + per_rank[1][2][key]) / 2), key


# --------------------------------------------------------------------------- other launches
# fairseq's other ways to form the group, on 127.0.0.1: each must be the env:// run above, or,
# at another world size, keep one model and one set of BN statistics on every rank.
def _same_on_every_rank(dumps):
    for (rank, update), dump in dumps.items():
        for k, v in dumps[0, update]["model"].items():
            assert torch.equal(dump["model"][k], v), (rank, update, k)


def _tcp_launch(rank, world, port):
    return ["--distributed-init-method", f"tcp://127.0.0.1:{port}", "--distributed-rank", str(rank)], {}


@pytest.mark.slow
def test_tcp_init_with_explicit_ranks_is_the_env_run(synced_env_run, tiny_data, tmp_path):
    results, dumps, _ = _synced_run(tiny_data, tmp_path, launch=_tcp_launch)
    log = results[1][1] + results[1][2]
    assert "distributed init (rank 1): tcp://127.0.0.1:" in log, log[-2000:]
    _, reference, _ = synced_env_run
    assert dumps.keys() == reference.keys()
    for key, dump in dumps.items():
        for k, v in reference[key]["model"].items():
            assert torch.equal(dump["model"][k], v), (key, k)


def _slurm_launch(scontrol_dir, nodes):
    """srun's variables for ``nodes`` nodes of world // nodes tasks, a fake ``scontrol`` first on
    PATH; fairseq forms a tcp:// group on the first host scontrol names, at --distributed-port."""
    def launch(rank, world, port):
        per_node = world // nodes
        return ["--distributed-port", str(port)], {
            "PATH": f"{scontrol_dir}{os.pathsep}{os.environ['PATH']}",
            "SLURM_STEP_NODELIST": f"node[0-{nodes - 1}]", "SLURM_NNODES": str(nodes),
            "SLURM_NTASKS": str(world), "SLURM_STEP_NUM_TASKS": str(world),
            "SLURM_NTASKS_PER_NODE": str(per_node), "SLURM_NODEID": str(rank // per_node),
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": "0",  # fairseq makes it the CUDA device; a CPU has none to pick
        }
    return launch


def _fake_scontrol(folder):
    script = folder / "scontrol"
    script.write_text('#!/bin/sh\n[ "$1 $2" = "show hostnames" ] && echo 127.0.0.1 && echo 127.0.0.2\n')
    script.chmod(0o755)
    return folder


@pytest.mark.slow
def test_slurm_two_nodes_of_two_tasks(tiny_data, tmp_path):
    launch = _slurm_launch(_fake_scontrol(tmp_path), nodes=2)
    results, dumps, _ = _synced_run(tiny_data, tmp_path, workers=4, launch=launch)
    for rank, (_, out, err) in enumerate(results):
        assert f"distributed init (rank {rank}): tcp://127.0.0.1:" in out + err, (out + err)[-2000:]
    # 5 batches on 4 workers: update 2 is one batch and three dummy batches
    assert sorted({u for _, u in dumps}) == [1, 2]
    _same_on_every_rank(dumps)
    # the logged RBN terms and TIDs of update 1 are those of the four workers' union batch
    rbn_mean, rbn_var, tids = _step1_terms(dumps[0, 1]["model"], SYNC_BN_LAYERS)
    first = _inner_logs(results[0][1] + results[0][2])[1]
    assert _close(first["rbn_mean"], rbn_mean), (first["rbn_mean"], rbn_mean)
    assert _close(first["rbn_var"], rbn_var), (first["rbn_var"], rbn_var)
    for key, value in tids.items():
        assert _close(first[key], value), (key, first[key], value)


# --------------------------------------------------------------------------- the launch guard
GUARD = "--bn-sync-stats would sync nothing: "


@pytest.mark.slow
def test_torchrun_without_world_size_is_refused_on_every_node(tiny_data, tmp_path):
    # the silent case: fairseq's world size stays 1 (no GPU), each node would train alone
    args = train_args(tiny_data, tmp_path / "ck", "transformer_iwslt_de_en_bn", "--bn-sync-stats",
                      updates=1)
    port = free_port()
    procs = [start_process([BIN / "torchrun", "--nnodes", 2, "--nproc-per-node", 1, "--node-rank", node,
                            "--master-addr", "127.0.0.1", "--master-port", port, BIN / "fairseq-train", *args])
             for node in range(2)]
    try:
        outputs = [proc.communicate(timeout=120) for proc in procs]
    finally:
        for proc in procs:
            kill_group(proc)
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode != 0
        assert (f"{GUARD}torchrun started 2 processes (WORLD_SIZE=2) but fairseq started no process group: "
                "each would train alone on the whole corpus; add --distributed-world-size 2") in err, err[-3000:]
    assert not (tmp_path / "ck" / "checkpoint_last.pt").exists()


@pytest.mark.slow
def test_srun_without_world_size_is_refused_and_warned_without_sync(tiny_data, tmp_path):
    env = {"SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "4", "SLURM_PROCID": "0"}
    args = train_args(tiny_data, tmp_path / "ck", "transformer_iwslt_de_en_bn", updates=1)
    refused = run_cli("fairseq-train", *args, "--bn-sync-stats", env=env, check=False, timeout=120)
    assert refused.returncode != 0
    assert (f"{GUARD}srun started 4 processes (SLURM_STEP_NUM_TASKS=4) but fairseq started no process "
            "group") in refused.stderr.splitlines()[-1], refused.stderr[-3000:]
    warned = run_cli("fairseq-train", *args, env=env, timeout=120)
    lines = [x for x in (warned.stdout + warned.stderr).splitlines()
             if "srun started 4 processes (SLURM_STEP_NUM_TASKS=4)" in x]
    assert len(lines) == 1 and "WARNING" in lines[0], lines
    # a batch script's SLURM_NTASKS is the allocation's: a lone fairseq-train in it is not refused
    alone = run_cli("fairseq-train", *args, "--bn-sync-stats", env={"SLURM_NTASKS": "4"}, timeout=120)
    assert "would train alone" not in alone.stdout + alone.stderr


# --------------------------------------------------------------------------- PowerNorm sync
C, GROUPS, WARMUP, STEPS = 6, 2, 2, 4


def _pn_data():
    """Per scenario, per step, per rank: (x, pad, upstream grad); float64.

    The ranks' batches differ in length and size; in scenario 1, rank 1 has no
    real token at all (it must still take part in every all-reduce)."""
    g = torch.Generator().manual_seed(3)
    scenarios = []
    for scenario in range(2):
        steps = []
        for _ in range(STEPS):
            ranks = []
            for rank in range(2):
                T, B = 5 - 2 * rank, 3 + rank
                x = torch.randn(T, B, C, generator=g, dtype=torch.float64) * (1 + rank) + rank
                pad = torch.rand(B, T, generator=g) < 0.3
                pad[0, 0] = False
                if scenario == 1 and rank == 1:
                    pad[:] = True
                gy = torch.randn(T, B, C, generator=g, dtype=torch.float64)
                ranks.append((x, pad, gy))
            steps.append(ranks)
        scenarios.append(steps)
    return scenarios


def _make_pn(sync):
    torch.manual_seed(0)
    pn = PowerNorm(C, groups=GROUPS, warmup_updates=WARMUP, sync_stats=sync).double()
    with torch.no_grad():  # non-trivial affine parameters
        pn.weight.copy_(torch.linspace(0.5, 1.5, C, dtype=torch.float64))
        pn.bias.copy_(torch.linspace(-0.2, 0.3, C, dtype=torch.float64))
    return pn.train()


def _pn_step(pn, x, pad, gy, step):
    pn.set_num_updates(step)
    pn.zero_grad()
    x = x.clone().requires_grad_(True)
    y = pn(x, pad)
    y.backward(gy)
    return y.detach(), x.grad, pn.weight.grad.clone(), pn.bias.grad.clone()


def _pn_worker(rank, port, folder):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    try:
        out = []
        for steps in _pn_data():
            pn = _make_pn(sync=True)
            per_step = []
            for step, ranks in enumerate(steps):
                x, pad, gy = ranks[rank]
                per_step.append(_pn_step(pn, x, pad, gy, step))
            out.append({"steps": per_step, "state": {k: v.clone() for k, v in pn.state_dict().items()}})
        torch.save(out, os.path.join(folder, f"rank{rank}.pt"))
    finally:
        torch.distributed.destroy_process_group()


def _union(ranks):
    """Both ranks' batches as one T×(B0+B1) batch (the shorter one padded in time)."""
    T = max(x.shape[0] for x, _, _ in ranks)
    xs, pads, gys = [], [], []
    for x, pad, gy in ranks:
        extra = T - x.shape[0]
        xs.append(torch.cat([x, x.new_zeros(extra, x.shape[1], C)]))
        gys.append(torch.cat([gy, gy.new_zeros(extra, gy.shape[1], C)]))
        pads.append(torch.cat([pad, pad.new_ones(pad.shape[0], extra)], dim=1))
    return torch.cat(xs, 1), torch.cat(pads, 0), torch.cat(gys, 1)


def test_powernorm_sync_matches_one_process_on_the_union_batch():
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as folder:
        # forked workers share this process's imports: spawned ones paid ~3.5 s CPU each
        mp.start_processes(_pn_worker, args=(free_port(), folder), nprocs=2, join=True, start_method="fork")
        res = [torch.load(os.path.join(folder, f"rank{r}.pt"), weights_only=False) for r in range(2)]

    for s, steps in enumerate(_pn_data()):
        ref = _make_pn(sync=False)  # one process, both workers' tokens as one batch
        for step, ranks in enumerate(steps):
            x, pad, gy = _union(ranks)
            y, dx, dw, db = _pn_step(ref, x, pad, gy, step)
            b0 = 0
            for r, (xr, _, _) in enumerate(ranks):
                T, B = xr.shape[:2]
                ry, rdx, _, _ = res[r][s]["steps"][step]
                torch.testing.assert_close(ry, y[:T, b0:b0 + B], rtol=1e-10, atol=1e-12)
                torch.testing.assert_close(rdx, dx[:T, b0:b0 + B], rtol=1e-10, atol=1e-12)
                b0 += B
            # the parameter gradients add up over workers (what DDP all-reduces)
            torch.testing.assert_close(res[0][s]["steps"][step][2] + res[1][s]["steps"][step][2],
                                       dw, rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(res[0][s]["steps"][step][3] + res[1][s]["steps"][step][3],
                                       db, rtol=1e-10, atol=1e-12)
        # ψ², ν and the warm-up counter: bitwise equal on both workers, and the union's
        for k, v in ref.state_dict().items():
            assert torch.equal(res[0][s]["state"][k], res[1][s]["state"][k]), k
            torch.testing.assert_close(res[0][s]["state"][k], v, rtol=1e-10, atol=1e-12)
        assert float(ref.nu.abs().sum()) > 0


def test_powernorm_sync_option_and_single_process_fallback():
    # without a process group, sync_stats is the plain single-worker PowerNorm
    torch.manual_seed(1)
    x = torch.randn(4, 3, C, dtype=torch.float64)
    pad = torch.zeros(3, 4, dtype=torch.bool)
    pad[2, 1:] = True
    gy = torch.randn(4, 3, C, dtype=torch.float64)
    a, b = _make_pn(sync=True), _make_pn(sync=False)
    for step in range(3):
        ra, rb = _pn_step(a, x, pad, gy, step), _pn_step(b, x, pad, gy, step)
        for ta, tb in zip(ra, rb):
            assert torch.equal(ta, tb)
    assert "sync_stats=True" in repr(a)
    from normplug.norms import NormConfigError, create_norm

    with pytest.raises(NormConfigError, match="sync_stats"):
        create_norm("power", 4, sync_stats="yes")
    # --bn-sync-stats reaches power norms through the plan
    from argparse import Namespace

    from normplug.models.norm_plan import NormPlan

    plan = NormPlan.from_config(Namespace(encoder_norm="power", decoder_norm="batch", bn_sync_stats=True,
                                          encoder_attention_heads=2, decoder_attention_heads=2))
    assert plan.build("encoder", "self_attn", 8).sync_stats is True
    assert plan.build("decoder", "ffn", 8).sync_stats is True
