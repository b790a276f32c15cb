"""Paired significance tests between the runs of a reproduction folder (``normplug-recipe compare --out OUT
--baseline NAME``): every config against the baseline config, seed by seed and pooled over the seeds both ran.

Translation: sacreBLEU's paired bootstrap resampling (Koehn 2004) and paired approximate randomization (Riezler &
Maxwell 2005), run by ``sacrebleu.significance.PairedTest`` itself on the detokenized hypotheses and references
the scores file names, read as the sacrebleu CLI reads files, with the metric settings of the scores file's
signatures: the numbers ``sacrebleu REF -i BASE SYS --paired-bs|--paired-ar -m bleu chrf -tok TOK -w 2`` prints.

Pooled over seeds: the same tests on the concatenation of the seed-paired outputs, the references repeated once a
seed (sacrebleu's CLI on concatenated files). The pooled score is the corpus score of every seed's sentences (the
sufficient statistics summed over seeds, each seed weighing the same). Approximate randomization swaps the two
configs' outputs of one (sentence, seed) unit at a time; under its null hypothesis (both configs one process) each
pair is exchangeable and the seeds' trainings are independent, so its pooled p-value is valid and counts training
noise as Clark et al. (2011) ask. The bootstrap resamples (sentence, seed) units as if independent, yet the seeds
translate a sentence alike: its pooled CI is too narrow and its p too small (a bootstrap drawing sentences with all
their seeds would be right; sacrebleu has none). The pooled row's test is approximate randomization.

Language models: fairseq-eval-lm ``--sample-break-mode none`` scores consecutive windows of the training length;
a window's log-probability is the sum over its tokens (natural log). Both configs score the same tokens, so
``tokens * (ln ppl_sys - ln ppl_base) = -sum over windows of (sys - base)``: the test statistic is
``|sum of the per-window differences|``, tested by a paired randomization (sign-flip) test: each window's two
scores swap with probability 1/2, ``p = (1 + #{|permuted| >= |observed|}) / (1 + trials)``, with sacreBLEU's
trials, seed and +1 rule. No normality is assumed (a t-test would: per-window differences are heavy-tailed, rare
words dominate). Pooled over seeds: the seed-paired windows concatenated, as for translation. Windows of one text
are not independent (a topic spans several); no test here accounts for that."""
import logging
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .commands import write_atomic
from .config import ConfigError
from .records import read_json
from .table import fmt, mean_sd

WIDTH = 2  # decimals of a score, as `sacrebleu -w 2` prints it; p-values have sacreBLEU's 4
LM_TRIALS = 10000  # sacreBLEU's approximate randomization default
TEST_SET_KEYS = {"translation": ("data", "gen_subset", "source_lang", "target_lang"),
                 "language_modeling": ("data", "gen_subset", "tokens", "tokens_per_sample")}


@dataclass
class Run:
    """One evaluated (config, seed): its scores file's contents and folder."""
    scores: dict
    folder: Path

    @property
    def name(self) -> str:
        return self.scores["name"]

    @property
    def seed(self) -> int:
        return self.scores["seed"]

    @property
    def label(self) -> str:
        return f"{self.name} seed {self.seed}"

    def file(self, key: str) -> Path:
        """The file the scores file names under ``key``, which must exist."""
        if not self.scores.get(key):
            raise ConfigError(f"{self.label}: its scores file in {self.folder} names no {key} file; evaluate the run "
                              "again")
        path = self.folder / self.scores[key]
        if not path.is_file():
            raise ConfigError(f"{self.label}: {key} file {path} is missing; evaluate the run again")
        return path


def read_lines(path: Path) -> List[str]:
    """A text file's lines as the sacrebleu CLI reads them (split at \\n only, trailing whitespace stripped)."""
    with open(path, encoding="utf-8", newline="\n") as f:
        return [line.rstrip() for line in f]


def window_log_probs(eval_lm_output: str) -> List[float]:
    """Per window, in window order, the sum of the natural-log probabilities that fairseq-eval-lm
    ``--output-word-probs`` prints (``ID word [logprob]<tab>word [logprob]...``, one line a window, its words
    merged from BPE pieces with their summed scores): the whole window's log-probability."""
    sums: Dict[int, float] = {}
    for line in eval_lm_output.splitlines():
        # fairseq's log format (time | INFO | fairseq_cli.eval_lm | ...), or logging's default once hydra set it up
        m = re.search(r"fairseq_cli\.eval_lm(?: \| |:)(\d+) (.*)$", line)
        if m is None:
            continue
        pairs = [re.fullmatch(r".* \[(\S+)\]", field) for field in m[2].split("\t")]
        if not all(pairs):
            continue  # an other log line that starts with a number
        values = [float(p[1]) for p in pairs]
        if not all(map(math.isfinite, values)):
            raise RuntimeError(f"fairseq-eval-lm gave window {m[1]} a log-probability of {m[2]!r}")
        if int(m[1]) in sums:
            raise RuntimeError(f"fairseq-eval-lm's output scores window {m[1]} twice")
        sums[int(m[1])] = math.fsum(values)
    if sorted(sums) != list(range(len(sums))) or not sums:
        missing = sorted(set(range(max(sums, default=-1) + 1)) - set(sums))[:5]
        raise RuntimeError("fairseq-eval-lm's output has no word probabilities (--output-word-probs) of windows "
                           f"{'0..' if not sums else ', '.join(map(str, missing))}")
    return [sums[i] for i in range(len(sums))]


def randomization_seed() -> Tuple[Optional[int], str]:
    """(seed, as said) of the randomized tests: ``SACREBLEU_SEED`` (``none``: drawn from the OS), else 12345,
    as sacrebleu.significance reads it."""
    said = os.environ.get("SACREBLEU_SEED", "12345")
    return (None if said.lower() == "none" else int(said)), said.lower()


def paired_randomization(baseline: Sequence[float], system: Sequence[float], trials: int = LM_TRIALS,
                         seed: Optional[int] = None) -> float:
    """Two-sided paired randomization (sign-flip) test of ``|sum(system - baseline)|``: each pair swaps with
    probability 1/2; ``p = (1 + #{trials at least as extreme}) / (1 + trials)``."""
    diff = np.asarray(system, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)
    # a tie with the observed sum counts as at least as extreme, whatever order the sums were added in
    observed = abs(diff.sum()) - 1e-9 * np.abs(diff).sum()
    rng, extreme = np.random.default_rng(seed), 0
    for start in range(0, trials, 1000):  # 1000 trials at a time: memory of 1000 x windows signs
        signs = rng.integers(2, size=(min(1000, trials - start), len(diff))) * 2.0 - 1.0
        extreme += int(np.count_nonzero(np.abs(signs @ diff) >= observed))
    return (extreme + 1) / (trials + 1)


def signature_fields(signature: str) -> Dict[str, str]:
    """``nrefs:1|case:mixed|tok:13a|...`` -> {"nrefs": "1", "case": "mixed", ...}."""
    return dict(field.split(":", 1) for field in signature.split("|") if ":" in field)


def bleu_options(signature: str) -> Tuple[dict, List[str]]:
    """(``sacrebleu.metrics.BLEU`` arguments, sacrebleu CLI flags) of the BLEU a signature describes."""
    from sacrebleu.metrics import BLEU
    f = signature_fields(signature)
    # a tokenizer signs with its name, or its name and versions (ja-mecab-0.996-IPA)
    tokenizers = [t for t in BLEU.TOKENIZERS if f.get("tok", "").split("-")[:len(t.split("-"))] == t.split("-")]
    if f.get("nrefs") != "1" or f.get("eff") != "no" or not tokenizers or "smooth" not in f:
        raise ConfigError(f"sacreBLEU signature {signature!r}: the paired tests take corpus BLEU (eff:no) against "
                          f"one reference (nrefs:1), a tokenizer of {', '.join(BLEU.TOKENIZERS)} and a smoothing")
    tok = max(tokenizers, key=len)
    method, _, value = f["smooth"].partition("[")
    kwargs = dict(tokenize=tok, lowercase=f.get("case") == "lc", smooth_method=method,
                  smooth_value=float(value.rstrip("]")) if value else None)
    flags = ["-tok", tok, "-s", method, *(["-sv", value.rstrip("]")] if value else []),
             *(["-lc"] if kwargs["lowercase"] else [])]
    return kwargs, flags


def chrf_options(signature: str) -> Tuple[dict, List[str]]:
    """(``sacrebleu.metrics.CHRF`` arguments, sacrebleu CLI flags) of the chrF a signature describes (beta: the
    default 2, which a signature does not record)."""
    f = signature_fields(signature)
    if not {"nc", "nw", "case", "space", "eff"} <= set(f):
        raise ConfigError(f"chrF signature {signature!r}: the paired tests need its nc, nw, case, space and eff")
    kwargs = dict(char_order=int(f["nc"]), word_order=int(f["nw"]), lowercase=f["case"] == "lc",
                  whitespace=f["space"] == "yes", eps_smoothing=f["eff"] == "no")
    flags = ["-cc", f["nc"], "-cw", f["nw"], *(["--chrf-lowercase"] if kwargs["lowercase"] else []),
             *(["--chrf-whitespace"] if kwargs["whitespace"] else []),
             *(["--chrf-eps-smoothing"] if kwargs["eps_smoothing"] else [])]
    return kwargs, flags


def metric_options(run: Run, with_chrf: bool) -> Dict[str, Tuple[dict, List[str]]]:
    """metric (``bleu``, ``chrf``: sacrebleu's -m names) -> (arguments, CLI flags) of the run's scores."""
    options = {"bleu": bleu_options(run.scores.get("sacrebleu_signature") or "")}
    if with_chrf:
        options["chrf"] = chrf_options(run.scores["chrf_signature"])
    return options


def paired_tests(baseline: Sequence[str], system: Sequence[str], refs: Sequence[str],
                 options: Dict[str, Tuple[dict, List[str]]]) -> Dict[str, dict]:
    """metric name (BLEU, chrF2) -> scores, bootstrap mean and 95% CI half-width of both, p of the paired
    bootstrap (``bs_p``) and of approximate randomization (``ar_p``), and each test's signature."""
    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.significance import PairedTest
    classes = {"bleu": BLEU, "chrf": CHRF}
    metrics = {name: classes[name](references=[list(refs)], **kwargs) for name, (kwargs, _) in options.items()}
    results: Dict[str, dict] = {}
    log = logging.getLogger("sacrebleu")
    level = log.level
    for test in ("bs", "ar"):
        log.setLevel(logging.WARNING)  # its progress lines, as `sacrebleu -q`, for the time of the test
        try:
            signatures, scores = PairedTest([("baseline", baseline), ("system", system)], metrics, None,
                                            test_type=test)()
        finally:
            log.setLevel(level)
        for name, (base, sys_) in ((k, v) for k, v in scores.items() if k != "System"):
            row = results.setdefault(name, {"baseline": base.score, "system": sys_.score})
            if test == "bs":
                row.update(baseline_mean=base.mean, baseline_ci=base.ci, mean=sys_.mean, ci=sys_.ci, bs_p=sys_.p_value)
            else:
                row["ar_p"] = sys_.p_value
            row[f"{test}_signature"] = signatures[name].format()
    return results


def load_runs(out: Path) -> Dict[str, Dict[int, Run]]:
    """config name -> seed -> run, from ``out/*/scores-*.json``."""
    runs: Dict[str, Dict[int, Run]] = {}
    for path in sorted(Path(out).glob("*/scores-*.json")):
        scores = read_json(path)
        if not isinstance(scores, dict) or not all(k in scores for k in ("name", "seed", "task")):
            raise ConfigError(f"{path}: not a scores file of the driver (JSON with name, seed and task)")
        run = Run(scores, path.parent)
        if run.seed in runs.get(run.name, {}):
            raise ConfigError(f"{run.label} has two scores files: {runs[run.name][run.seed].folder} and {path}")
        runs.setdefault(run.name, {})[run.seed] = run
    if not runs:
        raise ConfigError(f"{out}: no runs there (no OUT/*/scores-*.json): `normplug-recipe reproduce CONFIGS "
                          f"--seeds 1 2 3 --out {out}` writes them")
    return runs


def check_test_set(run: Run, base: Run):
    """Refuse ``run`` unless it was evaluated on the baseline's test set (task, data folder, split, ...)."""
    for key in ("task", *TEST_SET_KEYS[base.scores["task"]]):
        if run.scores.get(key) != base.scores.get(key):
            raise ConfigError(f"{run.label} and the baseline {base.label} ran on different test sets ({key} "
                              f"{run.scores.get(key)!r} vs {base.scores.get(key)!r}): compare runs of one test set")


def check_lines(run: Run, base: Run, lines: int, base_lines: int, what: str):
    """Refuse ``run`` unless its file has as many ``what`` as the baseline's."""
    if lines != base_lines:
        raise ConfigError(f"{run.label} has {lines} {what}, the baseline {base.label} {base_lines}: not the same "
                          "test set, or an output cut short")


def pairs(runs, baseline: str) -> List[Tuple[str, List[int]]]:
    """(config, the seeds it shares with the baseline) for every other config."""
    others = [(name, sorted(set(seeds) & set(runs[baseline]))) for name, seeds in sorted(runs.items())
              if name != baseline]
    if not others:
        raise ConfigError(f"only the baseline {baseline!r} ran in the folder: nothing to compare it with")
    for name, shared in others:
        if not shared:
            said = [" ".join(map(str, sorted(runs[n]))) for n in (name, baseline)]
            raise ConfigError(f"{name} shares no seed with the baseline {baseline} (seeds {said[0]} vs {said[1]})")
    return others


def seeds_cell(seeds: Sequence[int]) -> str:
    return str(seeds[0]) if len(seeds) == 1 else "+".join(map(str, seeds)) + " (pooled)"


def compare_translation(runs, baseline: str, base0: Run, others) -> List[str]:
    refs = read_lines(base0.file("references"))
    with_chrf = all(r.scores.get("chrf") is not None and r.scores.get("chrf_signature")
                    for seeds in runs.values() for r in seeds.values())
    options = metric_options(base0, with_chrf)
    hyps: Dict[Tuple[str, int], List[str]] = {}
    for name, seeds in runs.items():
        for seed, run in seeds.items():
            run_refs = read_lines(run.file("references"))
            check_lines(run, base0, len(run_refs), len(refs), "references")
            if run_refs != refs:
                raise ConfigError(f"{run.label} and the baseline {base0.label} were scored against different "
                                  f"references ({run.file('references')} vs {base0.file('references')})")
            settings = metric_options(run, with_chrf)
            if [o[0] for o in settings.values()] != [o[0] for o in options.values()]:
                raise ConfigError(f"{run.label} was scored with other sacreBLEU settings than the baseline "
                                  f"{base0.label}: {run.scores['sacrebleu_signature']} vs "
                                  f"{base0.scores['sacrebleu_signature']}")
            hyps[name, seed] = read_lines(run.file("hypotheses"))
            check_lines(run, base0, len(hyps[name, seed]), len(refs), "hypotheses (lines)")
    tables: Dict[str, List[str]] = {}
    signatures: Dict[str, Tuple[str, str]] = {}
    for name, seeds in others:
        for group in [[s] for s in seeds] + ([seeds] if len(seeds) > 1 else []):
            results = paired_tests([h for s in group for h in hyps[baseline, s]],
                                   [h for s in group for h in hyps[name, s]], refs * len(group), options)
            for metric, r in results.items():
                signatures.setdefault(metric, (r["bs_signature"], r["ar_signature"]))
                tables.setdefault(metric, []).append(
                    f"| {name} | {seeds_cell(group)} | {fmt(r['baseline'])} | {fmt(r['baseline_mean'])} ± "
                    f"{fmt(r['baseline_ci'])} | {fmt(r['system'])} | {fmt(r['mean'])} ± {fmt(r['ci'])} | "
                    f"{r['system'] - r['baseline']:+.{WIDTH}f} | {r['bs_p']:.4f} | {r['ar_p']:.4f} |")
    flags = " ".join(flag for _, cli in options.values() for flag in cli)
    lines = []
    for metric, rows in tables.items():
        lines += [f"## {metric}: each config against the baseline {baseline}", "",
                  f"| config | seed | {metric} of {baseline} | μ ± 95% CI | {metric} of config | μ ± 95% CI | Δ | "
                  "p, paired bootstrap | p, approximate randomization |",
                  "|---|---|---|---|---|---|---|---|---|", *rows, "",
                  f"Paired bootstrap: `{signatures[metric][0]}`; approximate randomization: "
                  f"`{signatures[metric][1]}`.", ""]
    return lines + [
        "μ ± 95% CI: the mean of the bootstrap resamples' scores and half the width of their 95% interval. A pooled "
        "row tests the seed-paired outputs together; its bootstrap counts a sentence's seeds as different "
        "sentences (CI too narrow, p too small): take its approximate randomization p.", "",
        f"The same numbers: `sacrebleu REF -i BASE SYS --paired-bs -m {' '.join(options)} {flags} -w {WIDTH}` "
        "(and `--paired-ar`), REF, BASE and SYS a seed's references-*.txt and hypotheses-*.txt files; a pooled "
        "row on the seeds' hypotheses concatenated in seed order and the references repeated once a seed.", ""]


def read_log_probs(run: Run) -> List[float]:
    """The run's per-window log-probabilities (window_log_probs, one a line)."""
    path = run.file("window_log_probs")
    try:
        return [float(v) for v in path.read_text(encoding="utf-8").split()]
    except ValueError:
        raise ConfigError(f"{run.label}: {path} is not one log-probability a line") from None


def mean_pm_sd(mean: float, sd: Optional[float]) -> str:
    return fmt(mean) + ("" if sd is None else f" ± {fmt(sd)}")


def compare_language_models(runs, baseline: str, base0: Run, others) -> List[str]:
    log_probs = {(name, seed): read_log_probs(run) for name, seeds in runs.items() for seed, run in seeds.items()}
    for (name, seed), values in log_probs.items():
        check_lines(runs[name][seed], base0, len(values), len(log_probs[baseline, base0.seed]), "windows")
    seed, said = randomization_seed()
    rows = []
    for name, seeds in others:
        for group in [[s] for s in seeds] + ([seeds] if len(seeds) > 1 else []):
            p = paired_randomization([v for s in group for v in log_probs[baseline, s]],
                                     [v for s in group for v in log_probs[name, s]], LM_TRIALS, seed)
            base_ppl, base_sd, _ = mean_sd([runs[baseline][s].scores["perplexity"] for s in group])
            ppl, sd, _ = mean_sd([runs[name][s].scores["perplexity"] for s in group])
            rows.append(f"| {name} | {seeds_cell(group)} | {mean_pm_sd(base_ppl, base_sd)} | {mean_pm_sd(ppl, sd)} | "
                        f"{ppl - base_ppl:+.{WIDTH}f} | {p:.4f} |")
    return [f"## Perplexity: each config against the baseline {baseline}", "",
            f"| config | seed | perplexity of {baseline} | perplexity of config | Δ | "
            "p, paired randomization over windows |",
            "|---|---|---|---|---|---|", *rows, "",
            "A pooled row: mean ± sample sd of the seeds' perplexities; its test on the seed-paired windows "
            f"together. Paired randomization (sign-flip) test of the summed log-probability difference: {LM_TRIALS} "
            f"trials, seed {said} (SACREBLEU_SEED).", ""]


def summary(runs) -> List[str]:
    """Each config's mean ± sample sd over its seeds of the scores its scores files hold."""
    metrics = [("sacrebleu", "sacreBLEU"), ("chrf", "chrF"), ("perplexity", "perplexity")]
    rows = []
    for name, seeds in sorted(runs.items()):
        cells = []
        for key, label in metrics:
            values = [r.scores.get(key) for r in seeds.values()]
            if all(v is not None for v in values):
                mean, sd, _ = mean_sd(values)
                cells.append(f"{label} {mean_pm_sd(mean, sd)}")
        rows.append(f"| {name} | {' '.join(map(str, sorted(seeds)))} | {'; '.join(cells)} |")
    return ["| config | seeds | mean ± sample sd over seeds |", "|---|---|---|", *rows, ""]


def compare(out, baseline: str) -> List[str]:
    """Every config of ``out`` against ``baseline``: the markdown lines, also written to
    ``out/compare-<baseline>.md``; a ConfigError in one line for what cannot be compared."""
    out = Path(out)
    runs = load_runs(out)
    if baseline not in runs:
        raise ConfigError(f"--baseline {baseline!r} did not run in {out}; the configs there: {', '.join(sorted(runs))}")
    base0 = runs[baseline][min(runs[baseline])]
    task = base0.scores["task"]
    if task not in TEST_SET_KEYS:
        raise ConfigError(f"{baseline}: task {task!r} has no paired test; valid: {', '.join(TEST_SET_KEYS)}")
    for seeds in runs.values():
        for run in seeds.values():
            check_test_set(run, base0)
    others = pairs(runs, baseline)
    tests = (compare_translation if task == "translation" else compare_language_models)(runs, baseline, base0, others)
    lines = [f"# normplug: each config against {baseline}", "", *summary(runs), *tests,
             "p: the probability of a difference at least as large as the observed one if both configs were one "
             "process (two-sided); under 0.05, the difference is unlikely to be chance. It says the configs differ, "
             "not by how much: read Δ and the confidence intervals.", ""]
    write_atomic(out / f"compare-{baseline}.md", "\n".join(lines))
    return lines
