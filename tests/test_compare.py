"""normplug-recipe compare: paired significance tests between the runs of a reproduction folder. Translation
rows against the sacrebleu CLI run here on the same files (every printed digit); language-model rows against
an exact enumeration of the sign-flip test; window log-probabilities against fairseq-eval-lm's own loss."""
import itertools
import json
import math
import random
import re
import statistics
import subprocess
import sys

import numpy as np
import pytest

from conftest import BIN, FIXTURES, run_cli
from normplug.recipes import compare as cmp
from normplug.recipes.config import ConfigError
from normplug.recipes.scoring import parse_eval_lm

VOCAB = [f"word{i}" for i in range(120)] + [",", ".", "?"]


def corpus(n, seed=0):
    rng = random.Random(seed)
    return [" ".join(rng.choice(VOCAB) for _ in range(rng.randint(3, 10))) for _ in range(n)]


def noisy(refs, p, seed):
    """Each word of the references replaced with probability p: a system of known quality."""
    rng = random.Random(seed)
    return [" ".join(w if rng.random() > p else rng.choice(VOCAB) for w in r.split()) for r in refs]


def write_run(out, name, seed, hyps, refs, **keys):
    """A run folder as the driver leaves it: scores-NAME.json, hypotheses-NAME.txt, references-NAME.txt."""
    from sacrebleu.metrics import BLEU, CHRF
    folder = out / f"{name}-seed{seed}"
    folder.mkdir(parents=True)
    (folder / f"hypotheses-{name}.txt").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    (folder / f"references-{name}.txt").write_text("".join(r + "\n" for r in refs), encoding="utf-8")
    bleu, chrf = BLEU(trg_lang="de"), CHRF()
    scores = {"name": name, "seed": seed, "task": "translation", "gen_subset": "test", "source_lang": "en",
              "target_lang": "de", "data": "/data/toy", "dictionaries": {"dict.en.txt": "ab", "dict.de.txt": "cd"},
              "sentences": len(hyps), "sacrebleu": round(bleu.corpus_score(hyps, [refs]).score, 2),
              "sacrebleu_signature": str(bleu.get_signature()), "chrf": round(chrf.corpus_score(hyps, [refs]).score, 2),
              "chrf_signature": str(chrf.get_signature()), "hypotheses": f"hypotheses-{name}.txt",
              "references": f"references-{name}.txt", **keys}
    (folder / f"scores-{name}.json").write_text(json.dumps(scores), encoding="utf-8")
    return folder


def table_rows(lines, metric):
    """{(config, seed cell): cells} of the table under ``## METRIC:``."""
    rows, inside = {}, False
    for line in lines:
        if line.startswith("## "):
            inside = line.startswith(f"## {metric}:")
        elif inside and line.startswith("| ") and not line.startswith(("| config", "|---")):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0], cells[1]] = cells[2:]
    return rows


def sacrebleu_cli(refs, base, system, test):
    """The sacrebleu CLI's paired test (its default JSON output): metric -> (baseline Result, system Result)."""
    proc = subprocess.run([str(BIN / "sacrebleu"), str(refs), "-i", str(base), str(system), f"--paired-{test}",
                           "-m", "bleu", "chrf", "-tok", "13a"], capture_output=True, text=True, check=True)
    base_row, sys_row = json.loads(proc.stdout)
    return {metric: (base_row[metric], sys_row[metric]) for metric in ("BLEU", "chrF2")}


@pytest.mark.slow
def test_translation_rows_are_what_the_sacrebleu_cli_prints(tmp_path, monkeypatch):
    """Two configs x two seeds of 300 sentences: every number of each seed's row and of the pooled row is the
    sacrebleu CLI's on the same files (pooled: the seeds' files concatenated, the references repeated),
    with a SACREBLEU_SEED of its own for both."""
    monkeypatch.setenv("SACREBLEU_SEED", "7")
    out, refs = tmp_path / "out", corpus(300)
    hyps = {(name, seed): noisy(refs, p, seed * 10 + i) for i, (name, p) in enumerate((("base", 0.35), ("rbn", 0.3)))
            for seed in (1, 2)}
    # a carriage return inside a line and trailing spaces: sacrebleu's CLI splits lines at \n only and strips
    # their ends, and so does compare
    hyps["rbn", 2][5] = hyps["rbn", 2][5].replace(" ", " \r", 1) + "  "
    folders = {key: write_run(out, *key, h, refs) for key, h in hyps.items()}
    lines = cmp.compare(out, "base")
    assert (out / "compare-base.md").read_text(encoding="utf-8") == "\n".join(lines)

    pooled = tmp_path / "pooled"
    pooled.mkdir()
    for name in ("base", "rbn"):
        seed_files = [folders[name, s] / f"hypotheses-{name}.txt" for s in (1, 2)]
        (pooled / name).write_bytes(b"".join(path.read_bytes() for path in seed_files))
    (pooled / "refs").write_text("".join(r + "\n" for r in refs * 2), encoding="utf-8")
    files = {"1": (folders["base", 1] / "references-base.txt", folders["base", 1] / "hypotheses-base.txt",
                   folders["rbn", 1] / "hypotheses-rbn.txt"),
             "2": (folders["base", 2] / "references-base.txt", folders["base", 2] / "hypotheses-base.txt",
                   folders["rbn", 2] / "hypotheses-rbn.txt"),
             "1+2 (pooled)": (pooled / "refs", pooled / "base", pooled / "rbn")}
    for seeds, paths in files.items():
        bs, ar = sacrebleu_cli(*paths, "bs"), sacrebleu_cli(*paths, "ar")
        for metric in ("BLEU", "chrF2"):
            (base, system), ar_system = bs[metric], ar[metric][1]
            assert ar_system["score"] == system["score"]
            assert table_rows(lines, metric)["rbn", seeds] == [
                f"{base['score']:.2f}", f"{base['mean']:.2f} ± {base['ci']:.2f}", f"{system['score']:.2f}",
                f"{system['mean']:.2f} ± {system['ci']:.2f}", f"{system['score'] - base['score']:+.2f}",
                f"{system['p_value']:.4f}", f"{ar_system['p_value']:.4f}"], (metric, seeds)
    text = "\n".join(lines)
    assert "nrefs:1|bs:1000|seed:7|case:mixed|eff:no|tok:13a" in text
    assert "nrefs:1|ar:10000|seed:7|case:mixed|eff:no|tok:13a" in text


def signed(metric) -> str:
    """A metric's signature, known once it has scored (its number of references)."""
    metric.corpus_score(["a b c"], [["a b d"]])
    return str(metric.get_signature())


def test_signature_options_are_what_sacrebleu_reads(monkeypatch):
    """bleu_options/chrf_options of a signature build the metric that signs the same, and their flags, parsed by
    the sacrebleu CLI's own parser, build it too."""
    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.sacrebleu import parse_args
    from sacrebleu.utils import args_to_dict
    for metric in (BLEU(trg_lang="de"), BLEU(lowercase=True), BLEU(tokenize="intl", smooth_method="floor",
                                                                   smooth_value=0.2),
                   BLEU(tokenize="char", smooth_method="add-k"), BLEU(tokenize="none", smooth_method="none"),
                   CHRF(), CHRF(word_order=2, lowercase=True, whitespace=True), CHRF(eps_smoothing=True)):
        name, options = ("bleu", cmp.bleu_options) if isinstance(metric, BLEU) else ("chrf", cmp.chrf_options)
        signature = signed(metric)
        kwargs, flags = options(signature)
        assert signed(type(metric)(**kwargs)) == signature
        monkeypatch.setattr(sys, "argv", ["sacrebleu", "-m", name, *flags])
        assert signed(type(metric)(**args_to_dict(parse_args(), name, strip_prefix=True))) == signature


def test_mean_sd_is_the_sample_mean_and_sd():
    values = [27.31, 28.02, 26.9]
    mean, sd, n = cmp.mean_sd(values)
    assert (n, mean, sd) == (3, pytest.approx(statistics.mean(values)), pytest.approx(statistics.stdev(values)))
    assert cmp.mean_sd([31.5]) == (31.5, None, 1)


def small_out(tmp_path, changes=None):
    """base and rbn, seeds 1 and 2, 20 sentences; ``changes[(name, seed)]`` = scores keys for that run."""
    out, refs = tmp_path / "out", corpus(20)
    for i, key in enumerate(itertools.product(("base", "rbn"), (1, 2))):
        write_run(out, *key, noisy(refs, 0.3, i), refs, **(changes or {}).get(key, {}))
    return out


def refused(out, baseline="base"):
    with pytest.raises(ConfigError) as err:
        cmp.compare(out, baseline)
    assert "\n" not in str(err.value) and not list(out.glob("compare-*.md"))
    return str(err.value)


def test_refuses_a_folder_without_runs(tmp_path):
    (tmp_path / "out" / "empty").mkdir(parents=True)
    assert "no runs there" in refused(tmp_path / "out")


def test_refuses_a_baseline_that_did_not_run(tmp_path):
    assert refused(small_out(tmp_path), "post-bn").endswith("--baseline 'post-bn' did not run in "
                                                             f"{tmp_path / 'out'}; the configs there: base, rbn")


def test_refuses_runs_on_other_data(tmp_path):
    message = refused(small_out(tmp_path, {("rbn", 2): {"data": "/data/other"}}))
    assert message.startswith("rbn seed 2 and the baseline base seed 1 ran on different test sets (data '/data/other'")


def test_refuses_a_language_model_among_translations(tmp_path):
    out = small_out(tmp_path)
    write_lm_run(out, "ptb-post-bn", 1, [-60.0] * 6, 120.5)
    assert refused(out).startswith("ptb-post-bn seed 1 and the baseline base seed 1 ran on different test sets "
                                   "(task 'language_modeling' vs 'translation')")


def test_refuses_runs_scored_with_other_sacrebleu_settings(tmp_path):
    from sacrebleu.metrics import BLEU
    out = small_out(tmp_path, {("rbn", 1): {"sacrebleu_signature": signed(BLEU(lowercase=True))}})
    assert refused(out).startswith("rbn seed 1 was scored with other sacreBLEU settings than the baseline base seed 1")


def test_refuses_runs_scored_against_other_references(tmp_path):
    out = small_out(tmp_path)
    path = out / "rbn-seed1" / "references-rbn.txt"
    path.write_text(path.read_text().replace("word", "Word", 1))
    assert refused(out).startswith("rbn seed 1 and the baseline base seed 1 were scored against different references")


def test_refuses_missing_hypotheses(tmp_path):
    out = small_out(tmp_path)
    (out / "rbn-seed2" / "hypotheses-rbn.txt").unlink()
    assert refused(out) == f"rbn seed 2: hypotheses file {out / 'rbn-seed2' / 'hypotheses-rbn.txt'} is missing; " \
                           "evaluate the run again"


def test_refuses_hypotheses_cut_short(tmp_path):
    out = small_out(tmp_path)
    path = out / "base-seed2" / "hypotheses-base.txt"
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:-1]))
    assert refused(out).startswith("base seed 2 has 19 hypotheses (lines), the baseline base seed 1 20")


def test_refuses_a_config_that_shares_no_seed(tmp_path):
    out = small_out(tmp_path)
    for folder in ("rbn-seed1", "rbn-seed2"):
        scores = json.loads((out / folder / "scores-rbn.json").read_text())
        (out / folder / "scores-rbn.json").write_text(json.dumps({**scores, "seed": scores["seed"] + 2}))
    assert refused(out) == "rbn shares no seed with the baseline base (seeds 3 4 vs 1 2)"


# --------------------------------------------------------------------------- language models
def exact_sign_flip_p(base, system):
    """P(|sum of randomly signed differences| >= |observed sum|), every sign pattern enumerated."""
    diff = np.subtract(system, base)
    observed = abs(diff.sum())
    hits = sum(abs(np.dot(signs, diff)) >= observed - 1e-9 for signs in itertools.product((-1, 1), repeat=len(diff)))
    return hits / 2 ** len(diff)


def test_paired_randomization_agrees_with_the_exact_test():
    rng = np.random.default_rng(3)
    base = rng.normal(-60, 5, 12)
    for shift in (0.0, 1.5, 4.0):
        system = base + shift + rng.normal(0, 3, 12)
        assert cmp.paired_randomization(base, system, seed=1) == pytest.approx(exact_sign_flip_p(base, system),
                                                                              abs=0.015)
    assert cmp.paired_randomization(base, base, seed=1) == 1.0  # no difference: every trial ties it


def write_lm_run(out, name, seed, log_probs, perplexity, **keys):
    folder = out / f"{name}-seed{seed}"
    folder.mkdir(parents=True)
    (folder / f"log-probs-{name}.txt").write_text("".join(f"{v!r}\n" for v in log_probs))
    (folder / f"scores-{name}.json").write_text(json.dumps({
        "name": name, "seed": seed, "task": "language_modeling", "gen_subset": "test", "data": "/data/ptb",
        "dictionaries": {"dict.txt": "ef"}, "perplexity": perplexity, "tokens": 96,
        "window_log_probs": f"log-probs-{name}.txt", **keys}))


def test_language_model_rows(tmp_path):
    """Perplexity mean ± sample sd over seeds, and the sign-flip test on the seed-paired windows (pooled: the
    two seeds' windows together) within Monte Carlo error of the exact test."""
    rng, out = np.random.default_rng(0), tmp_path / "out"
    windows = {(name, seed): list(rng.normal(-60 + shift, 4, 6)) for name, shift in (("base", 0), ("rbn", 2))
               for seed in (1, 2)}
    perplexity = {("base", 1): 120.5, ("base", 2): 118.25, ("rbn", 1): 110.0, ("rbn", 2): 114.75}
    for key, values in windows.items():
        write_lm_run(out, *key, values, perplexity[key])
    rows = table_rows(cmp.compare(out, "base"), "Perplexity")
    for seeds, cell in (([1], "1"), ([2], "2"), ([1, 2], "1+2 (pooled)")):
        base_ppl, system_ppl = ([perplexity[name, s] for s in seeds] for name in ("base", "rbn"))
        said = [f"{statistics.mean(v):.2f}" + (f" ± {statistics.stdev(v):.2f}" if len(v) > 1 else "")
                for v in (base_ppl, system_ppl)]
        assert rows["rbn", cell][:3] == [*said, f"{statistics.mean(system_ppl) - statistics.mean(base_ppl):+.2f}"]
        exact = exact_sign_flip_p([v for s in seeds for v in windows["base", s]],
                                  [v for s in seeds for v in windows["rbn", s]])
        assert float(rows["rbn", cell][3]) == pytest.approx(exact, abs=0.015)
    (out / "compare-base.md").unlink()
    (out / "rbn-seed2" / "log-probs-rbn.txt").write_text("-60.0\n" * 5)
    assert refused(out).startswith("rbn seed 2 has 5 windows, the baseline base seed 1 6")


def test_window_log_probs_add_up_to_fairseq_eval_lms_loss():
    """A real fairseq-eval-lm --output-word-probs transcript (a 1-layer LM after 2 updates, 16-token windows of
    the toy corpus; its windows in batch order): the windows' log-probabilities in id order add up to the loss it
    reports, tokens x bits x ln 2 (4 printed decimals of bits, 6 of each log-probability)."""
    text = (FIXTURES / "eval-lm-word-probs.log").read_text()
    check_against_loss(text)
    # fairseq's own log format, as fairseq-eval-lm prints it when nothing configured logging before
    piped = re.sub(r"(?m)^INFO:([\w.]+):", r"2026-12-07 18:51:12 | INFO | \1 | ", text)
    assert cmp.window_log_probs(piped) == cmp.window_log_probs(text)
    first = [line for line in text.splitlines() if re.match(r"INFO:fairseq_cli\.eval_lm:0 ", line)]
    assert cmp.window_log_probs(text)[0] == pytest.approx(sum(map(float, re.findall(r"\[(\S+)\]", first[0]))))
    with pytest.raises(RuntimeError, match="no word probabilities .* of windows 0"):
        cmp.window_log_probs(text.replace("eval_lm:0 w21", "eval_lm:x w21"))


def check_against_loss(text):
    sums = cmp.window_log_probs(text)
    tokens, bits = parse_eval_lm(text)
    assert len(sums) == math.ceil(tokens / 16)
    assert -sum(sums) == pytest.approx(tokens * bits * math.log(2), abs=tokens * (5e-7 + 5e-5 * math.log(2)))


@pytest.mark.slow
def test_window_log_probs_of_a_real_eval_lm_run(lm_data, tmp_path):
    """fairseq-train for 2 updates, then fairseq-eval-lm --sample-break-mode none --output-word-probs, as the
    driver scores a language model: the parsed windows add up to the loss it reports."""
    run_cli("fairseq-train", lm_data, "--task", "language_modeling", "--arch", "transformer_lm",
            "--decoder-layers", "1", "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "32",
            "--decoder-attention-heads", "2", "--tokens-per-sample", "16", "--sample-break-mode", "none",
            "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "256", "--max-update", "2", "--cpu",
            "--save-dir", tmp_path, "--no-progress-bar", "--num-workers", "0", "--data-buffer-size", "0",
            "--no-epoch-checkpoints")
    proc = run_cli("fairseq-eval-lm", lm_data, "--path", tmp_path / "checkpoint_last.pt", "--cpu", "--gen-subset",
                   "test", "--sample-break-mode", "none", "--tokens-per-sample", "16", "--batch-size", "4",
                   "--no-progress-bar", "--output-word-probs")
    check_against_loss(proc.stdout + proc.stderr)
