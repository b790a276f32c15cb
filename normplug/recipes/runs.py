"""A recipe's runs: training and evaluating it in a run folder, each leaving a record of what it ran on (the run
record, the scores)."""
import datetime
import json
import re
import time
from pathlib import Path
from typing import Callable, List, Optional, Tuple

from .commands import (check_flags, child_env, command_line, eval_lm_argv, generate_argv, run_logged, train_argv,
                       use_gpu, write_atomic)
from .launch import Launch, agree_with_node0
from .config import CHECKPOINT_CHOICES, ConfigError, Recipe
from .records import RUN_RECORD, check_record, config_changes, direction, prior_run, read_json
from .scoring import measure_tid, score_language_model, score_translation


def epoch_progress(name: str, log_path: Path, log=print) -> Callable[[str], None]:
    """An echo for fairseq-train's output: one line an epoch (updates, loss, valid loss, the log's path)."""
    valid = {}

    def echo(line: str):
        m = re.search(r"\| valid on '[^']*' subset \| loss ([\d.]+)", line)
        if m:
            valid["loss"] = m[1]
        m = re.search(r"\| train \| epoch (\d+) \| loss ([\d.]+) .*\| num_updates (\d+)", line)
        if m:
            log(f"== {name}: epoch {int(m[1])}: {m[3]} updates, loss {m[2]}, valid loss {valid.pop('loss', '—')} "
                f"(log: {log_path})")
    return echo


def train(recipe: Recipe, save_dir: Path, gpu: Optional[bool] = None, threads: Optional[int] = None,
          echo=lambda line: print(line, end="", flush=True), log=print, launch: Launch = Launch()) -> int:
    """fairseq-train into ``save_dir`` (train.log, run record), or nothing when a run there finished with the
    same flags on the same data; ``launch``: this node's part of a run over several. Returns fairseq-train's exit
    status; ^C leaves a record a relaunch resumes."""
    save_dir, gpu = Path(save_dir), use_gpu(gpu)
    run, identity, flags = prior_run(recipe, save_dir)
    argv = launch.command(train_argv(recipe, save_dir, gpu=gpu), gpu)
    check_flags(recipe, argv[argv.index(str(recipe.data_path)):], processes_here=launch.gpus if gpu else None)
    finished = bool(run and run.get("rc") == 0 and not run.get("error"))
    if launch.nodes > 1:
        finished = agree_with_node0(launch, save_dir, finished, log)
    if finished:
        # relaunched, fairseq-train would train one more update, or resume a patience-stopped run
        log(f"== {recipe.name}: reusing the finished run in {save_dir}" + " (node 0's)" * (not launch.writes_record))
        return 0
    save_dir.mkdir(parents=True, exist_ok=True)
    if not launch.writes_record:  # node 0 keeps the record and the checkpoints
        log(f"$ {command_line(argv)}")
        return run_logged(argv, save_dir / "train.log", echo, child_env(threads), "a")[0]
    record, t0 = {"config": str(recipe.path), "flags": flags, "extra": list(recipe.train_extra), "seed": recipe.seed,
                  "source_lang": recipe.source_lang, "target_lang": recipe.target_lang, **identity, "rc": None,
                  "device": "cpu" if "--cpu" in argv else "gpu"}, time.time()

    def save(**outcome):
        record.update(outcome, seconds=round(time.time() - t0, 1))
        write_atomic(save_dir / RUN_RECORD, json.dumps(record, indent=2) + "\n")
    save()
    log("$ " + command_line(argv))
    try:
        rc = run_logged(argv, save_dir / "train.log", echo, child_env(threads), "a")[0]  # a relaunch goes on
    except KeyboardInterrupt:
        save(interrupted=True)
        then = "resumes it from checkpoint_last.pt" if (save_dir / "checkpoint_last.pt").exists() else "starts it again"
        raise KeyboardInterrupt(f"fairseq-train stopped; the same command {then} ({save_dir})") from None
    if rc == 0 and not any(save_dir.glob("checkpoint*.pt")):  # trained nothing, or saved nothing: not done
        save(rc=rc, error="fairseq-train exited 0 without writing a checkpoint")
        raise RuntimeError(f"fairseq-train exited 0 without writing a checkpoint in {save_dir}: recorded as "
                           f"failed (see {save_dir / 'train.log'})")
    save(rc=rc)
    return rc


def describe_choice(recipe: Recipe) -> str:
    """Which checkpoint a config evaluates, in words (results table)."""
    if recipe.evaluate["checkpoint"]:
        return f"checkpoint_{recipe.evaluate['checkpoint']}.pt"
    return "average of the last {1} {0} checkpoints".format(*averaging(recipe))


def averaging(recipe: Recipe) -> Tuple[str, int]:
    """(epoch or update, how many) of the checkpoints a config averages."""
    epochs, updates = recipe.evaluate["average_last_epochs"], recipe.evaluate["average_last_updates"]
    return ("epoch", epochs) if epochs else ("update", updates)


def averaged_path(ckdir: Path, kind: str, n: int) -> Path:  # the average of the last n checkpoints
    return ckdir / (f"averaged_last{n}" + ("_updates" if kind == "update" else "") + ".pt")


def choose_checkpoint(recipe: Recipe, ckdir: Path, log=print) -> Tuple[Path, List[Path]]:
    """checkpoint_best/last.pt, or the average of the last N epoch/update checkpoints: (path, [inputs])."""
    import torch

    from normplug.tools.average import average
    from normplug.tools.common import atomic_path, numbered_checkpoints
    ev, train_first = recipe.evaluate, f"train first (normplug-recipe train {recipe.path})"
    if ev["checkpoint"]:
        path = ckdir / f"checkpoint_{ev['checkpoint']}.pt"
        if not path.exists():
            raise ConfigError(f"no {path.name} in {ckdir}: {train_first}")
        return path, [path]
    kind, n = averaging(recipe)
    found = [Path(p) for p in numbered_checkpoints(str(ckdir), kind)] if ckdir.is_dir() else []
    chosen = found[-n:] or [p for p in [ckdir / "checkpoint_last.pt"] if p.exists()]  # a shortened run's
    if not chosen:
        raise ConfigError(f"no {kind} checkpoints in {ckdir}: {train_first}")
    if len(chosen) < n:
        log(f"{ckdir} holds {len(found)} of the {n} {kind} checkpoints the config averages: using "
            f"{', '.join(p.name for p in chosen)}")
    if len(chosen) == 1:
        return chosen[0], chosen
    out = averaged_path(ckdir, kind, len(chosen))
    stamp, wanted = out.with_suffix(".inputs"), "\n".join(f"{p.name} {p.stat().st_mtime_ns}" for p in chosen)
    if out.exists() and stamp.exists() and stamp.read_text() == wanted:
        log(f"reusing {out} (average of {', '.join(p.name for p in chosen)})")
        return out, chosen
    with atomic_path(str(out)) as tmp:  # normplug-average, in process
        torch.save(average([str(p) for p in chosen]), tmp)
    stamp.write_text(wanted)
    log(f"averaged {', '.join(p.name for p in chosen)} -> {out}")
    return out, chosen


def train_commands(recipe: Recipe, save_dir, launch: Launch = Launch()) -> List[str]:
    """What :func:`train` runs on this node of a GPU run, as a reader would type it; over several nodes, the same
    run as a SLURM job step after it."""
    argv = ["fairseq-train", *train_argv(recipe, save_dir, gpu=True, exe=False)]
    if launch.nodes == 1:
        return [command_line(argv)]
    return [command_line(launch.command(argv, gpu=True, exe=False)), "# or, the same run as one SLURM job step (every node at "
            "once; fairseq reads its ranks from SLURM):", command_line(launch.srun_line(argv))]


def evaluate_commands(recipe: Recipe, ckdir: Path, checkpoint=None) -> List[str]:
    """What :func:`evaluate` runs on a GPU machine, as a reader would type it: the average of the checkpoints
    the config names (normplug-average), then fairseq-generate, or fairseq-eval-lm without and with context."""
    ckdir, ev, argvs = Path(ckdir), recipe.evaluate, []
    path = Path(checkpoint) if checkpoint else ckdir / f"checkpoint_{ev['checkpoint']}.pt"
    if not checkpoint and not ev["checkpoint"]:
        kind, n = averaging(recipe)
        path = averaged_path(ckdir, kind, n)
        argvs.append(["normplug-average", "--inputs", str(ckdir), f"--num-{kind}-checkpoints", str(n),
                      "--output", str(path)])
    if recipe.task == "translation":
        argvs.append(["fairseq-generate", *generate_argv(recipe, path, gpu=True, exe=False)])
    else:
        argvs += [["fairseq-eval-lm", *eval_lm_argv(recipe, path, context, gpu=True, exe=False)]
                  for context in (0, ev["context_window"])]
    return [command_line(argv) for argv in argvs]


def dry_run_note(launch: Optional[Launch] = None) -> str:
    """The comment line above what --dry-run prints: the GPU run, whatever machine prints it."""
    if launch is None:
        where = "a GPU"
    elif launch.nodes == 1:
        where = f"{launch.gpus} GPU{'s' * (launch.gpus > 1)} (--distributed-world-size {launch.gpus})"
    else:
        where = (f"node {launch.node_rank} of {launch.nodes} nodes x {launch.gpus} GPU{'s' * (launch.gpus > 1)} "
                 f"(--distributed-world-size {launch.world_size}; run it on every node with its --node-rank)")
    return f"# the command lines as the driver runs them on {where}; on a machine without a GPU it adds --cpu"


def scores_path(recipe: Recipe, ckdir: Path, prefix: str = "scores", suffix: str = ".json") -> Path:
    """``scores-<name>.json`` of the test split, ``scores-<name>-<split>.json`` of another: a score of one split
    never stands under another's name. ``prefix``/``suffix``: the other files of an evaluation."""
    split = recipe.evaluate["gen_subset"]
    return Path(ckdir) / f"{prefix}-{recipe.name}{'' if split == 'test' else '-' + split}{suffix}"


def evaluate(recipe: Recipe, ckdir: Path, checkpoint=None, gpu: Optional[bool] = None, log=print) -> dict:
    """Score the config's checkpoint (the recipe as its run was trained: direction, seed, extra arguments) into
    scores-<name>.json beside it, with the split, direction and data it was scored on; TID of BN/PN models."""
    ckdir, t0 = Path(ckdir), time.time()
    out = scores_path(recipe, ckdir)
    identity = check_record(recipe, out, f"{out.name}, scored")[1]
    run = read_json(ckdir / RUN_RECORD)
    if run and not checkpoint:
        changed = config_changes(recipe, run)
        if changed:
            raise ConfigError(f"{ckdir} is stale: trained with other flags than {recipe.path} gives now ({changed}); "
                              "train it again, or name a checkpoint to score with --checkpoint")
        if recipe.task == "translation" and run.get("source_lang") and direction(run) != direction(recipe):
            raise ConfigError(f"{ckdir} holds a model trained {'→'.join(direction(run))}: it cannot be evaluated "
                              f"{'→'.join(direction(recipe))} (leave --source-lang/--target-lang out)")
    path, inputs = (Path(checkpoint), [Path(checkpoint)]) if checkpoint else choose_checkpoint(recipe, ckdir, log)
    scores = {"config": str(recipe.path), "name": recipe.name, "task": recipe.task, "seed": recipe.seed,
              "gen_subset": recipe.evaluate["gen_subset"], "checkpoint": str(path),
              "checkpoint_choice": "given on the command line" if checkpoint else describe_choice(recipe),
              "averaged": [p.name for p in inputs], **identity}
    if recipe.task == "translation":
        scores.update(source_lang=recipe.source_lang, target_lang=recipe.target_lang,
                      **score_translation(recipe, path, ckdir, gpu=gpu, log=log))
    else:
        scores.update(score_language_model(recipe, path, ckdir, gpu=gpu, log=log))
    scores.update(measure_tid(recipe, path, gpu=gpu, log=log))
    scores.update(published=recipe.published, metric=recipe.metric,
                  settings={k: v for k, v in recipe.evaluate.items() if k not in CHECKPOINT_CHOICES},
                  seconds=round(time.time() - t0, 1), date=datetime.datetime.now().isoformat(timespec="seconds"))
    if recipe.published is not None:
        log(f"{recipe.name}: published {recipe.published} ({recipe.metric})")
    write_atomic(out, json.dumps(scores, indent=2) + "\n")
    log(f"wrote {out}")
    return scores
