"""The reproduction: configs trained and evaluated into one folder, with every seed asked, and the table of what
the runs left there (results.csv: one row a run; results.md: one row a config, mean ± sd over its seeds)."""
import csv
import io
import statistics
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from .commands import check_flags, train_argv, use_gpu, write_atomic
from .config import CHECKPOINT_CHOICES, ConfigError, Recipe, load_config
from .launch import Launch
from .passthrough import with_training_arguments
from .records import RUN_RECORD, prior_run, read_json, row_status
from .runs import (describe_choice, dry_run_note, epoch_progress, evaluate, evaluate_commands, scores_path, train,
                   train_commands)

# scores shown beside the published one: sacreBLEU (translation), fairseq's sliding window (LM)
SECOND_SCORES = ("sacrebleu", "sacrebleu_references", "sacrebleu_signature", "chrf", "chrf_signature",
                 "sliding_window_perplexity", "sliding_window_context")
TID_SCORES = ("tid_mean", "tid_var", "tid_split", "tid_max_tokens")  # BN/PN models: normplug-tid, layer mean
RESULT_COLUMNS = ["config", "seed", "dataset", "setting", "norm", "paper", "metric", "better", "published", "ours",
                  "delta", *SECOND_SCORES, *TID_SCORES, "split", "direction", "evaluated", "checkpoints_averaged",
                  "train_seconds", "run_folder", "status"]
# the scores of a config that results.md gives as mean ± sd over seeds
AVERAGED = ("ours", "delta", "sacrebleu", "chrf", "sliding_window_perplexity", "tid_mean", "tid_var")
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
scores are of other data, or the data folder changed after the run; `failed: ...`. Evaluated: the
split and direction decoded, and the checkpoint. TID: training–inference discrepancy of the evaluated
checkpoint's BN/PN layers on the valid split at the training batch size (normplug-tid), mean over
layers. With several seeds, each score is mean ± sample sd (n runs); results.csv has every run."""


def run_folder(out: Path, recipe: Recipe, seeded: bool) -> Path:
    """``out/<training name>``, or ``out/<training name>-seed<S>`` for a run of ``--seeds``."""
    return Path(out) / (recipe.training_name + (f"-seed{recipe.seed}" if seeded else ""))


def result_row(recipe: Recipe, ckdir: Path, failure: Optional[str] = None) -> Dict[str, object]:
    """One run's row from what it left in ``ckdir`` (after a ``failure``: no old scores). ``recipe``: the config
    as loaded, with the seed of the run."""
    run = read_json(ckdir / RUN_RECORD)
    ours, metric_name, better = ("perplexity", "perplexity", "lower") if recipe.task != "translation" else \
        ("sacrebleu", "sacreBLEU", "higher") if recipe.evaluate["raw_references"] else \
        ("tokenized_bleu", "BLEU", "higher")
    row = {"config": recipe.name, "seed": (run or {}).get("seed", recipe.seed), "dataset": recipe.dataset,
           "setting": recipe.setting, "norm": recipe.norm, "paper": recipe.paper, "metric": recipe.metric,
           "better": better, "metric_name": metric_name, "published": recipe.published,
           "evaluated": describe_choice(recipe), "train_seconds": (run or {}).get("seconds"),
           "run_folder": str(ckdir)}
    scores = None if failure else read_json(scores_path(recipe, ckdir))
    row["status"] = "failed: " + failure if failure else row_status(recipe, run, scores)
    if scores:
        row.update({k: scores.get(k) for k in (*SECOND_SCORES, *TID_SCORES)}, ours=scores.get(ours),
                   checkpoints_averaged=" ".join(scores["averaged"]), split=scores.get("gen_subset"))
        if scores.get("source_lang"):
            row["direction"] = f"{scores['source_lang']}→{scores['target_lang']}"
        where = " ".join(filter(None, [row["split"], row.get("direction")]))
        row["evaluated"] = f"{where}: {scores.get('checkpoint_choice', row['evaluated'])}" if where else row["evaluated"]
        if recipe.published is not None and row["ours"] is not None:
            row["delta"] = round(row["ours"] - recipe.published, 2)
    return row


def mean_sd(values: Sequence[float]):
    """(mean, sample sd or None under two values, n) of ``values``."""
    values = list(values)
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None, len(values)


def config_row(runs: List[Dict[str, object]], seeds: Sequence[int]) -> Dict[str, object]:
    """One config's row of results.md from its runs' rows: each score as mean ± sd over the runs that have it."""
    row = dict(runs[0])
    for key in AVERAGED:
        values = [r[key] for r in runs if r.get(key) is not None]
        row[key] = mean_sd(values) if values else None
    evaluated = [r for r in runs if r.get("ours") is not None]
    statuses = {r["status"] for r in runs}
    row["status"] = statuses.pop() if len(statuses) == 1 else "; ".join(f"seed {r['seed']}: {r['status']}" for r in runs)
    if len(evaluated) < len(seeds):
        row["status"] = f"{len(evaluated)} of {len(seeds)} seeds evaluated; {row['status']}"
    row["seed"] = " ".join(str(r["seed"]) for r in runs)
    return row


def fmt(v, digits=2) -> str:
    """A number, a (mean, sd, n) over seeds as ``mean ± sd (n)``, or — for none."""
    if isinstance(v, tuple):
        mean, sd, n = v
        return f"{mean:.{digits}f}" + ("" if sd is None else f" ± {sd:.{digits}f}") + f" (n={n})" * (n > 1)
    return "—" if v is None or v == "" else f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def _second_score(row) -> str:
    if row.get("chrf") is not None:
        return f"chrF {fmt(row['chrf'])}"
    if row.get("sacrebleu") is not None:
        return f"sacreBLEU {fmt(row['sacrebleu'])}"
    if row.get("sliding_window_perplexity") is not None:
        return f"sliding window, context {row['sliding_window_context']}: {fmt(row['sliding_window_perplexity'])}"
    return "—"


def _tid(row) -> str:
    if row.get("tid_var") is None:
        return "—"
    return f"{'n/a' if row.get('tid_mean') is None else fmt(row['tid_mean'], 3)} / {fmt(row['tid_var'], 3)}"


def write_csv(path: Path, rows, columns):
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    w.writeheader()
    w.writerows({k: ("" if row.get(k) is None else row[k]) for k in columns} for row in rows)
    write_atomic(path, buf.getvalue())


def write_results(runs, out: Path, seeds: Optional[Sequence[int]] = None) -> List[str]:
    """results.csv (a row a run) and results.md (a row a config, mean ± sd over ``seeds``) in ``out``; returns
    the table's lines."""
    write_csv(out / "results.csv", runs, RESULT_COLUMNS)
    rows = [config_row([r for r in runs if r["config"] == name], seeds) for name in dict.fromkeys(
        r["config"] for r in runs)] if seeds else runs
    table = ["| config | dataset | setting | norm | metric | published | ours | Δ | also | TID mean / var | "
             "evaluated | status |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    table += ["| " + " | ".join([r["config"], r["dataset"], r["setting"], r["norm"],
                                 f"{r['metric_name']} {ARROWS[r['better']]}", fmt(r.get("published"), 1),
                                 fmt(r.get("ours")), fmt(r.get("delta")), _second_score(r), _tid(r),
                                 r["evaluated"], r["status"].replace("|", "\\|")]) + " |" for r in rows]
    if seeds:
        table.append(f"\nSeeds {' '.join(map(str, seeds))}: mean ± sample sd (n runs); every run in results.csv.")
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


def scored_already(recipe: Recipe, ckdir: Path) -> bool:
    """Whether ``ckdir`` holds scores of its finished run with the recipe's evaluation settings (a relaunch
    evaluates only what is missing)."""
    path = scores_path(recipe, ckdir)
    scores = read_json(path)
    return bool(scores) and path.stat().st_mtime >= (ckdir / RUN_RECORD).stat().st_mtime and \
        scores.get("checkpoint_choice") == describe_choice(recipe) and scores.get("settings") == \
        {k: v for k, v in recipe.evaluate.items() if k not in CHECKPOINT_CHOICES}


def training_failure(recipe: Recipe, ckdir: Path, launch: Launch, log) -> Optional[str]:
    """:func:`train` into ``ckdir``, its progress one line an epoch: why it failed, or None."""
    try:
        rc = train(recipe, ckdir, echo=epoch_progress(recipe.name, ckdir / "train.log", log), log=log, launch=launch)
    except RuntimeError as err:
        return str(err)
    return f"fairseq-train exited {rc}; see {ckdir / 'train.log'}" if rc else None


def reproduce(config_paths: Sequence, out, extra: Sequence[str] = (), data=None, table_only=False,
              dry_run=False, launch: Launch = Launch(), seeds: Optional[Sequence[int]] = None, log=print) -> int:
    """Train and evaluate each config, with each of ``seeds`` (default: the config's), into ``out/<training
    name>[-seed<S>]`` (``table_only``: only read what runs left there; ``dry_run``: print the commands, touch
    nothing; ``launch``: the GPUs and nodes of each run); results.md / results.csv in ``out``. Node 0 evaluates
    and tabulates; the other nodes only train. Returns an exit status."""
    out = Path(out)
    if table_only and extra:
        raise ConfigError(f"table trains nothing: extra fairseq-train arguments ({' '.join(extra)}) have no effect")
    configs = [load_config(p, data) for p in config_paths]  # every config is checked before any work
    runs = [(config, with_training_arguments(config, [*launch.batch_flags(config), *extra,
                                                      *(["--seed", str(seed)] if seeds else [])]))
            for config in configs for seed in (seeds or [None])]
    for note in dict.fromkeys(launch.batch_note(config) for config in configs):
        if note:
            log(note)
    if dry_run:
        log(dry_run_note(launch))
        for i, (_, recipe) in enumerate(runs):  # a shared training once
            ckdir = run_folder(out, recipe, bool(seeds))
            first = all(run_folder(out, r, bool(seeds)) != ckdir for _, r in runs[:i])
            log("\n".join([f"# {recipe.name}" + f" (seed {recipe.seed})" * bool(seeds),
                           *(train_commands(recipe, ckdir, launch) if first else []),
                           *(evaluate_commands(recipe, ckdir) if launch.writes_record else [])]))
        return 0
    for _, recipe in [] if table_only else runs:
        ckdir = run_folder(out, recipe, bool(seeds))
        prior_run(recipe, ckdir)
        check_flags(recipe, train_argv(recipe, ckdir, exe=False), processes_here=launch.gpus if use_gpu() else None)
    out.mkdir(parents=True, exist_ok=True)
    rows, trained, failed = [], {}, 0
    for config, recipe in runs:
        ckdir = run_folder(out, recipe, bool(seeds))
        try:
            if not table_only:
                if ckdir not in trained:  # its failure, or None
                    log(f"== {recipe.name}: training into {ckdir} (log: {ckdir / 'train.log'})")
                    trained[ckdir] = training_failure(recipe, ckdir, launch, log)
                if trained[ckdir]:
                    raise RuntimeError(trained[ckdir])
                if not launch.writes_record:
                    continue
                if scored_already(recipe, ckdir):
                    log(f"== {recipe.name}: evaluated already ({scores_path(recipe, ckdir)})")
                else:
                    log(f"== {recipe.name}: evaluating")
                    evaluate(recipe, ckdir, log=log)
            row = result_row(config, ckdir)
        except (RuntimeError, ConfigError, OSError) as err:
            failed += 1
            row = result_row(config, ckdir, failure=" ".join(str(err).split())[:300])
            log(f"== {recipe.name}: {row['status']}")
        rows.append(row)
        table = write_results(rows, out, seeds)  # after every run: partial results survive a crash
    if not rows:
        log(f"node {launch.node_rank}: trained its part; node 0 evaluates and writes the table")
        return 1 if failed else 0
    log("\n".join(table))
    log(f"wrote {out / 'results.md'} and {out / 'results.csv'}")
    return 1 if failed else 0
