"""scripts/reproduce.sh end to end on the tiny corpus: two tiny demo-like configs,
a handful of updates each, results.md and results.csv with the expected rows/columns."""
import pytest
import csv
import json
import os
import subprocess
import sys

from conftest import REPO

from recipes import RESULT_COLUMNS

TINY_CONFIG = """\
name: {name}
dataset: tiny (tests/conftest.py)
setting: Post-Norm
norm: {norm}
paper: "test paper {norm}"
published: {published}
metric: "tokenized BLEU on the tiny test set"
data: {data}
source_lang: src
target_lang: tgt
train:
  arch: {arch}
  encoder-layers: 1
  decoder-layers: 1
  encoder-embed-dim: 16
  decoder-embed-dim: 16
  encoder-ffn-embed-dim: 32
  decoder-ffn-embed-dim: 32
  encoder-attention-heads: 2
  decoder-attention-heads: 2
  share-all-embeddings: true
  optimizer: adam
  adam-betas: "(0.9, 0.98)"
  clip-norm: 0.0
  weight-decay: 0.0001
  lr: 0.001
  lr-scheduler: inverse_sqrt
  warmup-updates: 2
  dropout: 0.1
{criterion}  max-tokens: 400
  max-epoch: 5
  seed: 1
  num-workers: 0
  log-format: simple
  log-interval: 1
evaluate:
  average_last_epochs: 2
  beam: 2
  lenpen: 1.0
  max_len_a: 1
  max_len_b: 5
  batch_size: 16
  remove_bpe: null
notes:
  - "test config"
"""


def write_config(folder, name, norm, arch, published, data, rbn=False):
    criterion = ("  criterion: label_smoothed_cross_entropy_rbn\n  label-smoothing: 0.1\n"
                 "  rbn-mean-weight: 60\n  rbn-var-weight: 0\n") if rbn else \
        "  criterion: label_smoothed_cross_entropy\n  label-smoothing: 0.1\n"
    path = folder / f"{name}.yaml"
    path.write_text(TINY_CONFIG.format(name=name, norm=norm, arch=arch, published=published,
                                       data=data, criterion=criterion))
    return path


@pytest.mark.slow
def test_reproduce_writes_results_table(tiny_data, tmp_path):
    ln = write_config(tmp_path, "tiny-ln", "LN", "transformer_iwslt_de_en_ln", 1.5, tiny_data)
    rbn = write_config(tmp_path, "tiny-rbn", "RBN", "transformer_iwslt_de_en_rbn", "null",
                       tiny_data, rbn=True)
    out = tmp_path / "out"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHON=sys.executable, PYTHONWARNINGS="ignore")
    # the configs train 5 epochs; the extra argument shortens that to 2 (~10 updates)
    proc = subprocess.run(["bash", str(REPO / "scripts" / "reproduce.sh"), str(ln), str(rbn),
                           "--out", str(out), "--", "--max-epoch", "2"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    rows = list(csv.DictReader(open(out / "results.csv", newline="")))
    assert list(rows[0]) == RESULT_COLUMNS
    assert [r["config"] for r in rows] == ["tiny-ln", "tiny-rbn"]
    for r in rows:
        assert r["status"] == "ok"
        assert r["recipe"] == "shortened (extra args: --max-epoch 2)"
        assert 0 <= float(r["tokenized_bleu"]) <= 100 and 0 <= float(r["sacrebleu"]) <= 100
        assert r["sacrebleu_signature"].startswith("nrefs:1|")
        assert r["checkpoints_averaged"] == "checkpoint1.pt checkpoint2.pt"
    assert rows[0]["published"] == "1.5"
    assert float(rows[0]["delta"]) == round(float(rows[0]["tokenized_bleu"]) - 1.5, 2)
    assert rows[1]["published"] == "" and rows[1]["delta"] == ""

    md = (out / "results.md").read_text()
    table = [line for line in md.splitlines() if line.startswith("|")]
    assert table[0] == ("| config | dataset | setting | norm | published | ours | Δ | sacreBLEU "
                        "| recipe | status |")
    assert table[2].startswith("| tiny-ln | tiny (tests/conftest.py) | Post-Norm | LN | 1.5 | ")
    assert table[3].startswith("| tiny-rbn | tiny (tests/conftest.py) | Post-Norm | RBN | — | ")
    assert len(table) == 4 and "shortened (extra args: --max-epoch 2)" in table[2]
    assert "test paper LN" in md and "nrefs:1|" in md

    # each run: 2 epoch checkpoints averaged (normplug-average), scores next to them
    for name in ("tiny-ln", "tiny-rbn"):
        run = out / name
        assert (run / "checkpoint2.pt").exists() and not (run / "checkpoint3.pt").exists()
        assert (run / "averaged_last2.pt").exists()
        scores = json.loads((run / f"scores-{name}.json").read_text())
        assert scores["sentences"] == 24
        assert scores["averaged"] == ["checkpoint1.pt", "checkpoint2.pt"]
        assert scores["tokenized_bleu"] == float(rows[[r["config"] for r in rows].index(name)]
                                                 ["tokenized_bleu"])
        # fairseq-generate's own scorer agrees with ours (same tokens, same BLEU)
        assert abs(scores["fairseq_generate_bleu"] - scores["tokenized_bleu"]) < 0.01
        log = (run / "train.log").read_text()
        assert "--max-epoch 2" in log or "max_epoch': 2" in log or "max_epoch=2" in log
    assert "rbn_penalty" in (out / "tiny-rbn" / "train.log").read_text()


@pytest.mark.slow
def test_reproduce_refuses_a_bad_config_before_training(tmp_path, tiny_data):
    good = write_config(tmp_path, "tiny-ln", "LN", "transformer_iwslt_de_en_ln", 1.5, tiny_data)
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("  beam: 2\n", ""))
    proc = subprocess.run(["bash", str(REPO / "scripts" / "reproduce.sh"), str(good), str(bad),
                           "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHON=sys.executable))
    assert proc.returncode == 2
    assert f"normplug: error: {bad}: evaluate: missing key 'beam'" in proc.stderr
    assert not (tmp_path / "out" / "tiny-ln").exists()
