"""The arguments after ``--``: each flag that changes what is evaluated or how is understood by the driver (the
split's own references and scores file, the direction trained, the seed) or refused in one line naming the config
key; training, evaluation, the run record and the table see the same facts. fairseq itself is faked here."""
import json
import shutil

import pytest

from test_recipes import GOOD, value, variant

from normplug import recipes
from normplug.recipes import ConfigError, load_config
from normplug.recipes.passthrough import EVALUATE_KEYS
from normplug.recipes.runs import epoch_progress, scores_path


@pytest.fixture
def good(tmp_path, tiny_data):
    """The demo config on a copy of the tiny corpus."""
    shutil.copytree(tiny_data, tmp_path / "data")
    path = tmp_path / "good.yaml"
    path.write_text(GOOD.replace("data: demo-out/data-bin/synthetic", f"data: {tmp_path / 'data'}"))
    return path


def test_direction_and_seed_are_the_recipe_s(good):
    """--source-lang/--target-lang and --seed change the recipe itself: fairseq-train and fairseq-generate get the
    same direction, the seed appears once, and neither counts as an extra argument of the run."""
    r = recipes.with_training_arguments(load_config(good), ["--source-lang", "tgt", "--target-lang", "src",
                                                            "--seed", "7", "--lr", "0.5"])
    assert (r.source_lang, r.target_lang, r.seed, r.train_extra) == ("tgt", "src", 7, ("--lr", "0.5"))
    train = recipes.train_argv(r, "x", gpu=False, exe=False)
    assert (value(train, "--source-lang"), value(train, "--target-lang"), value(train, "--seed")) == ("tgt", "src", "7")
    assert train.count("--seed") == 1 and train.count("--source-lang") == 1
    generate = recipes.generate_argv(r, "c.pt", gpu=False)
    assert (value(generate, "--source-lang"), value(generate, "--target-lang")) == ("tgt", "src")
    assert r.detok_lang == "en"  # the config names it; a config without detok_lang follows the target
    with pytest.raises(ConfigError, match="--source-lang and --target-lang are both 'src'"):
        recipes.with_training_arguments(load_config(good), ["--target-lang", "src"])


@pytest.mark.parametrize("flag, said", [
    ("--task", "set train: task in a config"), ("--user-dir", "the driver adds the plugin directory"),
    ("--save-dir", "the run goes to --out OUT"), ("--path", "--checkpoint FILE"), ("--data", "give the driver --data")])
def test_flags_the_driver_owns_are_refused_in_both_phases(good, flag, said):
    for merge in (recipes.with_training_arguments, recipes.with_evaluation_arguments):
        with pytest.raises(ConfigError) as err:
            merge(load_config(good), [flag, "x"])
        assert str(err.value).startswith(f"{flag} after --: ") and said in str(err.value)


@pytest.mark.parametrize("flag", sorted(EVALUATE_KEYS))
def test_evaluation_flags_that_change_scores_name_their_config_key(good, flag):
    with pytest.raises(ConfigError) as err:
        recipes.with_evaluation_arguments(load_config(good), [f"--{flag}", "4"])
    assert str(err.value) == (f"--{flag} after -- changes the scores: set evaluate: {EVALUATE_KEYS[flag]} in a config "
                              "(a config with `base: CONFIG` and the key overrides it), so that its scores say so")


@pytest.mark.parametrize("flag", ["--nbest", "--results-path", "--quiet", "--skip-invalid-size-inputs-valid-test",
                                  "--scoring", "--sacrebleu", "--required-batch-size-multiple"])
def test_other_evaluation_flags_are_refused(good, flag):
    """What would drop sentences, hide hypotheses or score otherwise: refused, with the flags that pass."""
    with pytest.raises(ConfigError, match=rf"^{flag} after --: the driver passes fairseq-generate and fairseq-eval-lm "
                                          r"only --gen-subset, --source-lang, --target-lang and what changes speed"):
        recipes.with_evaluation_arguments(load_config(good), [flag])


def test_a_training_cannot_name_the_split_its_table_scores(good):
    with pytest.raises(ConfigError, match=r"^--gen-subset after -- of a training: the table scores the config's "
                                          r"split; score another with `normplug-recipe evaluate CONFIG -- "):
        recipes.with_training_arguments(load_config(good), ["--gen-subset", "valid"])


def test_speed_flags_pass_and_the_split_is_understood(good, tmp_path):
    r = recipes.with_evaluation_arguments(load_config(good), ["--gen-subset", "valid", "--fp16", "--max-tokens", "99"])
    argv = recipes.generate_argv(r, "c.pt", gpu=True)
    assert value(argv, "--gen-subset") == "valid" and argv.count("--gen-subset") == 1
    assert "--fp16" in argv and value(argv, "--max-tokens") == "99"
    assert scores_path(r, tmp_path).name == "scores-demo-bn-valid.json"
    assert scores_path(load_config(good), tmp_path).name == "scores-demo-bn.json"
    text = recipes.with_evaluation_arguments(load_config(good), ["--gen-subset", "valid"])
    text.evaluate["raw_references"] = True
    assert recipes.config.raw_references_path(text).name == "valid.tgt"  # the split's own references


def _generated(n):  # fairseq-generate's output: every sentence decoded as its reference
    return "".join(f"T-{i}\tw{i} x\nH-{i}\t-0.1\tw{i} x\n" for i in range(n))


@pytest.fixture
def trained_run(good, tmp_path, monkeypatch):
    """A finished run of ``good`` (a run record and a checkpoint, no real training), fairseq-generate faked: it
    decodes whatever split it is asked; calls: the argv of each fairseq-generate."""
    recipe = load_config(good)
    run = tmp_path / "runs" / recipe.name
    run.mkdir(parents=True)
    (run / "checkpoint1.pt").write_bytes(b"")
    calls = []

    def generate(argv, what, log):
        calls.append(argv)
        return _generated(5 if value(argv, "--gen-subset") == "test" else 3)
    monkeypatch.setattr("normplug.recipes.scoring.run_checked", generate)
    monkeypatch.setattr("normplug.recipes.runs.measure_tid", lambda *a, **k: {})

    def record(**changes):
        trained = recipes.with_training_arguments(recipe, changes.pop("extra", []))
        identity = recipes.data_identity(trained)
        (run / recipes.RUN_RECORD).write_text(json.dumps({
            "flags": recipes.merged_flags(trained), "extra": list(trained.train_extra), "seed": trained.seed,
            "source_lang": trained.source_lang, "target_lang": trained.target_lang, "rc": 0, **identity}))
    record()
    return run, calls, record


def test_a_valid_score_never_lands_in_the_test_column(good, trained_run, tmp_path):
    run, calls, _ = trained_run
    out = str(run.parent)
    assert recipes.main(["evaluate", str(good), "--out", out]) == 0
    assert recipes.main(["evaluate", str(good), "--out", out, "--", "--gen-subset", "valid"]) == 0
    test, valid = (json.loads((run / name).read_text()) for name in ("scores-demo-bn.json", "scores-demo-bn-valid.json"))
    assert (test["gen_subset"], test["sentences"], valid["gen_subset"], valid["sentences"]) == ("test", 5, "valid", 3)
    assert (run / "hypotheses-demo-bn-valid.txt").read_text().count("\n") == 3
    assert recipes.main(["table", str(good), "--out", out]) == 0
    row = (run.parent / "results.md").read_text()
    assert "| test src→tgt: average of the last 1 epoch checkpoints | full |" in row


def test_a_model_is_evaluated_in_the_direction_it_was_trained(good, trained_run, capsys):
    """A run trained tgt→src is decoded tgt→src with the src references, by `evaluate` without flags; asking the
    other direction is refused; the table says the run is not the config's."""
    run, calls, record = trained_run
    record(extra=["--source-lang", "tgt", "--target-lang", "src"])
    out = str(run.parent)
    assert recipes.main(["evaluate", str(good), "--out", out]) == 0
    assert (value(calls[-1], "--source-lang"), value(calls[-1], "--target-lang")) == ("tgt", "src")
    scores = json.loads((run / "scores-demo-bn.json").read_text())
    assert (scores["source_lang"], scores["target_lang"]) == ("tgt", "src")
    assert recipes.main(["evaluate", str(good), "--out", out, "--", "--source-lang", "src", "--target-lang", "tgt"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        f"{run} holds a model trained tgt→src: it cannot be evaluated src→tgt (leave --source-lang/--target-lang out)")
    assert recipes.main(["table", str(good), "--out", out]) == 0
    md = (run.parent / "results.md").read_text()
    assert "| test tgt→src: average of the last 1 epoch checkpoints | modified (direction tgt→src, the config's " \
           "src→tgt) |" in md


def test_a_run_of_changed_data_is_stale_in_the_table(good, trained_run, tmp_path, tiny_data):
    """`table --data` compares the data with the run's record: after the folder changed (its prepare.json digest),
    the row is stale, not modified or full."""
    run, calls, _ = trained_run
    data = tmp_path / "other"
    shutil.copytree(tiny_data, data)
    (data / "prepare.json").write_text(json.dumps({"data_digest": "aaaa"}))
    recipe = recipes.with_training_arguments(load_config(good, data), [])
    (run / recipes.RUN_RECORD).write_text(json.dumps({
        "flags": recipes.merged_flags(recipe), "extra": [], "seed": 1, "source_lang": "src", "target_lang": "tgt",
        "rc": 0, **recipes.data_identity(recipe)}))
    out = str(run.parent)
    assert recipes.main(["evaluate", str(good), "--data", str(data), "--out", out]) == 0
    assert recipes.main(["table", str(good), "--data", str(data), "--out", out]) == 0
    assert "| full |" in (run.parent / "results.md").read_text()
    (data / "prepare.json").write_text(json.dumps({"data_digest": "bbbb"}))  # prepared again, other text
    assert recipes.main(["table", str(good), "--data", str(data), "--out", out]) == 0
    assert f"| stale: the data in {data} changed after this run (data_digest) |" in (run.parent / "results.md").read_text()


def test_a_failing_fairseq_generate_is_its_own_last_error_line(good, tmp_path, monkeypatch, capsys):
    fake = tmp_path / "fairseq-generate"
    fake.write_text("#!/bin/sh\necho 'Traceback (most recent call last):'\necho '  File \"x.py\", line 1'\n"
                    "echo 'Exception: Size of sample #3 is invalid (=(1355, 2043)) since max_positions=(1024, 1024), "
                    "skip this example with --skip-invalid-size-inputs-valid-test'\n"
                    "echo \"{'_name': None, 'common': {'no_progress_bar': False}}\"\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr("normplug.recipes.commands.fairseq_exe", lambda tool: str(fake))
    with pytest.raises(RuntimeError) as err:
        recipes.commands.run_checked([str(fake)], "fairseq-generate", tmp_path / "log.txt")
    assert str(err.value) == ("fairseq-generate failed (exit 1): Exception: Size of sample #3 is invalid (=(1355, "
                              "2043)) since max_positions=(1024, 1024), skip this example with "
                              f"--skip-invalid-size-inputs-valid-test (full log: {tmp_path / 'log.txt'})")


def test_training_progress_is_one_line_an_epoch(tmp_path):
    said = []
    echo = epoch_progress("demo-bn", tmp_path / "train.log", said.append)
    for line in [
        "2026-12-07 10:00:01 | INFO | train_inner | epoch 001:     50 / 66 loss=9.1, num_updates=50",
        "2026-12-07 10:00:02 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 8.512 | nll_loss 8.1 | "
        "num_updates 66",
        "2026-12-07 10:00:02 | INFO | train | epoch 001 | loss 9.034 | nll_loss 8.9 | wps 100 | num_updates 66 | lr 1",
        "2026-12-07 10:00:03 | INFO | train | epoch 002 | loss 7.5 | nll_loss 7 | num_updates 132 | lr 1"]:
        echo(line + "\n")
    assert said == [f"== demo-bn: epoch 1: 66 updates, loss 9.034, valid loss 8.512 (log: {tmp_path / 'train.log'})",
                    f"== demo-bn: epoch 2: 132 updates, loss 7.5, valid loss — (log: {tmp_path / 'train.log'})"]


def test_every_refusal_exits_2(good, trained_run, capsys):
    """A refusal of the driver exits 2 (a failed run 1), the reference count's included."""
    run, calls, _ = trained_run
    text = variant(("  remove_bpe: null ", "  remove_bpe: sentencepiece "), ("  detok_lang: en\n", "  raw_references: true\n"),
                   text=good.read_text())
    good.write_text(text)
    raw = load_config(good).data_path / "raw"
    raw.mkdir(exist_ok=True)
    (raw / "test.tgt").write_text("only one line\n")
    assert recipes.main(["evaluate", str(good), "--out", str(run.parent)]) == 2
    assert "fairseq-generate decoded 5 sentences of the test split" in capsys.readouterr().err


def test_the_driver_trains_batches_a_resume_rebuilds(good):
    """Every fairseq-train the driver starts builds each epoch's batches from seed + epoch, so that a run resumed
    from any checkpoint, the end of an epoch included, is the uninterrupted one (tests/test_resume.py)."""
    argv = recipes.train_argv(load_config(good), "x", gpu=False, exe=False)
    assert value(argv, "--update-epoch-batch-itr") == "True"


def test_seeds_are_different_whole_numbers(good, capsys):
    assert recipes.main(["train", str(good), "--seeds", "1", "1", "--dry-run"]) == 2
    assert capsys.readouterr().err.strip() == "normplug-recipe: error: --seeds 1 1: give different whole numbers >= 0"
    assert recipes.main(["train", str(good), "--seeds", "1", "2", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [value(line.split(), "--seed") for line in lines[1:]] == ["1", "2"]
    assert [value(line.split(), "--save-dir").rsplit("/", 1)[1] for line in lines[1:]] == ["demo-bn-seed1",
                                                                                          "demo-bn-seed2"]
