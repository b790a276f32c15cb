"""What a run and its scores were made of: the run record in its folder (flags, seed, direction, data) and the
data folder's identity, so that a number is never reused or tabulated for another run, split or data."""
import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .commands import flag_changes, merged_flags
from .config import ConfigError, Recipe, raw_references_path

RUN_RECORD = "normplug-run.json"  # in a run folder: the flags, data, device and exit status of its run


def read_json(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def data_identity(recipe: Recipe) -> Dict[str, object]:
    """What a run or a score was computed on: the data folder, resolved, its dictionaries, and the digest of its
    binarized contents that the preparation scripts write into prepare.json."""
    path = recipe.data_path
    identity = {"data": str(path), "dictionaries": {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()[:16] for p in sorted(path.glob("dict*.txt"))}}
    digest = (read_json(path / "prepare.json") or {}).get("data_digest")
    return {**identity, "data_digest": digest} if digest else identity


def identity_changes(record: dict, identity: dict) -> List[str]:
    """The keys of a data identity that differ from a record's (keys a record lacks are not compared)."""
    return [key for key, value in identity.items() if key in record and record[key] != value]


def check_record(recipe: Recipe, record_path: Path, what: str) -> Tuple[Optional[dict], dict]:
    """:func:`check_data`, and a run or score on other data is never reused or overwritten. A run record binds
    only beside a checkpoint: a run that failed or was stopped before its first left nothing to keep. Returns
    (the record, the data's identity)."""
    check_data(recipe)
    record, identity = read_json(record_path), data_identity(recipe)
    if record_path.name == RUN_RECORD and not any(record_path.parent.glob("checkpoint*.pt")):
        record = None
    if record is None or not identity_changes(record, identity):
        return record, identity
    changed = " and ".join(identity_changes(record, identity))
    raise ConfigError(f"{record_path.parent} holds {what} on other data ({record.get('data')}: its {changed} "
                      f"differ{'s' * (' and ' not in changed)} from {identity['data']} now): use another folder or "
                      "remove that one")


def missing_data(recipe: Recipe) -> List[str]:
    """What the data folder lacks of the config's dictionaries and the binarized splits it trains, validates and
    tests on (a translation split under either order of its language pair, as fairseq reads it)."""
    folder = recipe.data_path
    splits = dict.fromkeys([recipe.train_value("train-subset") or "train", recipe.evaluate["gen_subset"],
                            *str(recipe.train_value("valid-subset") or "valid").split(",")])
    src, tgt = recipe.source_lang, recipe.target_lang
    wanted = [["dict.txt"]] + [[f"{s}.{e}"] for s in splits for e in ("bin", "idx")] if not src else \
        [[f"dict.{src}.txt"], [f"dict.{tgt}.txt"]] + [[f"{s}.{a}-{b}.{lang}.{e}" for a, b in ((src, tgt), (tgt, src))]
                                                      for s in splits for lang in (src, tgt) for e in ("bin", "idx")]
    if recipe.evaluate.get("raw_references"):
        wanted.append([str(raw_references_path(recipe).relative_to(folder))])
    return [names[0] for names in wanted if not any((folder / name).is_file() for name in names)]


def check_data(recipe: Recipe):
    """Refuse a data folder that is missing, lacks a file the config reads, or was made with another BPE
    than the config removes (its prepare.json says)."""
    folder = recipe.data_path
    if not folder.is_dir():
        raise ConfigError(f"{recipe.path}: data folder {folder} not found (prepare it, or pass --data DIR)")
    if recipe.task == "translation" and None in (recipe.source_lang, recipe.target_lang):
        raise ConfigError(f"{recipe.path}: source_lang and target_lang are null, to be read from the data folder's "
                          f"prepare.json, and {folder} has none with both: pass --data DIR, a folder made by "
                          "scripts/prepare-text.sh")
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
    missing = missing_data(recipe)
    if missing:
        raise ConfigError(f"{recipe.path}: data folder {folder} lacks {', '.join(missing[:3])}"
                          f"{f' and {len(missing) - 3} more' if missing[3:] else ''}, which the config reads "
                          "(prepare its data, or pass --data DIR)")


def direction(recipe_or_record) -> Optional[Tuple[str, str]]:
    if isinstance(recipe_or_record, dict):
        return recipe_or_record.get("source_lang"), recipe_or_record.get("target_lang")
    return recipe_or_record.source_lang, recipe_or_record.target_lang


def as_trained(recipe: Recipe, run: Optional[dict]) -> Recipe:
    """The recipe a run was trained with: the config, the run's extra fairseq-train arguments, seed and
    direction (as its record says)."""
    if not run:
        return recipe
    trained = dataclasses.replace(recipe, train_extra=tuple(run.get("extra") or ()), seed=run.get("seed", recipe.seed))
    if recipe.task == "translation" and run.get("source_lang"):
        trained = dataclasses.replace(trained, source_lang=run["source_lang"], target_lang=run["target_lang"])
    return trained


def prior_run(recipe: Recipe, save_dir: Path) -> Tuple[Optional[dict], dict, dict]:
    """(the run in ``save_dir`` or None, the data's identity, the flags to train with); a run with
    checkpoints and other flags or direction is refused: fairseq-train would resume it with these."""
    flags = merged_flags(recipe)
    run, identity = check_record(recipe, save_dir / RUN_RECORD, "a run")
    if run and run.get("flags") != flags:
        raise ConfigError(f"{save_dir} holds a run with other fairseq-train flags "
                          f"({flag_changes(run.get('flags', {}), flags)}): use another folder or remove that one")
    if run and recipe.task == "translation" and run.get("source_lang") and direction(run) != direction(recipe):
        raise ConfigError(f"{save_dir} holds a run trained {'→'.join(direction(run))}, not "
                          f"{'→'.join(direction(recipe))}: use another folder or remove that one")
    return run, identity, flags


def config_changes(recipe: Recipe, run: dict) -> str:
    """How the config (``recipe``, as loaded) changed after ``run``: its flags now differ from the run's."""
    return flag_changes(run.get("flags", {}), merged_flags(as_trained(recipe, run)))


def run_changes(recipe: Recipe, run: dict) -> str:
    """How a run differs from its config as written: extra fairseq-train arguments and another direction."""
    changes = [f"extra args: {' '.join(run['extra'])}"] if run.get("extra") else []
    if recipe.task == "translation" and run.get("source_lang") and direction(run) != direction(recipe):
        changes.insert(0, f"direction {'→'.join(direction(run))}, the config's {'→'.join(direction(recipe))}")
    return "; ".join(changes)


def row_status(recipe: Recipe, run: Optional[dict], scores: Optional[dict]) -> str:
    """What the run and scores of a row say: not run, interrupted, failed, stale, trained but not
    evaluated, modified or full. ``recipe``: the config as loaded, with the data the table reads."""
    if run is None:
        return "not run" if scores is None else "full (training not recorded)"
    if run.get("rc") is None:
        return "interrupted (a relaunch resumes it)" if run.get("interrupted") else "unfinished: training, or killed"
    if run.get("error"):
        return f"failed: {run['error']}"
    if run["rc"] != 0:
        return f"failed: fairseq-train exited {run['rc']}"
    changed = config_changes(recipe, run)
    if changed:
        return f"stale: the config changed after this run ({changed})"
    if recipe.data_path.is_dir() and identity_changes(run, data_identity(recipe)):
        return (f"stale: the data in {recipe.data_path} changed after this run "
                f"({', '.join(identity_changes(run, data_identity(recipe)))})")
    if scores is None:
        return "trained, not evaluated"
    if "data" in scores and identity_changes(scores, {k: run.get(k) for k in ("data", "dictionaries", "data_digest")}):
        return f"stale: scored on other data ({scores['data']}) than the run trained on"
    extra = run.get("extra") or []
    gpus = extra[extra.index("--distributed-world-size") + 1] if "--distributed-world-size" in extra[:-1] else "1"
    spread = f"; {gpus} GPUs, BN statistics {'synced' if '--bn-sync-stats' in extra else 'per GPU'}" * (gpus != "1")
    changes = run_changes(recipe, run)
    return f"modified ({changes}{spread})" if changes else "full"
