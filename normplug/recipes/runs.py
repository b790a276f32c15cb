"""A recipe's runs: training and evaluating it, each leaving a record of what it ran on (run record, scores), and
the reproduction: configs trained and evaluated into one folder, with the table of what the runs left there."""
import csv
import datetime
import hashlib
import io
import json
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from .commands import (check_flags, child_env, command_line, eval_lm_argv, flag_changes, generate_argv, gpu_flags,
                       merged_flags, recipe_changes, run_logged, split_extra, train_argv, write_atomic)
from .config import CHECKPOINT_CHOICES, ConfigError, Recipe, load_config, raw_references_path
from .scoring import score_language_model, score_translation

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
    """What ``folder`` lacks of the config's dictionaries and the binarized splits it trains, validates and
    tests on (a translation split under either order of its language pair, as fairseq reads it)."""
    splits = dict.fromkeys([recipe.train_value("train-subset") or "train", recipe.evaluate["gen_subset"],
                            *str(recipe.train_value("valid-subset") or "valid").split(",")])
    src, tgt = recipe.source_lang, recipe.target_lang
    wanted = [["dict.txt"]] + [[f"{s}.{e}"] for s in splits for e in ("bin", "idx")] if not src else \
        [[f"dict.{src}.txt"], [f"dict.{tgt}.txt"]] + [[f"{s}.{a}-{b}.{lang}.{e}" for a, b in ((src, tgt), (tgt, src))]
                                                      for s in splits for lang in (src, tgt) for e in ("bin", "idx")]
    if recipe.evaluate.get("raw_references"):
        wanted.append([raw_references_path(recipe, ".")])
    return [names[0] for names in wanted if not any((folder / name).is_file() for name in names)]


def check_data(recipe: Recipe, data=None):
    """Refuse a data folder that is missing, lacks a file the config reads, or was made with another BPE
    than the config removes (its prepare.json says)."""
    folder = recipe.data_path(data)
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
    missing = missing_data(recipe, folder)
    if missing:
        raise ConfigError(f"{recipe.path}: data folder {folder} lacks {', '.join(missing[:3])}"
                          f"{f' and {len(missing) - 3} more' if missing[3:] else ''}, which the config reads "
                          "(prepare its data, or pass --data DIR)")


def prior_run(recipe: Recipe, save_dir: Path, data, changes) -> Tuple[Optional[dict], dict, dict]:
    """(the run in ``save_dir`` or None, the data's identity, the flags to train with); a run with
    checkpoints and other flags is refused: fairseq-train would resume it with these."""
    flags = merged_flags(recipe, changes)
    run, identity = check_record(recipe, data, save_dir / RUN_RECORD, "a run")
    if run and run.get("flags") != flags:
        raise ConfigError(f"{save_dir} holds a run with other fairseq-train flags "
                          f"({flag_changes(run.get('flags', {}), flags)}): use another folder or remove that one")
    return run, identity, flags


def train(recipe: Recipe, save_dir=None, extra: Sequence[str] = (), data=None, gpu: Optional[bool] = None,
          threads: Optional[int] = None, echo=lambda line: print(line, end="", flush=True), log=print) -> int:
    """fairseq-train into ``save_dir`` (train.log, run record), or nothing when a run there finished with the
    same flags on the same data. Returns fairseq-train's exit status; ^C leaves a record a relaunch resumes."""
    save_dir = next((words[0] for key, words in split_extra(extra) if key == "save-dir" and words), save_dir)
    save_dir, changes = Path(save_dir) if save_dir else recipe.default_save_dir(), recipe_changes(extra)
    run, identity, flags = prior_run(recipe, save_dir, data, changes)
    if run and run.get("rc") == 0 and not run.get("error"):
        # relaunched, fairseq-train would train one more update, or resume a patience-stopped run
        log(f"== {recipe.name}: reusing the finished run in {save_dir}")
        return 0
    argv = train_argv(recipe, save_dir=save_dir, extra=extra, data=data, gpu=gpu)
    check_flags(recipe, argv[1:])
    save_dir.mkdir(parents=True, exist_ok=True)
    record, t0 = {"config": str(recipe.path), "flags": flags, "extra": changes, **identity, "rc": None,
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


def train_command(recipe: Recipe, save_dir=None, extra: Sequence[str] = (), data=None) -> str:
    """What :func:`train` runs on a GPU machine, as a reader would type it."""
    return command_line(["fairseq-train", *train_argv(recipe, save_dir, extra, data, gpu=True, exe=False)])


def evaluate_commands(recipe: Recipe, ckdir=None, data=None, checkpoint=None, extra=()) -> List[str]:
    """What :func:`evaluate` runs on a GPU machine, as a reader would type it: the average of the checkpoints
    the config names (normplug-average), then fairseq-generate, or fairseq-eval-lm without and with context."""
    ckdir, ev, argvs = Path(ckdir) if ckdir else recipe.default_save_dir(), recipe.evaluate, []
    path = Path(checkpoint) if checkpoint else ckdir / f"checkpoint_{ev['checkpoint']}.pt"
    if not checkpoint and not ev["checkpoint"]:
        kind, n = averaging(recipe)
        path = averaged_path(ckdir, kind, n)
        argvs.append(["normplug-average", "--inputs", str(ckdir), f"--num-{kind}-checkpoints", str(n),
                      "--output", str(path)])
    if recipe.task == "translation":
        argvs.append(["fairseq-generate", *generate_argv(recipe, path, data, gpu=True, extra=extra, exe=False)])
    else:
        argvs += [["fairseq-eval-lm", *eval_lm_argv(recipe, path, context, data, gpu=True, extra=extra, exe=False)]
                  for context in (0, ev["context_window"])]
    return [command_line(argv) for argv in argvs]


def dry_run_note(gpus: Optional[int] = None) -> str:
    """The comment line above what --dry-run prints: the GPU run, whatever machine prints it."""
    where = "a GPU" if gpus is None else f"{gpus} GPU{'s' * (gpus > 1)} (--distributed-world-size {gpus})"
    return f"# the command lines as the driver runs them on {where}; on a machine without a GPU it adds --cpu"


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
              "checkpoint_choice": "given on the command line" if checkpoint else describe_choice(recipe),
              "averaged": [p.name for p in inputs], **identity,
              **(score_translation if recipe.task == "translation" else score_language_model)(
                  recipe, path, ckdir, data=data, extra=extra_generate, log=log)}
    scores.update(published=recipe.published, metric=recipe.metric,
                  settings={k: v for k, v in recipe.evaluate.items() if k not in CHECKPOINT_CHOICES},
                  seconds=round(time.time() - t0, 1),
                  date=datetime.datetime.now().isoformat(timespec="seconds"))
    if recipe.published is not None:
        log(f"{recipe.name}: published {recipe.published} ({recipe.metric})")
    write_atomic(scores_path, json.dumps(scores, indent=2) + "\n")
    log(f"wrote {scores_path}")
    return scores


# scores shown beside the published one: sacreBLEU (translation), fairseq's sliding window (LM)
SECOND_SCORES = ("sacrebleu", "sacrebleu_references", "sacrebleu_signature", "chrf", "chrf_signature",
                 "sliding_window_perplexity", "sliding_window_context")
RESULT_COLUMNS = ["config", "dataset", "setting", "norm", "paper", "metric", "better", "published", "ours",
                  "delta", *SECOND_SCORES, "evaluated", "checkpoints_averaged", "train_seconds", "status"]
ARROWS = {"higher": "↑", "lower": "↓"}
EXPLANATION = """\
Ours = the published metric computed as the paper did (BLEU: fairseq's scorer on the tokenized,
BPE-removed output, compound-split for WMT; perplexity: on non-overlapping windows of the training
length); on a corpus of scripts/prepare-text.sh (metric sacreBLEU), sacreBLEU of the detokenized
output against the raw references. Δ = ours − published (BLEU ↑: positive beats the paper;
perplexity ↓: negative does). Also: sacreBLEU (below), chrF (sacrebleu's, on a prepare-text.sh
corpus), or fairseq's sliding-window perplexity with `context` tokens before each window.
Status: `full` = the config as written; `modified (...)` = with extra fairseq-train arguments (fewer
updates, several GPUs and so BN statistics per GPU...: not the paper's run); `not run`; `trained, not
evaluated`; `interrupted` (a relaunch resumes it); `stale` = the config changed after the run, or the
scores are of other data; `failed: ...`."""


def row_status(recipe: Recipe, run: Optional[dict], scores: Optional[dict]) -> str:
    """What the run and scores of a row say: not run, interrupted, failed, stale, trained but not
    evaluated, modified or full."""
    if run is None:
        return "not run" if scores is None else "full (training not recorded)"
    if run.get("rc") is None:
        return "interrupted (a relaunch resumes it)" if run.get("interrupted") else "unfinished: training, or killed"
    if run.get("error"):
        return f"failed: {run['error']}"
    if run["rc"] != 0:
        return f"failed: fairseq-train exited {run['rc']}"
    changed = flag_changes(run.get("flags", {}), merged_flags(recipe, run.get("extra", [])))
    if changed:
        return f"stale: the config changed after this run ({changed})"
    if scores is None:
        return "trained, not evaluated"
    if "data" in scores and (scores["data"], scores.get("dictionaries")) != (run.get("data"), run.get("dictionaries")):
        return f"stale: scored on other data ({scores['data']}) than the run trained on"
    extra = run.get("extra") or []
    gpus = extra[extra.index("--distributed-world-size") + 1] if "--distributed-world-size" in extra[:-1] else "1"
    spread = f"; {gpus} GPUs, BN statistics {'synced' if '--bn-sync-stats' in extra else 'per GPU'}" * (gpus != "1")
    return f"modified (extra args: {' '.join(extra)}{spread})" if extra else "full"


def result_row(recipe: Recipe, out: Path, failure: Optional[str] = None) -> Dict[str, object]:
    """One table row from what a run left in ``out/<training name>`` (after a ``failure``: no old scores)."""
    ckdir = out / recipe.training_name
    run = read_json(ckdir / RUN_RECORD)
    ours, metric_name, better = ("perplexity", "perplexity", "lower") if recipe.task != "translation" else \
        ("sacrebleu", "sacreBLEU", "higher") if recipe.evaluate["raw_references"] else \
        ("tokenized_bleu", "BLEU", "higher")
    row = {"config": recipe.name, "dataset": recipe.dataset, "setting": recipe.setting, "norm": recipe.norm,
           "paper": recipe.paper, "metric": recipe.metric, "better": better, "metric_name": metric_name,
           "published": recipe.published, "evaluated": describe_choice(recipe),
           "train_seconds": (run or {}).get("seconds")}
    scores = None if failure else read_json(ckdir / f"scores-{recipe.name}.json")
    row["status"] = "failed: " + failure if failure else row_status(recipe, run, scores)
    if scores:
        row.update({k: scores.get(k) for k in SECOND_SCORES}, ours=scores.get(ours),
                   checkpoints_averaged=" ".join(scores["averaged"]))
        if recipe.published is not None and row["ours"] is not None:
            row["delta"] = round(row["ours"] - recipe.published, 2)
    return row


def fmt(v, digits=2) -> str:
    return "—" if v is None or v == "" else f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def _second_score(row) -> str:
    if row.get("chrf") is not None:
        return f"chrF {row['chrf']:.2f}"
    if row.get("sacrebleu") is not None:
        return f"sacreBLEU {row['sacrebleu']:.2f}"
    if row.get("sliding_window_perplexity") is not None:
        return f"sliding window, context {row['sliding_window_context']}: {row['sliding_window_perplexity']:.2f}"
    return "—"


def write_csv(path: Path, rows, columns):
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    w.writeheader()
    w.writerows({k: ("" if row.get(k) is None else row[k]) for k in columns} for row in rows)
    write_atomic(path, buf.getvalue())


def write_results(rows, out: Path) -> List[str]:
    """results.csv and results.md in ``out``; returns the table's lines."""
    write_csv(out / "results.csv", rows, RESULT_COLUMNS)
    table = ["| config | dataset | setting | norm | metric | published | ours | Δ | also | evaluated | status |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    table += ["| " + " | ".join([r["config"], r["dataset"], r["setting"], r["norm"],
                                 f"{r['metric_name']} {ARROWS[r['better']]}", fmt(r.get("published"), 1),
                                 fmt(r.get("ours")), fmt(r.get("delta")), _second_score(r),
                                 r["evaluated"], r["status"].replace("|", "\\|")]) + " |" for r in rows]
    refs = {}  # the references and signature of each sacreBLEU: the rows scored with them
    for r in rows:
        if r.get("sacrebleu_references"):
            chrf = f"; chrF `{r['chrf_signature']}`" if r.get("chrf_signature") else ""
            refs.setdefault(f"the {r['sacrebleu_references']} (`{r['sacrebleu_signature']}`{chrf})", []).append(
                r["config"])
    lines = ["# normplug: reproduction results", "", EXPLANATION, "", *table, "",
             "sacreBLEU: hypotheses detokenized by sacremoses (tokenized corpora) or fairseq's --post-process "
             "sentencepiece (prepare-text.sh corpora), against", *[f"- {k}: {', '.join(v)}" for k, v in refs.items()],
             "", "Papers:", "",
             *[f"- {paper}" for paper in sorted({r["paper"] for r in rows})], ""]
    write_atomic(out / "results.md", "\n".join(lines))
    return table


def training_failure(recipe: Recipe, ckdir: Path, extra, data, log) -> Optional[str]:
    """:func:`train` into ``ckdir``: why it failed, or None (configs that share the training read it)."""
    try:
        rc = train(recipe, ckdir, extra, data, echo=None, log=log)
    except RuntimeError as err:
        return str(err)
    return f"fairseq-train exited {rc}; see {ckdir / 'train.log'}" if rc else None


def reproduce(config_paths: Sequence, out, extra: Sequence[str] = (), data=None, table_only=False,
              dry_run=False, gpus=1, log=print) -> int:
    """Train and evaluate each config into ``out/<training name>`` (``table_only``: only read what runs
    left there; ``dry_run``: print the commands, touch nothing; ``gpus``: see :func:`gpu_flags`);
    results.md / results.csv in ``out``. Returns an exit status."""
    out = Path(out)
    recipes = [load_config(p, data) for p in config_paths]  # every config is checked before any work
    extras = {r.name: gpu_flags(r, gpus) + list(extra) for r in recipes}
    if table_only and extra:
        raise ConfigError(f"table trains nothing: extra fairseq-train arguments ({' '.join(extra)}) have no effect")
    if any(key == "save-dir" for key, _ in split_extra(extra)):
        raise ConfigError("reproduce trains each config into --out/<name>: --save-dir has no place here")
    if dry_run:
        log(dry_run_note(gpus))
        for i, recipe in enumerate(recipes):  # a shared training once
            ckdir, first = out / recipe.training_name, all(r.training_name != recipe.training_name for r in recipes[:i])
            log("\n".join([f"# {recipe.name}", *[train_command(recipe, ckdir, extras[recipe.name], data)] * first,
                           *evaluate_commands(recipe, ckdir, data)]))
        return 0
    for recipe in [] if table_only else recipes:
        ckdir = out / recipe.training_name
        prior_run(recipe, ckdir, data, recipe_changes(extras[recipe.name]))
        check_flags(recipe, train_argv(recipe, ckdir, extras[recipe.name], data, exe=False))
    out.mkdir(parents=True, exist_ok=True)
    rows, trained, failed = [], {}, 0
    for recipe in recipes:
        ckdir = out / recipe.training_name
        try:
            if not table_only:
                if recipe.training_name not in trained:  # its failure, or None
                    log(f"== {recipe.name}: training into {ckdir}")
                    trained[recipe.training_name] = training_failure(recipe, ckdir, extras[recipe.name], data, log)
                if trained[recipe.training_name]:
                    raise RuntimeError(trained[recipe.training_name])
                log(f"== {recipe.name}: evaluating")
                evaluate(recipe, ckdir, data=data, log=log)
            row = result_row(recipe, out)
        except (RuntimeError, ConfigError, OSError) as err:
            failed += 1
            row = result_row(recipe, out, failure=" ".join(str(err).split())[:300])
            log(f"== {recipe.name}: {row['status']}")
        rows.append(row)
        table = write_results(rows, out)  # after every config: partial results survive a crash
    log("\n".join(table))
    log(f"wrote {out / 'results.md'} and {out / 'results.csv'}")
    return 1 if failed else 0
