"""Several seeds end to end: `reproduce --seeds` trains and evaluates every config with every seed into its own folder,
results.csv has a row a run and results.md mean ± sd a config; `compare` on what the runs kept is what the
sacrebleu CLI prints on those files; a relaunch trains and evaluates only the runs that are missing."""
import csv
import json
import shutil
import statistics
import subprocess
import sys

import pytest

from test_compare import sacrebleu_cli, table_rows
from test_reproduce import write_config

pytestmark = pytest.mark.slow


def _driver(*args):
    proc = subprocess.run([sys.executable, "-m", "normplug.recipes", *map(str, args)], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_two_configs_two_seeds(tiny_data, tmp_path, monkeypatch):
    monkeypatch.setenv("SACREBLEU_SEED", "12345")
    ln = write_config(tmp_path, "tiny-ln", "LN", "transformer_iwslt_de_en_ln", 1.0, tiny_data)
    bn = write_config(tmp_path, "tiny-bn", "BN", "transformer_iwslt_de_en_bn", 1.0, tiny_data)
    out = tmp_path / "out"
    args = ["reproduce", ln, bn, "--seeds", "1", "2", "--out", out, "--", "--max-epoch", "1"]
    _driver(*args)
    runs = list(csv.DictReader((out / "results.csv").open(encoding="utf-8")))
    assert [(r["config"], r["seed"]) for r in runs] == [("tiny-ln", "1"), ("tiny-ln", "2"), ("tiny-bn", "1"),
                                                        ("tiny-bn", "2")]
    for r in runs:
        record = json.loads((out / f"{r['config']}-seed{r['seed']}" / "normplug-run.json").read_text())
        assert (record["seed"], record["flags"]["seed"]) == (int(r["seed"]), [r["seed"]])
    bn_runs = [r for r in runs if r["config"] == "tiny-bn"]
    assert all(r["tid_mean"] and r["tid_var"] for r in bn_runs) and not runs[0]["tid_var"]  # BN rows have TID
    md = (out / "results.md").read_text(encoding="utf-8")
    for name in ("tiny-ln", "tiny-bn"):  # mean ± sample sd (n) of the runs' scores
        ours = [float(r["ours"]) for r in runs if r["config"] == name]
        assert f"| {statistics.mean(ours):.2f} ± {statistics.stdev(ours):.2f} (n=2) |" in md
    tid = [float(r["tid_var"]) for r in bn_runs]
    assert f"/ {statistics.mean(tid):.3f} ± {statistics.stdev(tid):.3f} (n=2) |" in md

    lines = _driver("compare", "--out", out, "--baseline", "tiny-ln").splitlines()
    assert (out / "compare-tiny-ln.md").read_text(encoding="utf-8").splitlines() == lines[:-1] and lines[-1] == ""
    for seed in (1, 2):
        base, system = out / f"tiny-ln-seed{seed}", out / f"tiny-bn-seed{seed}"
        paths = (base / "references-tiny-ln.txt", base / "hypotheses-tiny-ln.txt", system / "hypotheses-tiny-bn.txt")
        (b, s), ar = sacrebleu_cli(*paths, "bs")["BLEU"], sacrebleu_cli(*paths, "ar")["BLEU"][1]
        assert table_rows(lines, "BLEU")["tiny-bn", str(seed)] == [
            f"{b['score']:.2f}", f"{b['mean']:.2f} ± {b['ci']:.2f}", f"{s['score']:.2f}",
            f"{s['mean']:.2f} ± {s['ci']:.2f}", f"{s['score'] - b['score']:+.2f}", f"{s['p_value']:.4f}",
            f"{ar['p_value']:.4f}"]
        scores = json.loads((system / "scores-tiny-bn.json").read_text())
        assert f"{scores['sacrebleu']:.2f}" == f"{s['score']:.2f}"  # the table's score is the row's

    # interrupted: one run gone; the same command trains and evaluates that one only
    shutil.rmtree(out / "tiny-bn-seed2")
    said = _driver(*args)
    assert said.count("reusing the finished run") == 3 and said.count("evaluated already") == 3
    assert "== tiny-bn: training into " + str(out / "tiny-bn-seed2") in said
    assert len(list(csv.DictReader((out / "results.csv").open(encoding="utf-8")))) == 4
