"""The reproduction: train and evaluate configs into one folder, and the results table of
what the runs there left (results.md, results.csv)."""
import csv
import io
import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from .commands import check_flags, flag_changes, merged_flags, recipe_changes, split_extra, train_argv, write_atomic
from .config import ConfigError, Recipe, load_config
from .runs import RUN_RECORD, describe_choice, evaluate, prior_run, read_json, train
from .scoring import SCORING

# scores shown beside the published one: sacreBLEU (translation), fairseq's sliding window (LM)
SECOND_SCORES = ("sacrebleu", "sacrebleu_references", "sacrebleu_signature", "sliding_window_perplexity",
                 "sliding_window_context")
RESULT_COLUMNS = ["config", "dataset", "setting", "norm", "paper", "metric", "better", "published", "ours",
                  "delta", *SECOND_SCORES, "evaluated", "checkpoints_averaged", "train_seconds", "status"]
ARROWS = {"higher": "↑", "lower": "↓"}
EXPLANATION = """\
Ours = the published metric computed as the paper did (BLEU: fairseq's scorer on the
tokenized, BPE-removed output; compound-split for WMT; perplexity: exp of the mean token
loss on non-overlapping windows of the training length, without context beyond the window).
Δ = ours − published: for BLEU (↑, higher is better) a positive Δ beats the paper, for
perplexity (↓, lower is better) a negative one. Also: sacreBLEU (below), or fairseq's
sliding-window perplexity, each window scoring its last tokens with `context` tokens before
them (fairseq-eval-lm --context-window). Status:
`full` = the config as written; `shortened (...)` = run with extra fairseq-train arguments
(not comparable to the paper); `not run` = nothing in this folder yet; `trained, not evaluated`;
`interrupted` = stopped, a relaunch resumes it; `stale` = the config changed after the run, or the
scores are of other data; `failed: ...` = why; `N GPUs` = spread over N GPUs with update-freq / N,
BN statistics per GPU or synced (--bn-sync-stats)."""


def row_status(recipe: Recipe, run: Optional[dict], scores: Optional[dict]) -> str:
    """What the run and scores of a row say: not run, interrupted, failed, stale, trained but not
    evaluated, shortened or full; then the GPUs, if several."""
    if run is None:
        return "not run" if scores is None else "full (training not recorded)"
    if run.get("rc") is None:
        return "interrupted (a relaunch resumes it)" if run.get("interrupted") else "unfinished: training, or killed"
    if run["rc"] != 0:
        return f"failed: fairseq-train exited {run['rc']}"
    changed = flag_changes(run.get("flags", {}), merged_flags(recipe, run.get("extra", [])))
    if changed:
        status = f"stale: the config changed after this run ({changed})"
    elif scores is None:
        status = "trained, not evaluated"
    elif "data" in scores and (scores["data"], scores.get("dictionaries")) != (run.get("data"), run.get("dictionaries")):
        status = f"stale: scored on other data ({scores['data']}) than the run trained on"
    else:
        status = "shortened (extra args: " + " ".join(run["extra"]) + ")" if run.get("extra") else "full"
    if run.get("gpus", 1) > 1:
        status += f", {run['gpus']} GPUs, BN stats {'synced' if run.get('bn_sync_stats') else 'per GPU'}"
    return status


def result_row(recipe: Recipe, out: Path, failure: Optional[str] = None) -> Dict[str, object]:
    """One table row from what a run left in ``out/<training name>`` (after a ``failure``: no old scores)."""
    ckdir = out / recipe.training_name
    run, scoring = read_json(ckdir / RUN_RECORD), SCORING[recipe.task]
    row = {"config": recipe.name, "dataset": recipe.dataset, "setting": recipe.setting,
           "norm": recipe.norm, "paper": recipe.paper, "metric": recipe.metric, "better": scoring.better,
           "metric_name": scoring.metric, "published": recipe.published,
           "evaluated": describe_choice(recipe.evaluate), "train_seconds": run.get("seconds") if run else None}
    scores = None if failure else read_json(ckdir / f"scores-{recipe.name}.json")
    row["status"] = "failed: " + failure if failure else row_status(recipe, run, scores)
    if scores:
        row.update({k: scores.get(k) for k in SECOND_SCORES}, ours=scores.get(scoring.published_score),
                   checkpoints_averaged=" ".join(scores["averaged"]))
        if recipe.published is not None and row["ours"] is not None:
            row["delta"] = round(row["ours"] - recipe.published, 2)
    return row


def fmt(v, digits=2) -> str:
    return "—" if v is None or v == "" else f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def _second_score(row) -> str:
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
    refs = {}
    for r in rows:
        if r.get("sacrebleu_references"):
            refs.setdefault((r["sacrebleu_references"], r["sacrebleu_signature"]), []).append(r["config"])
    lines = ["# normplug: reproduction results", "", EXPLANATION, "",
             *table, "", "sacreBLEU: sacremoses-detokenized hypotheses against",
             *[f"- the {label} (`{sig}`): {', '.join(names)}" for (label, sig), names in refs.items()],
             *([] if refs else ["- — (no row scored yet)"]),
             "", "Papers:", "", *[f"- {paper}" for paper in sorted({r["paper"] for r in rows})], ""]
    write_atomic(out / "results.md", "\n".join(lines))
    return table


def reproduce(config_paths: Sequence, out, extra: Sequence[str] = (), data=None, table_only=False,
              gpus: int = 1, bn_sync_stats: bool = False, log=print) -> int:
    """Train and evaluate each config into ``out/<training name>`` (``table_only``: only read what runs
    left there); results.md / results.csv in ``out``. Returns an exit status."""
    out = Path(out)
    recipes = [load_config(p) for p in config_paths]  # every config is checked before any work
    if table_only and extra:
        raise ConfigError(f"--table-only trains nothing: extra fairseq-train arguments ({' '.join(extra)}) "
                          "have no effect")
    if any(key == "save-dir" for key, _ in split_extra(extra)):
        raise ConfigError("reproduce trains each config into --out/<name>: --save-dir has no place here")
    if not table_only:
        for recipe in recipes:
            ckdir = out / recipe.training_name
            prior_run(recipe, ckdir, data, recipe_changes(extra))
            check_flags(recipe, train_argv(recipe, ckdir, extra, data, gpus=gpus, bn_sync_stats=bn_sync_stats)[1:])
    out.mkdir(parents=True, exist_ok=True)
    rows, trained, failed = [], {}, 0
    for recipe in recipes:
        ckdir = out / recipe.training_name
        try:
            if not table_only:
                if recipe.training_name not in trained:
                    log(f"== {recipe.name}: training into {ckdir}")
                    trained[recipe.training_name] = train(recipe, ckdir, extra, data, gpus, bn_sync_stats,
                                                          echo=None, log=log)
                if trained[recipe.training_name] != 0:
                    raise RuntimeError(f"fairseq-train exited {trained[recipe.training_name]}; "
                                       f"see {ckdir / 'train.log'}")
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
