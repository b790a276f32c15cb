"""The one driver of the recipes: a config (``configs/*.yaml``) -> fairseq-train, the checkpoint
it evaluates, its scores, and the reproduction table. ``scripts/train.sh``, ``evaluate.sh``,
``reproduce.sh`` and ``demo.py`` all go through the functions here; ``python
scripts/recipes.py {train,evaluate,reproduce,argv,check} -h`` gives the command lines.

A config is one published row, a YAML mapping (TOP_KEYS, and its task's keys: TASKS):
``name`` (its run folder), ``dataset``, ``setting``, ``norm``, ``paper``, ``published`` (or
null), ``metric``, ``data`` (relative to the repository root), ``train`` (fairseq-train options
``flag: value``; true: a bare flag, false or null: left out; fairseq's parser checks them, the
driver adds those of RESERVED_TRAIN; ``task`` picks fairseq's task, translation by default),
``evaluate`` (the checkpoint evaluated and how it is scored: the task's evaluate keys),
``provenance`` (the Markdown file, beside the config, that gives the release's file:line for its
values, what differs and the table of its figure) and optionally ``shares_training_with`` (the
config whose run this one evaluates). Translation adds ``source_lang`` and ``target_lang``.
``base: FILE`` (relative to the config's folder) reads FILE first: mappings merge key by key,
the config's value wins, any other value replaces the base's; a base may have a base.
"""
import argparse
import contextlib
import csv
import datetime
import io
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]
PLUGIN_DIR = REPO / "normplug"
PROG = "normplug"
RUN_RECORD = "normplug-run.json"  # in a save dir: the flags, device and exit status of its run

REQUIRED = object()
# key -> (default or REQUIRED, allowed types); each task adds its own (TASKS)
TOP_KEYS = {key: (REQUIRED, (str,)) for key in (
    "name", "dataset", "setting", "norm", "paper", "metric", "data")}
TOP_KEYS.update(published=(REQUIRED, (int, float, type(None))), train=(REQUIRED, (dict,)),
                evaluate=(REQUIRED, (dict,)), provenance=(REQUIRED, (str,)),
                shares_training_with=(None, (str, type(None))))
CHECKPOINT_KEYS = {
    # which checkpoint is evaluated: exactly one of the three (CHECKPOINT_CHOICES)
    "checkpoint": (None, (str, type(None))),           # best | last
    "average_last_epochs": (None, (int, type(None))),  # the last N checkpointE.pt
    "average_last_updates": (None, (int, type(None))), # the last N checkpoint_E_U.pt
}
TRANSLATION_EVALUATE_KEYS = {
    **CHECKPOINT_KEYS,
    "gen_subset": ("test", (str,)),
    "beam": (REQUIRED, (int,)),
    "lenpen": (REQUIRED, (int, float)),
    "max_len_a": (REQUIRED, (int, float)),
    "max_len_b": (REQUIRED, (int,)),
    "batch_size": (128, (int,)),
    "remove_bpe": (REQUIRED, (str, type(None))),     # fairseq --remove-bpe value; null = none
    "lowercase": (False, (bool,)),                   # lowercase hyps and refs (both BLEUs)
    "compound_split": (False, (bool,)),              # ##AT##-##AT## splitting (WMT)
    "model_overrides": (None, (dict, type(None))),   # fairseq-generate --model-overrides
    "detok_lang": (None, (str, type(None))),         # sacremoses language (default target_lang)
    # sacreBLEU's references: a sacrebleu test set (wmt14/full), or null: the binarized test set's
    "sacrebleu_test_set": (None, (str, type(None))),
}
LM_EVALUATE_KEYS = {
    **CHECKPOINT_KEYS,
    "gen_subset": ("test", (str,)),
    "batch_size": (10, (int,)),                      # fairseq-eval-lm --batch-size (windows)
    # the second figure, fairseq's sliding window: each window of the training length scores
    # its last (length - context_window) tokens with the context_window tokens before it
    "context_window": (REQUIRED, (int,)),
}
CHECKPOINT_CHOICES = tuple(CHECKPOINT_KEYS)
RESERVED_TRAIN = {
    "user-dir": "the driver adds the plugin directory",
    "save-dir": "chosen per run (--save-dir on the command line)",
    "cpu": "the driver adds it when no GPU is available",
    "distributed-world-size": "the driver's --gpus N sets it (default 1, as the papers trained)",
    "bn-sync-stats": "a choice of multi-GPU runs: the driver's --bn-sync-stats, with --gpus N",
    "source-lang": "use the top-level key source_lang",
    "target-lang": "use the top-level key target_lang",
    "data": "use the top-level key data",
}


class ConfigError(Exception):
    """A config or a command line is wrong; the message is one line."""


@dataclass
class Recipe:
    path: Path
    name: str
    dataset: str
    setting: str
    norm: str
    paper: str
    published: Optional[float]
    metric: str
    data: str
    train: Dict[str, object]
    evaluate: Dict[str, object]
    provenance: str
    shares_training_with: Optional[str] = None
    source_lang: Optional[str] = None  # translation
    target_lang: Optional[str] = None

    @property
    def training_name(self) -> str:
        """Name of the training run: this config's, or the one it shares."""
        return self.shares_training_with or self.name

    @property
    def task(self) -> str:
        return task_name(self.train)

    def train_value(self, flag: str):
        """A train: value, written with dashes or underscores."""
        return self.train.get(flag, self.train.get(flag.replace("-", "_")))

    def data_path(self, override=None) -> Path:
        return Path(override).resolve() if override else REPO / self.data

    def default_save_dir(self) -> Path:
        return REPO / "checkpoints" / self.training_name


# ----------------------------------------------------------------------------- configs

def _checked(where: str, given: dict, spec: dict) -> dict:
    """``given`` against ``spec`` ({key: (default or REQUIRED, types)}), defaults filled in."""
    valid = ", ".join(spec)
    for key in given:
        if key not in spec:
            raise ConfigError(f"{where}unknown key {key!r} (valid keys: {valid})")
    out = {}
    for key, (default, types) in spec.items():
        if key not in given:
            if default is REQUIRED:
                raise ConfigError(f"{where}missing key {key!r} (valid keys: {valid})")
            out[key] = default
            continue
        value = out[key] = given[key]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            names = {int: "integer", float: "number", str: "string", dict: "mapping",
                     list: "list", bool: "true/false", type(None): "null"}
            raise ConfigError(f"{where}key {key!r} must be a {' or '.join(names[t] for t in types)}, "
                              f"got {type(value).__name__} {value!r}")
    return out


def task_name(train) -> str:
    """The fairseq task of a config's ``train:`` mapping (translation unless it says)."""
    return str(train.get("task", "translation")) if isinstance(train, dict) else "translation"


def _read_mapping(path: Path) -> dict:
    """One YAML file as a mapping; a key given twice in one mapping is refused."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise ConfigError(f"{path}: duplicate key {key!r} (line {key_node.start_mark.line + 1})")
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=UniqueKeyLoader)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(err).split())}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: must be a YAML mapping with keys {', '.join(TOP_KEYS)}")
    return raw


def _merge(base: dict, child: dict) -> dict:
    """Mappings merge key by key (the child wins); any other child value replaces the base's."""
    out = dict(base)
    for key, value in child.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merge(out[key], value) if both else value
    return out


def merged_mapping(path, _chain=()) -> dict:
    """A config file with its ``base:`` chain merged in and the ``base`` key removed."""
    path = Path(path)
    raw = _read_mapping(path)
    if "base" not in raw:
        return raw
    base = raw.pop("base")
    if not isinstance(base, str):
        raise ConfigError(f"{path}: key 'base' must be a file name relative to {path.parent}, got {base!r}")
    base_path = path.parent / base
    if not base_path.is_file():
        raise ConfigError(f"{path}: base file {base_path} not found")
    if base_path.resolve() in _chain:
        raise ConfigError(f"{path}: base file {base_path} is its own base")
    return _merge(merged_mapping(base_path, _chain + (path.resolve(),)), raw)


def load_config(path) -> Recipe:
    """Read one config and check what its format owns; fairseq's flags are fairseq's to check."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    raw = merged_mapping(path)
    name = task_name(raw.get("train"))
    if name not in TASKS:
        raise ConfigError(f"{path}: train: task {name!r} has no recipes here (known: {', '.join(TASKS)})")
    task = TASKS[name]
    top = _checked(f"{path}: ", raw, {**TOP_KEYS, **task.top_keys})
    for key in ("name", "shares_training_with"):
        if top[key] is not None and not re.fullmatch(r"[A-Za-z0-9._-]+", top[key]):
            raise ConfigError(f"{path}: key {key!r} must be a folder name (letters, digits, '.', "
                              f"'_', '-'), got {top[key]!r}")
    for key, value in top["train"].items():
        if str(key).replace("_", "-") in RESERVED_TRAIN:
            raise ConfigError(f"{path}: train: {key!r} may not be set here: "
                              f"{RESERVED_TRAIN[str(key).replace('_', '-')]}")
        if isinstance(value, dict):
            raise ConfigError(f"{path}: train: {key!r} must be a value or a list, got a mapping")
    ev = _checked(f"{path}: evaluate: ", top["evaluate"], task.evaluate_keys)
    chosen = [k for k in CHECKPOINT_CHOICES if ev[k] is not None]
    if len(chosen) != 1:
        raise ConfigError(f"{path}: evaluate: set exactly one of {', '.join(map(repr, CHECKPOINT_CHOICES))} "
                          f"(which checkpoint is evaluated), got {' and '.join(map(repr, chosen)) or 'none'}")
    if ev["checkpoint"] not in (None, "best", "last"):
        raise ConfigError(f"{path}: evaluate: 'checkpoint' must be one of best, last, got {ev['checkpoint']!r}")
    for key in ("average_last_epochs", "average_last_updates", "beam", "batch_size"):
        if ev.get(key) is not None and ev[key] < 1:
            raise ConfigError(f"{path}: evaluate: {key!r} must be >= 1, got {ev[key]}")
    top.update(evaluate=ev, path=path)
    top["published"] = None if top["published"] is None else float(top["published"])
    recipe = Recipe(**top)
    task.check(recipe)
    return recipe


def check_translation(recipe: Recipe):
    """The translation part of a config: sacreBLEU's language and references."""
    ev = recipe.evaluate
    ev["detok_lang"] = ev["detok_lang"] or recipe.target_lang
    if ev["sacrebleu_test_set"] is not None:
        from sacrebleu.dataset import DATASETS

        test_set, pair = ev["sacrebleu_test_set"], f"{recipe.source_lang}-{recipe.target_lang}"
        if test_set not in DATASETS:
            raise ConfigError(f"{recipe.path}: evaluate: sacrebleu_test_set {test_set!r} is not a sacrebleu "
                              "test set (list them: sacrebleu --list)")
        if pair not in DATASETS[test_set].langpairs:
            raise ConfigError(f"{recipe.path}: evaluate: sacrebleu test set {test_set!r} has no language "
                              f"pair {pair!r}")


def check_language_model(recipe: Recipe):
    """The language-model part of a config: evaluation windows of the training length, so
    train: must say that length, and the sliding window's context must fit in it."""
    length, context = recipe.train_value("tokens-per-sample"), recipe.evaluate["context_window"]
    if not isinstance(length, int) or isinstance(length, bool) or length < 2:
        raise ConfigError(f"{recipe.path}: train: 'tokens-per-sample' must be set to the training length "
                          f"(an integer >= 2; evaluation uses windows of that length), got {length!r}")
    if not 1 <= context < length:
        raise ConfigError(f"{recipe.path}: evaluate: 'context_window' must be in 1 .. {length - 1} (the "
                          f"training length {length} minus at least one scored token), got {context}")


# ----------------------------------------------------------------------------- command lines

def _words(value) -> Optional[List[str]]:
    """A config value as argv words; None = leave the flag out."""
    if value is True:
        return []
    if value is False or value is None:
        return None
    # repr of a float is exact and what argparse's float() reads back (0.0005, 1e-07)
    return [repr(v) if isinstance(v, float) else str(v) for v in (value if isinstance(value, list) else [value])]


def split_extra(tokens: Sequence[str]) -> List[Tuple[str, List[str]]]:
    """``['--lr', '1e-3', '--cpu']`` -> ``[('lr', ['1e-3']), ('cpu', [])]``."""
    groups: List[Tuple[str, List[str]]] = []
    for tok in tokens:
        if tok.startswith("--") and len(tok) > 2:
            key, eq, value = tok[2:].partition("=")
            groups.append((key.replace("_", "-"), [value] if eq else []))
        elif groups:
            groups[-1][1].append(tok)
        else:
            raise ConfigError(f"extra argument {tok!r} does not follow a --flag "
                              "(the data path comes from the config or --data)")
    return groups


def merged_flags(recipe: Recipe, extra: Sequence[str] = ()) -> Dict[str, List[str]]:
    """The recipe's train flags with the extra arguments over them (an override goes last,
    where the log shows it)."""
    flags = {key: words for key, value in recipe.train.items() if (words := _words(value)) is not None}
    for key, words in split_extra(extra):
        flags.pop(key, None)
        flags[key] = words
    return flags


def recipe_changes(extra: Sequence[str]) -> List[str]:
    """The extra fairseq-train arguments that change the recipe (``--save-dir`` does not)."""
    return [w for key, words in split_extra(extra) if key != "save-dir" for w in ("--" + key, *words)]


def use_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def fairseq_exe(tool: str) -> str:
    """``fairseq-train`` etc. next to the running interpreter, else from PATH."""
    here = Path(sys.executable).parent / tool
    found = str(here) if here.exists() else shutil.which(tool)
    if not found:
        raise ConfigError(f"{tool} is neither next to {sys.executable} nor on PATH; run `make setup` first")
    return found


def device_flags(flags: Dict[str, List[str]], gpus: int = 1, bn_sync_stats: bool = False,
                 gpu: Optional[bool] = None) -> Dict[str, List[str]]:
    """The device part of a fairseq-train command line. CPU: ``--cpu``. GPUs: fairseq 0.12 takes
    every visible GPU unless told, so ``--distributed-world-size`` is pinned (1 by default);
    N GPUs divide the recipe's update-freq by N, which keeps the effective batch."""
    if gpus < 1:
        raise ConfigError(f"--gpus must be 1 or more, got {gpus}")
    if bn_sync_stats and gpus == 1:
        raise ConfigError("--bn-sync-stats syncs BN statistics across GPUs: it needs --gpus N with N > 1")
    if "cpu" in flags or not (use_gpu() if gpu is None else gpu):
        if gpus > 1:
            raise ConfigError(f"--gpus {gpus} needs CUDA GPUs; this run is on the CPU")
        return {"cpu": []}
    out = {"distributed-world-size": [str(gpus)]}
    if gpus > 1:
        freq = " ".join(flags.get("update-freq", ["1"]))
        if not freq.isdigit() or int(freq) % gpus:
            raise ConfigError(f"--gpus {gpus} does not divide the recipe's update-freq {freq}: the "
                              "effective batch (max-tokens x update-freq x GPUs) would change; pick a "
                              f"number of GPUs that divides {freq}")
        out["update-freq"] = [str(int(freq) // gpus)]
    if bn_sync_stats:
        out["bn-sync-stats"] = []
    return out


def train_argv(recipe: Recipe, save_dir=None, extra: Sequence[str] = (), data=None,
               gpu: Optional[bool] = None, exe: bool = True, gpus: int = 1,
               bn_sync_stats: bool = False) -> List[str]:
    """The full ``fairseq-train`` command line of a recipe."""
    languages = {"source-lang": [recipe.source_lang], "target-lang": [recipe.target_lang]} \
        if recipe.task == "translation" else {}
    flags = {"user-dir": [str(PLUGIN_DIR)], **languages, **merged_flags(recipe, extra)}
    flags.setdefault("save-dir", [str(save_dir or recipe.default_save_dir())])
    for key in ("distributed-world-size", "bn-sync-stats"):
        if key in flags:
            raise ConfigError(f"--{key} among the fairseq-train arguments: use the driver's "
                              "--gpus N [--bn-sync-stats], which also keep the effective batch")
    flags.update(device_flags(flags, gpus, bn_sync_stats, gpu))
    argv = [fairseq_exe("fairseq-train")] if exe else []
    argv.append(str(recipe.data_path(data)))
    for key, words in flags.items():
        argv += ["--" + key, *words]
    return argv


_FAIRSEQ_PARSER = threading.Lock()


def check_flags(recipe: Recipe, argv: Sequence[str]):
    """fairseq-train's own parser on ``argv`` (without the executable), in this process and
    before anything is written; its error comes back as one line that names the config."""
    from fairseq import options

    err = io.StringIO()
    with _FAIRSEQ_PARSER, contextlib.redirect_stderr(err):
        logging.disable(logging.INFO)  # "--user-dir ... has already been imported"
        try:
            options.parse_args_and_arch(options.get_training_parser(), list(argv))
        except SystemExit:
            said = (err.getvalue().strip().splitlines() or ["exited"])[-1].split(": error: ", 1)[-1]
            raise ConfigError(f"{recipe.path}: fairseq-train refuses its arguments: {said}") from None
        finally:
            logging.disable(logging.NOTSET)


# ----------------------------------------------------------------------------- running

def child_env(threads: Optional[int] = None) -> Dict[str, str]:
    """The environment of every child: the plugin importable by ``python -m normplug.tools.*``
    from any working directory; ``threads`` caps the BLAS/OpenMP threads."""
    env = dict(os.environ)
    env.setdefault("PYTHONWARNINGS", "ignore")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in [env.get("PYTHONPATH")] if p])
    if threads:
        env.update({v: str(threads) for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")})
    return env


def _run(argv, log_path=None, echo=None, env=None) -> Tuple[int, str]:
    """Run a command; its output (stdout and stderr) goes to ``log_path`` and, line by line,
    to ``echo``. Returns (exit status, output)."""
    lines = []
    with contextlib.ExitStack() as stack:
        log = stack.enter_context(open(log_path, "w", encoding="utf-8")) if log_path else None
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env or child_env(), bufsize=1)
        for line in proc.stdout:
            lines.append(line)
            if log:
                log.write(line)
                log.flush()
            if echo:
                echo(line)
        rc = proc.wait()
    return rc, "".join(lines)


def write_atomic(path: Path, text: str):
    """Write a whole file or nothing: a reader never sees a half-written one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def read_run_record(save_dir) -> Optional[dict]:
    try:
        return json.loads((Path(save_dir) / RUN_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _print_line(line):
    sys.stdout.write(line)
    sys.stdout.flush()


def train(recipe: Recipe, save_dir=None, extra: Sequence[str] = (), data=None, gpus: int = 1,
          bn_sync_stats: bool = False, gpu: Optional[bool] = None, threads: Optional[int] = None,
          echo=_print_line, log=print) -> int:
    """fairseq-train for a recipe into ``save_dir`` (default checkpoints/<training name>), or
    nothing when a run there finished with the same flags. Writes train.log and the run record
    (flags, device, exit status) there; returns fairseq-train's exit status."""
    for key, words in split_extra(extra):
        if key == "save-dir" and words:  # a --save-dir among the extra arguments wins
            save_dir = words[0]
    save_dir = Path(save_dir) if save_dir else recipe.default_save_dir()
    changes = recipe_changes(extra)
    flags = merged_flags(recipe, changes)
    run = read_run_record(save_dir)
    if run and run.get("rc") == 0 and run.get("flags") == flags:
        # relaunched, fairseq-train would train one more update, or resume a patience-stopped run
        log(f"== {recipe.name}: reusing the finished run in {save_dir}")
        return 0
    check_data(recipe, data)
    argv = train_argv(recipe, save_dir=save_dir, extra=extra, data=data, gpu=gpu, gpus=gpus,
                      bn_sync_stats=bn_sync_stats)
    check_flags(recipe, argv[1:])
    save_dir.mkdir(parents=True, exist_ok=True)
    record = {"config": str(recipe.path), "flags": flags, "extra": changes,
              "data": str(recipe.data_path(data)), "gpus": 0 if "--cpu" in argv else gpus,
              "bn_sync_stats": "--bn-sync-stats" in argv, "rc": None, "seconds": None}
    write_atomic(save_dir / RUN_RECORD, json.dumps(record, indent=2) + "\n")
    log("$ " + shlex.join(argv))
    t0 = time.time()
    rc, _ = _run(argv, save_dir / "train.log", echo, child_env(threads))
    record.update(rc=rc, seconds=round(time.time() - t0, 1))
    write_atomic(save_dir / RUN_RECORD, json.dumps(record, indent=2) + "\n")
    return rc


# ----------------------------------------------------------------------------- evaluation

def check_data(recipe: Recipe, data=None):
    """Refuse a config whose ``remove_bpe`` is not what its data needs, as recorded in the
    ``prepare.json`` of scripts/prepare-*.sh (data made otherwise has none). A language
    model's words are scored as they are: nothing to remove."""
    manifest = recipe.data_path(data) / "prepare.json"
    if "remove_bpe" not in recipe.evaluate or not manifest.is_file():
        return
    try:
        info = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ConfigError(f"cannot read {manifest}: {' '.join(str(err).split())}") from None
    if "remove_bpe" in info and info["remove_bpe"] != recipe.evaluate["remove_bpe"]:
        ours, theirs = json.dumps(recipe.evaluate["remove_bpe"]), json.dumps(info["remove_bpe"])
        raise ConfigError(f"{recipe.path}: evaluate: remove_bpe is {ours}, but the data needs {theirs} "
                          f"({manifest}: bpe {info.get('bpe')}, {info.get('bpe_size')}); set "
                          f"remove_bpe: {theirs} or prepare the data the config expects")


def describe_choice(ev) -> str:
    """Which checkpoint a config evaluates, in words (results table)."""
    if ev["checkpoint"]:
        return f"checkpoint_{ev['checkpoint']}.pt"
    if ev["average_last_epochs"]:
        return f"average of the last {ev['average_last_epochs']} epoch checkpoints"
    return f"average of the last {ev['average_last_updates']} update checkpoints"


def choose_checkpoint(recipe: Recipe, ckdir: Path, log=print) -> Tuple[Path, List[Path]]:
    """The checkpoint the config decodes: checkpoint_best/last.pt, or the average (normplug-average)
    of the last N epoch (checkpointE.pt) or update (checkpoint_E_U.pt) checkpoints. Returns
    (path, [inputs])."""
    from normplug.tools.common import numbered_checkpoints

    ev = recipe.evaluate
    if ev["checkpoint"]:
        path = ckdir / f"checkpoint_{ev['checkpoint']}.pt"
        if not path.exists():
            raise ConfigError(f"no {path.name} in {ckdir}: train first (scripts/train.sh {recipe.path})")
        return path, [path]
    kind, n = ("epoch", ev["average_last_epochs"]) if ev["average_last_epochs"] else \
        ("update", ev["average_last_updates"])
    found = [Path(p) for p in numbered_checkpoints(str(ckdir), kind)] if ckdir.is_dir() else []
    if not found:
        last = ckdir / "checkpoint_last.pt"
        if not last.exists():
            raise ConfigError(f"no {kind} checkpoints in {ckdir}: train first (scripts/train.sh {recipe.path})")
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
    rc, text = _run([sys.executable, "-m", "normplug.tools.average", "--inputs", *map(str, chosen),
                     "--output", str(out)])
    if rc != 0:
        raise RuntimeError(f"normplug-average failed (exit {rc}):\n{text[-3000:]}")
    stamp.write_text(wanted)
    log(f"averaged {', '.join(p.name for p in chosen)} -> {out}")
    return out, chosen


def generate_argv(recipe: Recipe, checkpoint, data=None, gpu: Optional[bool] = None,
                  extra: Sequence[str] = ()) -> List[str]:
    """``fairseq-generate`` with the recipe's decoding settings."""
    ev = recipe.evaluate
    argv = [fairseq_exe("fairseq-generate"), str(recipe.data_path(data)), "--user-dir", str(PLUGIN_DIR),
            "--path", str(checkpoint), "--source-lang", recipe.source_lang,
            "--target-lang", recipe.target_lang, "--gen-subset", ev["gen_subset"],
            # fairseq 0.12's batch_by_size drops the sentences that do not fill a multiple
            # of 8 at the end of a batch (30 test sentences: 24 decoded); 1 decodes them all
            "--required-batch-size-multiple", "1"]
    for key in ("beam", "lenpen", "max_len_a", "max_len_b", "batch_size"):
        argv += ["--" + key.replace("_", "-"), *_words(ev[key])]
    if ev["remove_bpe"]:
        argv += ["--remove-bpe", ev["remove_bpe"]]
    if ev["model_overrides"]:
        argv += ["--model-overrides", repr(dict(ev["model_overrides"]))]
    if not (use_gpu() if gpu is None else gpu):
        argv.append("--cpu")
    return argv + list(extra)


def parse_generate(text: str) -> Tuple[List[str], List[str]]:
    """(hypotheses, references) from fairseq-generate's output, in sentence-id order."""
    hyps, refs = {}, {}
    for line in text.splitlines():
        fields = line.split("\t")
        m = re.fullmatch(r"([HT])-(\d+)", fields[0])
        if m:  # H-<id> <tab> score <tab> text; T-<id> <tab> text (an empty text may lose its field)
            n = 2 if m[1] == "H" else 1
            (hyps if m[1] == "H" else refs)[int(m[2])] = fields[n] if len(fields) > n else ""
    missing = [i for i in refs if i not in hyps]
    if missing:
        raise RuntimeError(f"fairseq-generate gave no hypothesis for {len(missing)} sentence(s)")
    ids = sorted(refs)
    return [hyps[i] for i in ids], [refs[i] for i in ids]


def compound_split(line: str) -> str:
    """fairseq's compound_split_bleu.sh: ``a-b`` -> ``a ##AT##-##AT## b`` (Perl ``s///g``)."""
    return re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", line)


def tokenized_bleu(hyps: Sequence[str], refs: Sequence[str], lowercase=False, split=False):
    """BLEU of tokenized text with fairseq's scorer (multi-bleu.perl's), as the papers scored it.
    Returns (score, fairseq's result string)."""
    from fairseq.data import Dictionary
    from fairseq.scoring.bleu import BleuConfig, Scorer

    d = Dictionary()
    scorer = Scorer(BleuConfig(pad=d.pad(), eos=d.eos(), unk=d.unk()))
    for ref, hyp in zip(refs, hyps):
        if lowercase:
            ref, hyp = ref.lower(), hyp.lower()
        if split:
            ref, hyp = compound_split(ref), compound_split(hyp)
        scorer.add(d.encode_line(ref, add_if_not_exist=True), d.encode_line(hyp, add_if_not_exist=True))
    return scorer.score(4), scorer.result_string(4)


def detokenize(lines: Sequence[str], lang: str) -> List[str]:
    """Moses-detokenize (sacremoses), as fairseq's scripts/sacrebleu.sh does before scoring."""
    from sacremoses import MosesDetokenizer

    md = MosesDetokenizer(lang=lang)
    return [md.detokenize(line.split()) for line in lines]


def sacrebleu_score(hyps: Sequence[str], refs: Sequence[str], lowercase=False):
    """sacreBLEU of detokenized hypotheses against one reference set: (score, signature)."""
    from sacrebleu.metrics import BLEU

    bleu = BLEU(lowercase=lowercase)
    return bleu.corpus_score(list(hyps), [list(refs)]).score, str(bleu.get_signature())


def official_references(test_set: str, langpair: str) -> List[str]:
    """The references of a sacrebleu test set (``wmt14/full``, en-de) as sacrebleu's ``--test-set``
    uses them, fetched once into ``$SACREBLEU`` (``~/.sacrebleu``). A failed fetch leaves that
    folder as it was (sacrebleu would leave its lock file and a partial download)."""
    import sacrebleu.utils

    root = Path(sacrebleu.utils.SACREBLEU_DIR)
    existed = root.exists()
    before = set(root.rglob("*")) if existed else set()
    try:
        (ref_file,) = sacrebleu.utils.get_reference_files(test_set, langpair)
    except (OSError, SystemExit) as err:  # URLError offline; sacrebleu exits on SSL/md5 errors
        created = set(root.rglob("*")) - before if root.exists() else set()
        for path in sorted(created, key=lambda p: len(p.parts), reverse=True):  # files, then folders
            path.rmdir() if path.is_dir() else path.unlink()
        if not existed and root.exists():
            root.rmdir()
        raise RuntimeError(
            f"cannot fetch the official {test_set} {langpair} references "
            f"({' '.join(str(err).split()) or type(err).__name__}); sacreBLEU downloads them once into "
            f"{root / test_set}: offline, copy that folder from a machine where `sacrebleu -t {test_set} "
            f"-l {langpair} --echo ref > /dev/null` has run (or point $SACREBLEU at a copy)") from None
    with open(ref_file, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def score(recipe: Recipe, hyps: Sequence[str], refs: Sequence[str],
          official: Optional[Sequence[str]] = None) -> Dict[str, object]:
    """Tokenized BLEU as the paper scored it (the published metric), and sacreBLEU of the
    detokenized hypotheses against ``official`` references (a sacrebleu test set, in its order)
    or, without them, against the detokenized references of the binarized test set."""
    ev = recipe.evaluate
    tok, detail = tokenized_bleu(hyps, refs, lowercase=ev["lowercase"], split=ev["compound_split"])
    case = "lowercased" if ev["lowercase"] else "cased"
    if official is None:
        sacre_refs = detokenize(refs, ev["detok_lang"])
        label = f"{case} references of the binarized test set, sacremoses-detokenized"
    else:
        test_set, pair = ev["sacrebleu_test_set"], f"{recipe.source_lang}-{recipe.target_lang}"
        if len(official) != len(hyps):
            raise RuntimeError(f"the binarized {ev['gen_subset']} set has {len(hyps)} sentences, the "
                               f"official {test_set} {pair} references {len(official)}: sacreBLEU "
                               "needs the same test set, in its order")
        sacre_refs, label = official, f"official {test_set} {pair} references ({case})"
    sacre, signature = sacrebleu_score(detokenize(hyps, ev["detok_lang"]), sacre_refs, ev["lowercase"])
    return {"tokenized_bleu": round(tok, 2), "tokenized_bleu_detail": detail,
            "tokenized_bleu_settings": {k: ev[k] for k in ("lowercase", "compound_split", "remove_bpe")},
            "sacrebleu": round(sacre, 2), "sacrebleu_signature": signature,
            "sacrebleu_references": label}


def score_translation(recipe: Recipe, checkpoint: Path, ckdir: Path, data=None, extra=(), log=print):
    """Decode the test set with fairseq-generate and score it (:func:`score`)."""
    ev = recipe.evaluate
    official = None
    if ev["sacrebleu_test_set"]:  # fetched before decoding: an offline machine fails at once
        official = official_references(ev["sacrebleu_test_set"], f"{recipe.source_lang}-{recipe.target_lang}")
    argv = generate_argv(recipe, checkpoint, data=data, extra=extra)
    out, err = ckdir / f"generate-{recipe.name}.txt", ckdir / f"generate-{recipe.name}.log"
    log("$ " + shlex.join(argv))
    with open(out, "w", encoding="utf-8") as stdout, open(err, "w", encoding="utf-8") as stderr:
        rc = subprocess.run(argv, stdout=stdout, stderr=stderr, env=child_env()).returncode
    if rc != 0:
        raise RuntimeError(f"fairseq-generate failed (exit {rc}); see {err}:\n"
                           + err.read_text(encoding="utf-8")[-3000:])
    hyps, refs = parse_generate(out.read_text(encoding="utf-8"))
    scores = {"sentences": len(hyps), **score(recipe, hyps, refs, official)}
    log(f"{recipe.name}: tokenized BLEU {scores['tokenized_bleu']:.2f} ({scores['tokenized_bleu_detail']})")
    log(f"{recipe.name}: sacreBLEU {scores['sacrebleu']:.2f} on the {scores['sacrebleu_references']}  "
        f"{scores['sacrebleu_signature']}")
    return scores


def eval_lm_argv(recipe: Recipe, checkpoint, context_window: int, data=None, gpu: Optional[bool] = None,
                 extra: Sequence[str] = ()) -> List[str]:
    """``fairseq-eval-lm`` on windows of the training length: with ``context_window`` 0 they do
    not overlap and each token sees only the tokens before it in its window (the first, the
    last token of the window before); with C > 0 each window scores its last (length - C)
    tokens with the C tokens before them as context (fairseq subtracts C from
    --tokens-per-sample)."""
    ev = recipe.evaluate
    argv = [fairseq_exe("fairseq-eval-lm"), str(recipe.data_path(data)), "--user-dir", str(PLUGIN_DIR),
            "--path", str(checkpoint), "--task", "language_modeling", "--gen-subset", ev["gen_subset"],
            "--sample-break-mode", "none", "--tokens-per-sample", str(recipe.train_value("tokens-per-sample")),
            "--context-window", str(context_window), "--batch-size", str(ev["batch_size"]), "--no-progress-bar"]
    if not (use_gpu() if gpu is None else gpu):
        argv.append("--cpu")
    return argv + list(extra)


def parse_eval_lm(text: str) -> Tuple[int, float]:
    """(tokens scored, mean loss in bits a token) from fairseq-eval-lm's log."""
    tokens = re.findall(r"Evaluated ([\d,]+) tokens", text)
    bits = re.findall(r"Loss \(base 2\): (\S+), Perplexity: ", text)
    if len(tokens) != 1 or len(bits) != 1:
        raise RuntimeError("fairseq-eval-lm's log has no single 'Evaluated N tokens' and 'Loss (base 2)' line")
    return int(tokens[0].replace(",", "")), float(bits[0])


def split_tokens(recipe: Recipe, data=None) -> int:
    """Tokens (end-of-line symbols included) of the evaluated split of the binarized data."""
    from fairseq.data import data_utils

    prefix = recipe.data_path(data) / recipe.evaluate["gen_subset"]
    dataset = data_utils.load_indexed_dataset(str(prefix), None)
    if dataset is None:
        raise ConfigError(f"no binarized split {prefix.name!r} in {prefix.parent}")
    return int(dataset.sizes.sum())


def score_language_model(recipe: Recipe, checkpoint: Path, ckdir: Path, data=None, extra=(), log=print):
    """Test perplexity with fairseq-eval-lm, twice: as the reference evaluated (non-overlapping
    windows of the training length, no extra context: the published figure), and fairseq's
    sliding window (evaluate: context_window). Perplexity = exp(mean token loss in nats) =
    2 ** (fairseq's mean loss in bits). Both runs must score every token of the split:
    fairseq-eval-lm skips windows longer than the model's positions without a word."""
    ev, length = recipe.evaluate, recipe.train_value("tokens-per-sample")
    expected = split_tokens(recipe, data)
    scores = {"tokens": expected}
    for prefix, context in (("", 0), ("sliding_window_", ev["context_window"])):
        argv = eval_lm_argv(recipe, checkpoint, context, data=data, extra=extra)
        log_path = ckdir / f"eval-lm-{recipe.name}{'-sliding' if context else ''}.log"
        log("$ " + shlex.join(argv))
        rc, text = _run(argv, log_path)
        if rc != 0:
            raise RuntimeError(f"fairseq-eval-lm failed (exit {rc}); see {log_path}:\n{text[-3000:]}")
        tokens, bits = parse_eval_lm(text)
        if tokens != expected:
            raise RuntimeError(f"fairseq-eval-lm scored {tokens:,} of the {expected:,} tokens of the "
                               f"{ev['gen_subset']} split (it skips windows longer than the model's "
                               f"positions); see {log_path}")
        scores.update({prefix + "perplexity": round(2 ** bits, 2), prefix + "loss_bits": bits})
    scores.update(
        windows=f"non-overlapping windows of {length} tokens, no context beyond the window "
                f"(fairseq-eval-lm --tokens-per-sample {length} --context-window 0)",
        sliding_window_context=ev["context_window"],
        sliding_window_windows=f"fairseq's sliding window: windows of {length} tokens, each scoring its last "
                               f"{length - ev['context_window']} with the {ev['context_window']} before "
                               f"as context (--tokens-per-sample {length} --context-window {ev['context_window']})")
    log(f"{recipe.name}: perplexity {scores['perplexity']:.2f} ({scores['windows']}; {expected:,} tokens)")
    log(f"{recipe.name}: sliding-window perplexity {scores['sliding_window_perplexity']:.2f} "
        f"({scores['sliding_window_windows']})")
    return scores


@dataclass(frozen=True)
class Task:
    """How the configs of one fairseq task are read and scored."""
    top_keys: Dict[str, tuple]       # config keys beside TOP_KEYS
    evaluate_keys: Dict[str, tuple]  # the evaluate: mapping
    check: Callable                  # load_config's checks beyond the keys: (recipe) -> None
    score: Callable                  # (recipe, checkpoint, ckdir, data, extra, log) -> scores
    published_score: str             # the score compared with `published`
    metric: str                      # its name in the table
    better: str                      # "higher" or "lower"


TASKS = {
    "translation": Task(
        top_keys={"source_lang": (REQUIRED, (str,)), "target_lang": (REQUIRED, (str,))},
        evaluate_keys=TRANSLATION_EVALUATE_KEYS, check=check_translation, score=score_translation,
        published_score="tokenized_bleu", metric="BLEU", better="higher"),
    "language_modeling": Task(
        top_keys={}, evaluate_keys=LM_EVALUATE_KEYS, check=check_language_model, score=score_language_model,
        published_score="perplexity", metric="perplexity", better="lower"),
}


def evaluate(recipe: Recipe, ckdir=None, data=None, checkpoint=None, extra_generate=(),
             log=print) -> Dict[str, object]:
    """Pick the config's checkpoint, score it as its task is scored, and write
    scores-<name>.json next to it."""
    ckdir = Path(ckdir) if ckdir else recipe.default_save_dir()
    t0 = time.time()
    check_data(recipe, data)
    path, inputs = (Path(checkpoint), [Path(checkpoint)]) if checkpoint else choose_checkpoint(recipe, ckdir, log)
    scores = {"config": str(recipe.path), "name": recipe.name, "checkpoint": str(path),
              "checkpoint_choice": "given on the command line" if checkpoint else describe_choice(recipe.evaluate),
              "averaged": [p.name for p in inputs],
              **TASKS[recipe.task].score(recipe, path, ckdir, data=data, extra=extra_generate, log=log)}
    scores.update(published=recipe.published, metric=recipe.metric,
                  settings={k: v for k, v in recipe.evaluate.items() if k not in CHECKPOINT_CHOICES},
                  seconds=round(time.time() - t0, 1),
                  date=datetime.datetime.now().isoformat(timespec="seconds"))
    if recipe.published is not None:
        log(f"{recipe.name}: published {recipe.published} ({recipe.metric})")
    write_atomic(ckdir / f"scores-{recipe.name}.json", json.dumps(scores, indent=2) + "\n")
    log(f"wrote {ckdir / f'scores-{recipe.name}.json'}")
    return scores


# ----------------------------------------------------------------------------- the table

# scores shown beside the published one: sacreBLEU (translation), fairseq's sliding window (LM)
SECOND_SCORES = ("sacrebleu", "sacrebleu_references", "sacrebleu_signature", "sliding_window_perplexity",
                 "sliding_window_context")
RESULT_COLUMNS = ["config", "dataset", "setting", "norm", "paper", "metric", "better", "published", "ours",
                  "delta", *SECOND_SCORES, "evaluated", "checkpoints_averaged", "train_seconds", "status"]
ARROWS = {"higher": "↑", "lower": "↓"}


def row_status(recipe: Recipe, run: Optional[dict], scored: bool) -> str:
    """``not run``, ``failed: ...``, ``stale: ...``, ``shortened (...)`` or ``full``; then the
    GPUs of a run spread over several, and whether their BN statistics were synced."""
    if run is not None and run.get("rc") not in (0, None):
        return f"failed: fairseq-train exited {run['rc']}"
    if not scored:
        return "not run"
    if run is None:
        return "full (training not recorded)"
    if run.get("flags") != merged_flags(recipe, run.get("extra", [])):
        status = "stale: the config changed after this run"
    else:
        status = "shortened (extra args: " + " ".join(run["extra"]) + ")" if run.get("extra") else "full"
    if run.get("gpus", 1) > 1:
        status += f", {run['gpus']} GPUs, BN stats {'synced' if run.get('bn_sync_stats') else 'per GPU'}"
    return status


def result_row(recipe: Recipe, out: Path, failure: Optional[str] = None) -> Dict[str, object]:
    """One table row from what a run left in ``out/<training name>`` (``failure``: this attempt
    failed; older scores there are not shown)."""
    ckdir = out / recipe.training_name
    run = read_run_record(ckdir)
    task = TASKS[recipe.task]
    row = {"config": recipe.name, "dataset": recipe.dataset, "setting": recipe.setting,
           "norm": recipe.norm, "paper": recipe.paper, "metric": recipe.metric, "better": task.better,
           "metric_name": task.metric, "published": recipe.published,
           "evaluated": describe_choice(recipe.evaluate), "train_seconds": run.get("seconds") if run else None}
    try:
        scores = None if failure else json.loads((ckdir / f"scores-{recipe.name}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        scores = None
    row["status"] = "failed: " + failure if failure else row_status(recipe, run, scores is not None)
    if scores:
        row.update({k: scores.get(k) for k in SECOND_SCORES}, ours=scores.get(task.published_score),
                   checkpoints_averaged=" ".join(scores["averaged"]))
        if recipe.published is not None and row["ours"] is not None:
            row["delta"] = round(row["ours"] - recipe.published, 2)
    return row


def _fmt(v, digits=2):
    return "—" if v is None or v == "" else f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def _second_score(row) -> str:
    """The score beside the published one, labelled."""
    if row.get("sacrebleu") is not None:
        return f"sacreBLEU {row['sacrebleu']:.2f}"
    if row.get("sliding_window_perplexity") is not None:
        return f"sliding window, context {row['sliding_window_context']}: {row['sliding_window_perplexity']:.2f}"
    return "—"


def write_results(rows, out: Path) -> List[str]:
    """results.csv and results.md in ``out``; returns the table's lines."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=RESULT_COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows({k: ("" if row.get(k) is None else row[k]) for k in RESULT_COLUMNS} for row in rows)
    write_atomic(out / "results.csv", buf.getvalue())
    table = ["| config | dataset | setting | norm | metric | published | ours | Δ | also | evaluated | status |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    table += ["| " + " | ".join([r["config"], r["dataset"], r["setting"], r["norm"],
                                 f"{r['metric_name']} {ARROWS[r['better']]}", _fmt(r.get("published"), 1),
                                 _fmt(r.get("ours")), _fmt(r.get("delta")), _second_score(r),
                                 r["evaluated"], r["status"].replace("|", "\\|")]) + " |" for r in rows]
    refs = {}
    for r in rows:
        if r.get("sacrebleu_references"):
            refs.setdefault((r["sacrebleu_references"], r["sacrebleu_signature"]), []).append(r["config"])
    lines = ["# normplug: reproduction results", "",
             "Ours = the published metric computed as the paper did (BLEU: fairseq's scorer on the",
             "tokenized, BPE-removed output; compound-split for WMT; perplexity: exp of the mean token",
             "loss on non-overlapping windows of the training length, without context beyond the window).",
             "Δ = ours − published: for BLEU (↑, higher is better) a positive Δ beats the paper, for",
             "perplexity (↓, lower is better) a negative one. Also: sacreBLEU (below), or fairseq's",
             "sliding-window perplexity, each window scoring its last tokens with `context` tokens before",
             "them (fairseq-eval-lm --context-window). Status:",
             "`full` = the config as written; `shortened (...)` = run with extra fairseq-train arguments",
             "(not comparable to the paper); `not run` = no scores in this folder yet; `stale` = scored,",
             "but the config changed after the run; `failed: ...` = why; `N GPUs` = spread over N GPUs",
             "with update-freq / N, BN statistics per GPU or synced (--bn-sync-stats).", "",
             *table, "", "sacreBLEU: sacremoses-detokenized hypotheses against",
             *[f"- the {label} (`{sig}`): {', '.join(names)}" for (label, sig), names in refs.items()],
             *([] if refs else ["- — (no row scored yet)"]),
             "", "Papers:", "", *[f"- {paper}" for paper in sorted({r["paper"] for r in rows})], ""]
    write_atomic(out / "results.md", "\n".join(lines))
    return table


def reproduce(config_paths: Sequence, out, extra: Sequence[str] = (), data=None, table_only=False,
              gpus: int = 1, bn_sync_stats: bool = False, log=print) -> int:
    """Train and evaluate each config into ``out`` (or, with ``table_only``, only read what runs
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
            check_data(recipe, data)
            check_flags(recipe, train_argv(recipe, out / recipe.training_name, extra, data, gpus=gpus,
                                           bn_sync_stats=bn_sync_stats)[1:])
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


# ----------------------------------------------------------------------------- command line

def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog="python scripts/recipes.py", allow_abbrev=False,
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)

    def command(name, help, configs="config"):
        p = sub.add_parser(name, help=help, allow_abbrev=False)
        p.add_argument(configs, nargs="+" if configs == "configs" else None)
        if name != "check":
            p.add_argument("--data", help="binarized data folder (default: the config's)")
        if name in ("train", "reproduce", "argv"):
            p.add_argument("--gpus", type=int, default=1,
                           help="spread the run over N GPUs, update-freq divided by N (default 1)")
            p.add_argument("--bn-sync-stats", action="store_true",
                           help="with --gpus N: sync BN statistics across GPUs (default: per GPU)")
        return p

    command("train", "run fairseq-train from a config (fairseq-train arguments pass through)")
    p = command("evaluate", "pick/average checkpoints and score them: translation: decode, tokenized BLEU "
                            "and sacreBLEU; language model: perplexity (fairseq-eval-lm)")
    p.add_argument("--checkpoint-dir", help="save dir of the run (default checkpoints/<name>)")
    p.add_argument("--checkpoint", help="evaluate this checkpoint instead of the config's choice")
    p = command("reproduce", "train + evaluate configs; results.md/.csv", "configs")
    p.add_argument("--out", default="runs/reproduce", help="output folder (default %(default)s)")
    p.add_argument("--table-only", action="store_true",
                   help="train and evaluate nothing: tabulate what the runs in --out left")
    p = command("argv", "print the fairseq-train command line of a config")
    p.add_argument("--save-dir")
    command("check", "check configs (their format, then fairseq-train's parser)", "configs")
    try:
        if own[:1] == ["train"]:  # everything fairseq-train understands passes through
            args, rest = parser.parse_known_args(own)
            extra = rest + extra
        else:
            args = parser.parse_args(own)
        if args.cmd == "train":
            return train(load_config(args.config), extra=extra, data=args.data, gpus=args.gpus,
                         bn_sync_stats=args.bn_sync_stats)
        if args.cmd == "evaluate":
            evaluate(load_config(args.config), args.checkpoint_dir, data=args.data,
                     checkpoint=args.checkpoint, extra_generate=extra)
        elif args.cmd == "reproduce":
            return reproduce(args.configs, args.out, extra=extra, data=args.data, table_only=args.table_only,
                             gpus=args.gpus, bn_sync_stats=args.bn_sync_stats)
        elif args.cmd == "argv":
            print(shlex.join(train_argv(load_config(args.config), args.save_dir, extra, args.data,
                                        gpus=args.gpus, bn_sync_stats=args.bn_sync_stats)))
        else:
            for path in args.configs:
                recipe = load_config(path)
                check_flags(recipe, train_argv(recipe, gpu=False)[1:])
                print(f"{path}: ok ({recipe.name}, {recipe.train.get('arch')})")
    except ConfigError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
