"""Training and evaluating one recipe, each leaving a record of what it ran on: the save dir's
run record and ``scores-<name>.json`` beside it."""
import datetime
import hashlib
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from .commands import (check_flags, child_env, flag_changes, merged_flags, recipe_changes, run_checked,
                       run_logged, split_extra, train_argv, write_atomic)
from .config import CHECKPOINT_CHOICES, ConfigError, Recipe
from .scoring import SCORING

RUN_RECORD = "normplug-run.json"  # in a save dir: the flags, data, device and exit status of its run


def read_json(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def data_identity(recipe: Recipe, data=None) -> Dict[str, object]:
    """What a run or a score was computed on: the data folder, resolved, and its dictionaries."""
    path = recipe.data_path(data)
    return {"data": str(path), "dictionaries": {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()[:16] for p in sorted(path.glob("dict*.txt"))}}


def check_record(recipe: Recipe, data, record_path: Path, what: str) -> Tuple[Optional[dict], dict]:
    """:func:`check_data`, and a run or score on other data is never reused or overwritten (keys a record
    lacks are not compared). A run record binds only beside a checkpoint: a run that failed or was stopped
    before its first left nothing to keep. Returns (the record, the data's identity)."""
    check_data(recipe, data)
    record, identity = read_json(record_path), data_identity(recipe, data)
    if record_path.name == RUN_RECORD and not any(record_path.parent.glob("checkpoint*.pt")):
        record = None
    if record is None or all(record[k] == v for k, v in identity.items() if k in record):
        return record, identity
    raise ConfigError(f"{record_path.parent} holds {what} on other data ({record.get('data')}, dictionaries "
                      f"{record.get('dictionaries')}), not {identity['data']} (dictionaries "
                      f"{identity['dictionaries']}): use another folder or remove that one")


def missing_data(recipe: Recipe, folder: Path) -> List[str]:
    """The files of the config's dictionaries and of the binarized splits it trains, validates and
    tests on that ``folder`` lacks."""
    splits = dict.fromkeys([recipe.train_value("train-subset") or "train",
                            *str(recipe.train_value("valid-subset") or "valid").split(","),
                            recipe.evaluate["gen_subset"]])
    if recipe.task == "language_modeling":
        wanted = [["dict.txt"]] + [[f"{s}.{ext}"] for s in splits for ext in ("bin", "idx")]
    else:
        src, tgt = recipe.source_lang, recipe.target_lang
        wanted = [[f"dict.{src}.txt"], [f"dict.{tgt}.txt"]] + [
            [f"{s}.{a}-{b}.{lang}.{ext}" for a, b in ((src, tgt), (tgt, src))]  # fairseq reads either pair
            for s in splits for lang in (src, tgt) for ext in ("bin", "idx")]
    return [names[0] for names in wanted if not any((folder / name).is_file() for name in names)]


def check_data(recipe: Recipe, data=None):
    """Refuse a data folder that is missing, made with another BPE than the config removes (its
    prepare.json says), or lacks a file the config reads."""
    folder = recipe.data_path(data)
    if not folder.is_dir():
        raise ConfigError(f"{recipe.path}: data folder {folder} not found (prepare it, or pass --data DIR)")
    manifest = folder / "prepare.json"
    if "remove_bpe" in recipe.evaluate and manifest.is_file():
        try:
            info = json.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ConfigError(f"cannot read {manifest}: {' '.join(str(err).split())}") from None
        if "remove_bpe" in info and info["remove_bpe"] != recipe.evaluate["remove_bpe"]:
            ours, theirs = json.dumps(recipe.evaluate["remove_bpe"]), json.dumps(info["remove_bpe"])
            raise ConfigError(f"{recipe.path}: evaluate: remove_bpe is {ours}, but the data needs {theirs} "
                              f"({manifest}: bpe {info.get('bpe')}, {info.get('bpe_size')}); set "
                              f"remove_bpe: {theirs} or prepare the data the config expects")
    missing = missing_data(recipe, folder)
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise ConfigError(f"{recipe.path}: data folder {folder} lacks {', '.join(missing[:3])}{more}, which the "
                          "config reads (prepare its data, or pass --data DIR)")


def prior_run(recipe: Recipe, save_dir: Path, data, changes) -> Tuple[Optional[dict], dict, dict]:
    """(the run in ``save_dir`` or None, the data's identity, the flags to train with); a run with
    checkpoints trained with other flags is refused: fairseq-train would resume it with these."""
    flags = merged_flags(recipe, changes)
    run, identity = check_record(recipe, data, save_dir / RUN_RECORD, "a run")
    if run and run.get("flags") != flags:
        raise ConfigError(f"{save_dir} holds a run with other fairseq-train flags ({flag_changes(run.get('flags', {}), flags)}): "
                          "use another folder or remove that one")
    return run, identity, flags


def train(recipe: Recipe, save_dir=None, extra: Sequence[str] = (), data=None, gpus: int = 1,
          bn_sync_stats: bool = False, gpu: Optional[bool] = None, threads: Optional[int] = None,
          echo=lambda line: print(line, end="", flush=True), log=print) -> int:
    """fairseq-train into ``save_dir`` (train.log, run record), or nothing when a run there finished
    with the same flags on the same data. Returns fairseq-train's exit status; ^C leaves a record
    that a relaunch resumes."""
    for key, words in split_extra(extra):  # a --save-dir among the extra arguments wins
        if key == "save-dir" and words:
            save_dir = words[0]
    save_dir = Path(save_dir) if save_dir else recipe.default_save_dir()
    changes = recipe_changes(extra)
    run, identity, flags = prior_run(recipe, save_dir, data, changes)
    if run and run.get("rc") == 0:
        # relaunched, fairseq-train would train one more update, or resume a patience-stopped run
        log(f"== {recipe.name}: reusing the finished run in {save_dir}")
        return 0
    argv = train_argv(recipe, save_dir=save_dir, extra=extra, data=data, gpu=gpu, gpus=gpus,
                      bn_sync_stats=bn_sync_stats)
    check_flags(recipe, argv[1:])
    save_dir.mkdir(parents=True, exist_ok=True)
    record = {"config": str(recipe.path), "flags": flags, "extra": changes, **identity,
              "gpus": 0 if "--cpu" in argv else gpus, "bn_sync_stats": "--bn-sync-stats" in argv,
              "rc": None, "seconds": None}
    write_atomic(save_dir / RUN_RECORD, json.dumps(record, indent=2) + "\n")
    log("$ " + shlex.join(argv))
    t0 = time.time()
    try:
        rc, _ = run_logged(argv, save_dir / "train.log", echo, child_env(threads))
    except KeyboardInterrupt:
        record.update(interrupted=True, seconds=round(time.time() - t0, 1))
        write_atomic(save_dir / RUN_RECORD, json.dumps(record, indent=2) + "\n")
        then = "resumes it from checkpoint_last.pt" if (save_dir / "checkpoint_last.pt").exists() else "starts it again"
        raise KeyboardInterrupt(f"fairseq-train stopped; the same command {then} ({save_dir})") from None
    record.update(rc=rc, seconds=round(time.time() - t0, 1))
    write_atomic(save_dir / RUN_RECORD, json.dumps(record, indent=2) + "\n")
    return rc


def describe_choice(ev) -> str:
    """Which checkpoint a config evaluates, in words (results table)."""
    if ev["checkpoint"]:
        return f"checkpoint_{ev['checkpoint']}.pt"
    if ev["average_last_epochs"]:
        return f"average of the last {ev['average_last_epochs']} epoch checkpoints"
    return f"average of the last {ev['average_last_updates']} update checkpoints"


def choose_checkpoint(recipe: Recipe, ckdir: Path, log=print) -> Tuple[Path, List[Path]]:
    """checkpoint_best/last.pt, or the average of the last N epoch/update checkpoints: (path, [inputs])."""
    from normplug.tools.common import numbered_checkpoints

    ev, train_first = recipe.evaluate, f"train first (normplug-recipe train {recipe.path})"
    if ev["checkpoint"]:
        path = ckdir / f"checkpoint_{ev['checkpoint']}.pt"
        if not path.exists():
            raise ConfigError(f"no {path.name} in {ckdir}: {train_first}")
        return path, [path]
    kind, n = ("epoch", ev["average_last_epochs"]) if ev["average_last_epochs"] else \
        ("update", ev["average_last_updates"])
    found = [Path(p) for p in numbered_checkpoints(str(ckdir), kind)] if ckdir.is_dir() else []
    if not found:
        last = ckdir / "checkpoint_last.pt"
        if not last.exists():
            raise ConfigError(f"no {kind} checkpoints in {ckdir}: {train_first}")
        log(f"no {kind} checkpoints in {ckdir} (the recipe averages the last {n}): decoding {last.name}")
        return last, [last]
    chosen = found[-n:]
    if len(chosen) < n:
        log(f"only {len(chosen)} {kind} checkpoint(s) in {ckdir}, the recipe averages {n}: averaging those")
    if len(chosen) == 1:
        return chosen[0], chosen
    stem = f"averaged_last{len(chosen)}" + ("_updates" if kind == "update" else "")
    out, stamp = ckdir / f"{stem}.pt", ckdir / f"{stem}.inputs"
    wanted = "\n".join(f"{p.name} {p.stat().st_mtime_ns}" for p in chosen)
    if out.exists() and stamp.exists() and stamp.read_text() == wanted:
        log(f"reusing {out} (average of {', '.join(p.name for p in chosen)})")
        return out, chosen
    run_checked([sys.executable, "-m", "normplug.tools.average", "--inputs", *map(str, chosen),
                 "--output", str(out)], "normplug-average")
    stamp.write_text(wanted)
    log(f"averaged {', '.join(p.name for p in chosen)} -> {out}")
    return out, chosen


def evaluate(recipe: Recipe, ckdir=None, data=None, checkpoint=None, extra_generate=(),
             log=print) -> Dict[str, object]:
    """Score the config's checkpoint into scores-<name>.json beside it, with the data it was scored on."""
    ckdir = Path(ckdir) if ckdir else recipe.default_save_dir()
    t0 = time.time()
    scores_path = ckdir / f"scores-{recipe.name}.json"
    identity = check_record(recipe, data, scores_path, f"{scores_path.name}, scored")[1]
    run = read_json(ckdir / RUN_RECORD)
    changed = run and not checkpoint and flag_changes(run.get("flags", {}), merged_flags(recipe, run.get("extra", [])))
    if changed:
        raise ConfigError(f"{ckdir} is stale: trained with other flags than {recipe.path} gives now ({changed}); "
                          "train it again, or name a checkpoint to score with --checkpoint")
    path, inputs = (Path(checkpoint), [Path(checkpoint)]) if checkpoint else choose_checkpoint(recipe, ckdir, log)
    scores = {"config": str(recipe.path), "name": recipe.name, "checkpoint": str(path),
              "checkpoint_choice": "given on the command line" if checkpoint else describe_choice(recipe.evaluate),
              "averaged": [p.name for p in inputs], **identity,
              **SCORING[recipe.task].score(recipe, path, ckdir, data=data, extra=extra_generate, log=log)}
    scores.update(published=recipe.published, metric=recipe.metric,
                  settings={k: v for k, v in recipe.evaluate.items() if k not in CHECKPOINT_CHOICES},
                  seconds=round(time.time() - t0, 1),
                  date=datetime.datetime.now().isoformat(timespec="seconds"))
    if recipe.published is not None:
        log(f"{recipe.name}: published {recipe.published} ({recipe.metric})")
    write_atomic(scores_path, json.dumps(scores, indent=2) + "\n")
    log(f"wrote {scores_path}")
    return scores
