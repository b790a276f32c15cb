"""Experiment configs (``configs/*.yaml``) -> fairseq command lines, evaluation and
reproduction tables. All the logic behind ``scripts/train.sh``,
``scripts/evaluate.sh``, ``scripts/reproduce.sh`` and the demo lives here.

A config is one published row: a YAML mapping with the keys

========================  ==================================================================
``name``                  run name (checkpoint folder, score files)
``dataset``               e.g. ``IWSLT14 De-En``
``setting``               ``Post-Norm`` or ``Pre-Norm``
``norm``                  e.g. ``BN``, ``RBN``, ``LN-simple``
``paper``                 citation of the published number
``published``             the published number (or ``null``: none)
``metric``                what ``published`` measures (how we score it is in ``evaluate``)
``data``                  binarized data (``fairseq-preprocess`` output); relative paths
                          are relative to the repository root
``source_lang``           ``--source-lang``
``target_lang``           ``--target-lang``
``train``                 every ``fairseq-train`` option of the recipe: ``flag: value``
                          (flag without ``--``; ``true`` = bare flag; ``false``/``null`` =
                          left out). ``user-dir``, ``save-dir``, ``cpu``, the languages
                          and the data path are added by this module.
``evaluate``              which checkpoint is decoded, decoding and scoring, see
                          :data:`EVALUATE_KEYS`
``notes``                 list of strings: the released script followed, every remaining
                          difference from it, where the published number comes from
``shares_training_with``  (optional) name of a config whose training run (checkpoints)
                          this one reuses -- it differs only in decoding
========================  ==================================================================

Command line (the scripts call these)::

    python scripts/recipes.py argv CONFIG [--data DIR] [--save-dir DIR] [-- EXTRA...]
    python scripts/recipes.py train CONFIG [--data DIR] [--save-dir DIR] [EXTRA...]
    python scripts/recipes.py evaluate CONFIG [--checkpoint-dir DIR] [--data DIR]
    python scripts/recipes.py reproduce CONFIG... [--out DIR] [--data DIR] [-- EXTRA...]
    python scripts/recipes.py reproduce --table-only CONFIG... [--out DIR]
    python scripts/recipes.py check CONFIG...

``EXTRA`` are ``fairseq-train`` arguments: a flag that the config sets is replaced,
any other is added. The device is chosen here: GPU when ``torch.cuda.is_available()``,
else ``--cpu``.
"""
import argparse
import csv
import datetime
import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]
PLUGIN_DIR = REPO / "normplug"
PROG = "normplug"

# top-level keys: name -> (required, allowed types, meaning)
TOP_KEYS = {
    "name": (True, (str,)),
    "dataset": (True, (str,)),
    "setting": (True, (str,)),
    "norm": (True, (str,)),
    "paper": (True, (str,)),
    "published": (True, (int, float, type(None))),
    "metric": (True, (str,)),
    "data": (True, (str,)),
    "source_lang": (True, (str,)),
    "target_lang": (True, (str,)),
    "train": (True, (dict,)),
    "evaluate": (True, (dict,)),
    "notes": (True, (list,)),
    "shares_training_with": (False, (str,)),
}

# evaluate keys: name -> (default or REQUIRED, allowed types)
REQUIRED = object()
EVALUATE_KEYS = {
    # which checkpoint is decoded: exactly one of these three (see CHECKPOINT_CHOICES)
    "checkpoint": (None, (str, type(None))),           # best | last: checkpoint_best.pt / _last.pt
    "average_last_epochs": (None, (int, type(None))),  # average the last N checkpointE.pt
    "average_last_updates": (None, (int, type(None))), # average the last N checkpoint_E_U.pt
    "gen_subset": ("test", (str,)),
    "beam": (REQUIRED, (int,)),
    "lenpen": (REQUIRED, (int, float)),
    "max_len_a": (REQUIRED, (int, float)),
    "max_len_b": (REQUIRED, (int,)),
    "batch_size": (128, (int,)),
    "remove_bpe": (REQUIRED, (str, type(None))),  # fairseq --remove-bpe value; null = none
    "lowercase": (False, (bool,)),               # lowercase hyps and refs (both BLEUs)
    "compound_split": (False, (bool,)),          # ##AT##-##AT## splitting (WMT)
    "model_overrides": (None, (dict, type(None))),  # fairseq-generate --model-overrides
    "detok_lang": (None, (str, type(None))),     # sacremoses language (default target_lang)
    # sacreBLEU references: a sacrebleu test set (e.g. wmt14/full), or null = the
    # detokenized references of the binarized test set
    "sacrebleu_test_set": (None, (str, type(None))),
}
CHECKPOINT_CHOICES = ("checkpoint", "average_last_epochs", "average_last_updates")
NAMED_CHECKPOINTS = ("best", "last")

# fairseq-train flags that the config may not set: they come from elsewhere
RESERVED_TRAIN = {
    "user-dir": "added by scripts/recipes.py (the plugin directory)",
    "save-dir": "chosen per run: --save-dir on the command line",
    "cpu": "added automatically when no GPU is available",
    "source-lang": "use the top-level key source_lang",
    "target-lang": "use the top-level key target_lang",
    "data": "use the top-level key data",
}

BLEU_LINE = re.compile(r"BLEU4? = (\d+(?:\.\d+)?)")


class ConfigError(Exception):
    """A config (or a command line) is wrong; the message is one line."""


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
    source_lang: str
    target_lang: str
    train: Dict[str, object]
    evaluate: Dict[str, object]
    notes: List[str]
    shares_training_with: Optional[str] = None
    raw: Dict[str, object] = field(default_factory=dict, repr=False)

    @property
    def training_name(self) -> str:
        """Name of the training run: this config's, or the one it shares."""
        return self.shares_training_with or self.name

    def data_path(self, override=None) -> Path:
        if override:
            return Path(override).resolve()
        p = Path(self.data)
        return p if p.is_absolute() else (REPO / p)

    def default_save_dir(self) -> Path:
        return REPO / "checkpoints" / self.training_name


# ----------------------------------------------------------------------------- loading

def _type_names(types):
    names = {int: "integer", float: "number", str: "string", dict: "mapping", list: "list",
             bool: "true/false", type(None): "null"}
    return " or ".join(names.get(t, t.__name__) for t in types)


def _check_type(where, key, value, types):
    ok = isinstance(value, types)
    if isinstance(value, bool) and bool not in types:  # YAML true is not a number here
        ok = False
    if isinstance(value, int) and not isinstance(value, bool) and float in types:
        ok = True
    if not ok:
        raise ConfigError(f"{where}: key {key!r} must be a {_type_names(types)}, "
                          f"got {type(value).__name__} {value!r}")


def load_config(path) -> Recipe:
    """Read and validate one config; raises :class:`ConfigError` (one line) when wrong."""
    import yaml

    path = Path(path)
    where = str(path)
    if not path.is_file():
        raise ConfigError(f"{where}: config file not found")
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except yaml.YAMLError as err:
        msg = " ".join(str(err).split())
        raise ConfigError(f"{where}: not valid YAML: {msg}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be a YAML mapping with keys {', '.join(TOP_KEYS)}")
    valid = ", ".join(TOP_KEYS)
    for key in raw:
        if key not in TOP_KEYS:
            raise ConfigError(f"{where}: unknown key {key!r} (valid keys: {valid})")
    for key, (required, types) in TOP_KEYS.items():
        if key not in raw:
            if required:
                raise ConfigError(f"{where}: missing key {key!r} (valid keys: {valid})")
            continue
        _check_type(where, key, raw[key], types)
    for key in ("name", "data", "source_lang", "target_lang"):
        if not raw[key].strip():
            raise ConfigError(f"{where}: key {key!r} must not be empty")
    if not re.fullmatch(r"[A-Za-z0-9._-]+", raw["name"]):
        raise ConfigError(f"{where}: key 'name' must use only letters, digits, '.', '_', '-' "
                          f"(it names a folder), got {raw['name']!r}")
    if raw.get("shares_training_with") is not None and not re.fullmatch(
            r"[A-Za-z0-9._-]+", raw["shares_training_with"]):
        raise ConfigError(f"{where}: key 'shares_training_with' must be a config name")
    if raw["published"] is not None and not math.isfinite(float(raw["published"])):
        raise ConfigError(f"{where}: key 'published' must be a finite number or null")
    for i, note in enumerate(raw["notes"]):
        if not isinstance(note, str):
            raise ConfigError(f"{where}: notes[{i}] must be a string, got {note!r}")

    train = {}
    for key, value in raw["train"].items():
        if not isinstance(key, str) or not re.fullmatch(r"[a-z0-9][a-z0-9-]*", key):
            raise ConfigError(f"{where}: train: {key!r} is not a fairseq-train flag name "
                              "(lowercase, '-' between words, no leading '--')")
        if key in RESERVED_TRAIN:
            raise ConfigError(f"{where}: train: {key!r} may not be set here: "
                              f"{RESERVED_TRAIN[key]}")
        if isinstance(value, dict):
            raise ConfigError(f"{where}: train: {key!r} must be a scalar or a list, got a mapping")
        if isinstance(value, list) and not all(
                isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value):
            raise ConfigError(f"{where}: train: {key!r}: list items must be numbers or strings")
        train[key] = value
    if "arch" not in train:
        raise ConfigError(f"{where}: train: missing key 'arch' (the fairseq architecture)")

    ev = {}
    valid_ev = ", ".join(EVALUATE_KEYS)
    for key in raw["evaluate"]:
        if key not in EVALUATE_KEYS:
            raise ConfigError(f"{where}: evaluate: unknown key {key!r} (valid keys: {valid_ev})")
    for key, (default, types) in EVALUATE_KEYS.items():
        if key not in raw["evaluate"]:
            if default is REQUIRED:
                raise ConfigError(f"{where}: evaluate: missing key {key!r} "
                                  f"(valid keys: {valid_ev})")
            ev[key] = default
            continue
        value = raw["evaluate"][key]
        _check_type(f"{where}: evaluate", key, value, types)
        ev[key] = value
    chosen = [k for k in CHECKPOINT_CHOICES if ev[k] is not None]
    if len(chosen) != 1:
        raise ConfigError(f"{where}: evaluate: set exactly one of {', '.join(map(repr, CHECKPOINT_CHOICES))} "
                          f"(which checkpoint is decoded), got {' and '.join(map(repr, chosen)) or 'none'}")
    if ev["checkpoint"] is not None and ev["checkpoint"] not in NAMED_CHECKPOINTS:
        raise ConfigError(f"{where}: evaluate: 'checkpoint' must be one of {', '.join(NAMED_CHECKPOINTS)}, "
                          f"got {ev['checkpoint']!r}")
    for key in ("average_last_epochs", "average_last_updates", "beam", "batch_size"):
        if ev[key] is not None and ev[key] < 1:
            raise ConfigError(f"{where}: evaluate: {key!r} must be >= 1, got {ev[key]}")
    if ev["detok_lang"] is None:
        ev["detok_lang"] = raw["target_lang"]
    if ev["sacrebleu_test_set"] is not None:
        _check_sacrebleu_test_set(where, ev["sacrebleu_test_set"],
                                  f"{raw['source_lang']}-{raw['target_lang']}")

    return Recipe(
        path=path, name=raw["name"], dataset=raw["dataset"], setting=raw["setting"],
        norm=raw["norm"], paper=raw["paper"],
        published=None if raw["published"] is None else float(raw["published"]),
        metric=raw["metric"], data=raw["data"], source_lang=raw["source_lang"],
        target_lang=raw["target_lang"], train=train, evaluate=ev, notes=list(raw["notes"]),
        shares_training_with=raw.get("shares_training_with"), raw=raw,
    )


# ----------------------------------------------------------------------------- argv

def _render(value) -> Optional[List[str]]:
    """A config value as argv words; None = leave the flag out."""
    if value is True:
        return []
    if value is False or value is None:
        return None
    if isinstance(value, list):
        return [_render_scalar(v) for v in value]
    return [_render_scalar(value)]


def _render_scalar(v) -> str:
    if isinstance(v, float):
        return repr(v)  # 0.0005, 1e-07: exact, and what argparse's float() reads back
    return str(v)


def split_extra(tokens: Sequence[str]) -> List[Tuple[str, List[str]]]:
    """``['--lr', '1e-3', '--cpu']`` -> ``[('lr', ['1e-3']), ('cpu', [])]``."""
    groups: List[Tuple[str, List[str]]] = []
    for tok in tokens:
        if tok.startswith("--") and len(tok) > 2:
            if "=" in tok:
                key, value = tok[2:].split("=", 1)
                groups.append((key.replace("_", "-"), [value]))
            else:
                groups.append((tok[2:].replace("_", "-"), []))
        elif groups:
            groups[-1][1].append(tok)
        else:
            raise ConfigError(f"extra argument {tok!r} does not follow a --flag "
                              "(the data path comes from the config or --data)")
    return groups


def merged_flags(recipe: Recipe, extra: Sequence[str] = ()) -> Dict[str, List[str]]:
    """The recipe's train flags with the extra arguments applied (extra wins)."""
    flags: Dict[str, List[str]] = {}
    for key, value in recipe.train.items():
        words = _render(value)
        if words is not None:
            flags[key] = words
    for key, words in split_extra(extra):
        flags.pop(key, None)  # re-insert at the end: the override is visible in the log
        flags[key] = words
    return flags


def use_gpu() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    return bool(torch.cuda.is_available())


def fairseq_exe(tool: str) -> str:
    """``fairseq-train`` etc. next to the running interpreter, else from PATH."""
    here = Path(sys.executable).parent / tool
    if here.exists():
        return str(here)
    import shutil

    found = shutil.which(tool)
    if not found:
        raise ConfigError(f"{tool} is neither next to {sys.executable} nor on PATH; "
                          "run `make setup` first")
    return found


def train_argv(recipe: Recipe, save_dir=None, extra: Sequence[str] = (), data=None,
               gpu: Optional[bool] = None, exe: bool = True) -> List[str]:
    """The full ``fairseq-train`` command line of a recipe."""
    flags = {
        "user-dir": [str(PLUGIN_DIR)],
        "source-lang": [recipe.source_lang],
        "target-lang": [recipe.target_lang],
    }
    flags.update(merged_flags(recipe, ()))
    flags["save-dir"] = [str(save_dir or recipe.default_save_dir())]
    for key, words in split_extra(extra):
        flags.pop(key, None)
        flags[key] = words
    flags.setdefault("user-dir", [str(PLUGIN_DIR)])
    if not (use_gpu() if gpu is None else gpu):
        flags.setdefault("cpu", [])
    argv = [fairseq_exe("fairseq-train")] if exe else []
    argv.append(str(recipe.data_path(data)))
    for key, words in flags.items():
        argv.append("--" + key)
        argv.extend(words)
    return argv


def generate_argv(recipe: Recipe, checkpoint, data=None, gpu: Optional[bool] = None,
                  extra: Sequence[str] = ()) -> List[str]:
    """``fairseq-generate`` with the recipe's decoding settings (tokenized BLEU scorer)."""
    ev = recipe.evaluate
    argv = [
        fairseq_exe("fairseq-generate"), str(recipe.data_path(data)),
        "--user-dir", str(PLUGIN_DIR), "--path", str(checkpoint),
        "--source-lang", recipe.source_lang, "--target-lang", recipe.target_lang,
        "--gen-subset", ev["gen_subset"], "--beam", str(ev["beam"]),
        "--lenpen", _render_scalar(ev["lenpen"]), "--max-len-a", _render_scalar(ev["max_len_a"]),
        "--max-len-b", str(ev["max_len_b"]), "--batch-size", str(ev["batch_size"]),
        "--scoring", "bleu",
    ]
    if ev["remove_bpe"]:
        argv += ["--remove-bpe", ev["remove_bpe"]]
    if ev["model_overrides"]:
        argv += ["--model-overrides", repr(dict(ev["model_overrides"]))]
    if not (use_gpu() if gpu is None else gpu):
        argv.append("--cpu")
    argv += list(extra)
    return argv


# ----------------------------------------------------------------------------- scoring

def compound_split(line: str) -> str:
    """fairseq's compound_split_bleu.sh: ``a-b`` -> ``a ##AT##-##AT## b`` (Perl ``s///g``)."""
    return re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", line)


def tokenized_bleu(hyps: Sequence[str], refs: Sequence[str], lowercase=False, split=False):
    """BLEU on tokenized text with fairseq's scorer (multi-bleu.perl equivalent).

    Returns (score, fairseq's result string).
    """
    from fairseq.data import Dictionary
    from fairseq.scoring.bleu import BleuConfig, Scorer

    d = Dictionary()
    scorer = Scorer(BleuConfig(pad=d.pad(), eos=d.eos(), unk=d.unk()))
    for ref, hyp in zip(refs, hyps):
        if lowercase:
            ref, hyp = ref.lower(), hyp.lower()
        if split:
            ref, hyp = compound_split(ref), compound_split(hyp)
        scorer.add(d.encode_line(ref, add_if_not_exist=True),
                   d.encode_line(hyp, add_if_not_exist=True))
    return scorer.score(4), scorer.result_string(4)


def detokenize(lines: Sequence[str], lang: str) -> List[str]:
    """Moses-detokenize (sacremoses), as fairseq's scripts/sacrebleu.sh does before scoring."""
    from sacremoses import MosesDetokenizer

    md = MosesDetokenizer(lang=lang)
    return [md.detokenize(line.split()) for line in lines]


def sacrebleu_score(hyps: Sequence[str], refs: Sequence[str], lowercase=False):
    """sacreBLEU of detokenized hypotheses against one reference set; (score, signature)."""
    from sacrebleu.metrics import BLEU

    bleu = BLEU(lowercase=lowercase)
    result = bleu.corpus_score(list(hyps), [list(refs)])
    return result.score, str(bleu.get_signature())


def _check_sacrebleu_test_set(where, test_set, langpair):
    from sacrebleu.dataset import DATASETS

    if test_set not in DATASETS:
        raise ConfigError(f"{where}: evaluate: sacrebleu_test_set {test_set!r} is not a sacrebleu "
                          "test set (list them: sacrebleu --list)")
    if langpair not in DATASETS[test_set].langpairs:
        raise ConfigError(f"{where}: evaluate: sacrebleu test set {test_set!r} has no language pair "
                          f"{langpair!r}")


def official_references(test_set: str, langpair: str) -> List[str]:
    """The references of a sacrebleu test set (e.g. ``wmt14/full``, en-de), as sacrebleu's
    own ``--test-set`` scoring uses them; fetched once into ``$SACREBLEU`` (``~/.sacrebleu``).

    A failed fetch leaves that folder as it was: sacrebleu would otherwise leave its lock
    file, and a partial download that it later takes for a complete one.
    """
    import sacrebleu.utils

    root = Path(sacrebleu.utils.SACREBLEU_DIR)
    folder = root / test_set
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
        reason = " ".join(str(err).split()) or type(err).__name__
        raise RuntimeError(
            f"cannot fetch the official {test_set} {langpair} references ({reason}); sacreBLEU "
            f"downloads them once into {folder}: offline, copy that folder from a machine where "
            f"`sacrebleu -t {test_set} -l {langpair} --echo ref > /dev/null` has run (or point "
            "$SACREBLEU at a copy)") from None
    with open(ref_file, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def parse_generate(text: str):
    """(hyps, refs, fairseq's BLEU or None) from fairseq-generate's output, by sentence id."""
    hyps, refs = {}, {}
    for line in text.splitlines():
        if line.startswith("H-"):
            parts = line.split("\t")
            hyps[int(parts[0][2:])] = parts[2] if len(parts) > 2 else ""
        elif line.startswith("T-"):
            parts = line.split("\t")
            refs[int(parts[0][2:])] = parts[1] if len(parts) > 1 else ""
    ids = sorted(refs)
    missing = [i for i in ids if i not in hyps]
    if missing:
        raise RuntimeError(f"fairseq-generate gave no hypothesis for {len(missing)} sentence(s)")
    found = None
    for line in text.splitlines():
        if line.startswith("Generate ") and "BLEU" in line:
            m = BLEU_LINE.search(line)
            if m:
                found = float(m.group(1))
    return [hyps[i] for i in ids], [refs[i] for i in ids], found


# ----------------------------------------------------------------------------- evaluation

def check_data(recipe: Recipe, data=None):
    """Refuse a config whose ``remove_bpe`` is not what its data needs, as recorded in the
    ``prepare.json`` that scripts/prepare-*.sh write; data made otherwise has none."""
    manifest = recipe.data_path(data) / "prepare.json"
    if not manifest.is_file():
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


def _python_env():
    env = dict(os.environ)
    env.setdefault("PYTHONWARNINGS", "ignore")
    # the plugin must be importable by `python -m normplug.tools.*` from any working directory
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def _run(argv, log_path=None, echo=False, cwd=None):
    """Run a command; stdout+stderr to log_path (and the terminal if echo). Returns (rc, text)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_python_env(), cwd=cwd, bufsize=1)
    lines = []
    log = open(log_path, "w", encoding="utf-8") if log_path else None
    try:
        for line in proc.stdout:
            lines.append(line)
            if log:
                log.write(line)
                log.flush()
            if echo:
                sys.stdout.write(line)
                sys.stdout.flush()
    finally:
        rc = proc.wait()
        if log:
            log.close()
    return rc, "".join(lines)


def describe_choice(ev) -> str:
    """Which checkpoint a config decodes, in words (results table)."""
    if ev["checkpoint"]:
        return f"checkpoint_{ev['checkpoint']}.pt"
    if ev["average_last_epochs"]:
        return f"average of the last {ev['average_last_epochs']} epoch checkpoints"
    return f"average of the last {ev['average_last_updates']} update checkpoints"


def choose_checkpoint(recipe: Recipe, ckdir: Path, log=print):
    """The checkpoint the config decodes: checkpoint_best/last.pt, or the average of the last
    N epoch (checkpointE.pt) or update (checkpoint_E_U.pt) checkpoints, made with
    normplug-average. Returns (path, [inputs])."""
    from normplug.tools.common import numbered_checkpoints

    ckdir, ev = Path(ckdir), recipe.evaluate
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
        if last.exists():  # e.g. a run shortened below the first save interval
            log(f"no {kind} checkpoints in {ckdir}, the recipe averages the last {n}: "
                f"decoding {last.name} instead")
            return last, [last]
        raise ConfigError(f"no {kind} checkpoints in {ckdir}: train first "
                          f"(scripts/train.sh {recipe.path})")
    chosen = found[-n:]
    if len(chosen) < n:
        log(f"only {len(chosen)} {kind} checkpoint(s) in {ckdir}, recipe averages {n}: "
            f"averaging {len(chosen)}")
    if len(chosen) == 1:
        return chosen[0], chosen
    stem = f"averaged_last{len(chosen)}" + ("_updates" if kind == "update" else "")
    out, stamp = ckdir / f"{stem}.pt", ckdir / f"{stem}.inputs"
    wanted = "\n".join(f"{p.name} {p.stat().st_mtime_ns}" for p in chosen)
    if out.exists() and stamp.exists() and stamp.read_text() == wanted:
        log(f"reusing {out} (average of {', '.join(p.name for p in chosen)})")
        return out, chosen
    argv = [sys.executable, "-m", "normplug.tools.average", "--inputs", *map(str, chosen),
            "--output", str(out)]
    rc, text = _run(argv)
    if rc != 0:
        raise RuntimeError(f"normplug-average failed (exit {rc}):\n{text[-3000:]}")
    stamp.write_text(wanted)
    log(f"averaged {', '.join(p.name for p in chosen)} -> {out}")
    return out, chosen


def score(recipe: Recipe, hyps: Sequence[str], refs: Sequence[str],
          official: Optional[Sequence[str]] = None) -> Dict[str, object]:
    """Tokenized BLEU as the paper scored it, and sacreBLEU of the detokenized hypotheses
    against ``official`` references (a sacrebleu test set, in test-set order) or, without
    them, against the detokenized references of the binarized test set."""
    ev = recipe.evaluate
    tok, tok_detail = tokenized_bleu(hyps, refs, lowercase=ev["lowercase"], split=ev["compound_split"])
    case = "lowercased" if ev["lowercase"] else "cased"
    if official is None:
        sacre_refs = detokenize(refs, ev["detok_lang"])
        label = f"{case} references of the binarized test set, sacremoses-detokenized"
    else:
        test_set, langpair = ev["sacrebleu_test_set"], f"{recipe.source_lang}-{recipe.target_lang}"
        if len(official) != len(hyps):
            raise RuntimeError(
                f"the binarized {ev['gen_subset']} set has {len(hyps)} sentences, the official "
                f"{test_set} {langpair} references {len(official)}: sacreBLEU needs the same test "
                "set, in its order")
        sacre_refs = official
        label = f"official {test_set} {langpair} references ({case})"
    sacre, signature = sacrebleu_score(detokenize(hyps, ev["detok_lang"]), sacre_refs,
                                       lowercase=ev["lowercase"])
    return {
        "tokenized_bleu": round(tok, 2),
        "tokenized_bleu_detail": tok_detail,
        "tokenized_bleu_settings": {"lowercase": ev["lowercase"],
                                    "compound_split": ev["compound_split"],
                                    "remove_bpe": ev["remove_bpe"]},
        "sacrebleu": round(sacre, 2),
        "sacrebleu_signature": signature,
        "sacrebleu_references": label,
    }


def evaluate(recipe: Recipe, ckdir=None, data=None, checkpoint=None, extra_generate=(),
             log=print) -> Dict[str, object]:
    """Decode the test set, score it both ways, write scores-<name>.{json,csv} in ckdir."""
    ckdir = Path(ckdir) if ckdir else recipe.default_save_dir()
    ev = recipe.evaluate
    t0 = time.time()
    check_data(recipe, data)
    official = None
    if ev["sacrebleu_test_set"]:  # fetched before decoding: an offline machine fails at once
        langpair = f"{recipe.source_lang}-{recipe.target_lang}"
        official = official_references(ev["sacrebleu_test_set"], langpair)
    if checkpoint:
        path, inputs = Path(checkpoint), [Path(checkpoint)]
    else:
        path, inputs = choose_checkpoint(recipe, ckdir, log=log)
    argv = generate_argv(recipe, path, data=data, extra=extra_generate)
    out_txt = ckdir / f"generate-{recipe.name}.txt"
    log("$ " + " ".join(shlex.quote(a) for a in argv))
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=_python_env())
    out_txt.write_text(proc.stdout, encoding="utf-8")
    (ckdir / f"generate-{recipe.name}.log").write_text(proc.stderr, encoding="utf-8")
    if proc.returncode != 0:
        raise RuntimeError(f"fairseq-generate failed (exit {proc.returncode}); see "
                           f"{ckdir / f'generate-{recipe.name}.log'}:\n{proc.stderr[-3000:]}")
    hyps, refs, generate_bleu = parse_generate(proc.stdout)
    scores = {
        "config": str(recipe.path),
        "name": recipe.name,
        "checkpoint": str(path),
        "checkpoint_choice": describe_choice(ev) if not checkpoint else "given on the command line",
        "averaged": [p.name for p in inputs],
        "sentences": len(hyps),
        **score(recipe, hyps, refs, official),
        "fairseq_generate_bleu": generate_bleu,
        "published": recipe.published,
        "metric": recipe.metric,
        "decoding": {k: ev[k] for k in ("gen_subset", "beam", "lenpen", "max_len_a",
                                        "max_len_b", "batch_size", "model_overrides")},
        "seconds": round(time.time() - t0, 1),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }
    with open(ckdir / f"scores-{recipe.name}.json", "w", encoding="utf-8") as f:
        json.dump(scores, f, indent=2)
        f.write("\n")
    keys = ["name", "tokenized_bleu", "sacrebleu", "sacrebleu_references", "sacrebleu_signature",
            "published", "checkpoint", "sentences"]
    with open(ckdir / f"scores-{recipe.name}.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(keys)
        w.writerow([scores[k] for k in keys])
    log(f"{recipe.name}: tokenized BLEU {scores['tokenized_bleu']:.2f} ({scores['tokenized_bleu_detail']})"
        + (f" [fairseq-generate: {generate_bleu:.2f}]" if generate_bleu is not None else ""))
    log(f"{recipe.name}: sacreBLEU {scores['sacrebleu']:.2f} on the {scores['sacrebleu_references']}  "
        f"{scores['sacrebleu_signature']}")
    if recipe.published is not None:
        log(f"{recipe.name}: published {recipe.published} ({recipe.metric})")
    log(f"wrote {ckdir / f'scores-{recipe.name}.json'}")
    return scores


# ----------------------------------------------------------------------------- training

RUN_RECORD = "normplug-run.json"  # in the save dir: the recipe flags, extra args, exit status


def recipe_changes(extra: Sequence[str]) -> List[str]:
    """The extra fairseq-train arguments that change the recipe (``--save-dir`` does not)."""
    return [w for key, words in split_extra(extra) if key != "save-dir" for w in ("--" + key, *words)]


def read_run_record(save_dir: Path) -> Optional[Dict[str, object]]:
    path = Path(save_dir) / RUN_RECORD
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def train(recipe: Recipe, save_dir=None, extra=(), data=None, log_path=None, echo=True,
          log=print) -> int:
    save_dir = Path(save_dir) if save_dir else recipe.default_save_dir()
    for key, words in split_extra(extra):
        if key == "save-dir" and words:  # a --save-dir among the extra arguments wins
            save_dir = Path(words[0])
    changes = recipe_changes(extra)
    check_data(recipe, data)
    save_dir.mkdir(parents=True, exist_ok=True)
    argv = train_argv(recipe, save_dir=save_dir, extra=extra, data=data)
    record = {"config": str(recipe.path), "flags": merged_flags(recipe, changes), "extra": changes,
              "data": str(recipe.data_path(data)), "rc": None, "seconds": None}
    (save_dir / RUN_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    log("$ " + " ".join(shlex.quote(a) for a in argv))
    t0 = time.time()
    rc, _ = _run(argv, log_path=log_path or save_dir / "train.log", echo=echo)
    record.update(rc=rc, seconds=round(time.time() - t0, 1))
    (save_dir / RUN_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return rc


# ----------------------------------------------------------------------------- reproduce

RESULT_COLUMNS = ["config", "dataset", "setting", "norm", "paper", "metric", "published",
                  "tokenized_bleu", "delta", "sacrebleu", "sacrebleu_references",
                  "sacrebleu_signature", "decoded", "checkpoints_averaged", "train_seconds",
                  "status"]


def row_status(recipe: Recipe, run: Optional[Dict[str, object]], scored: bool) -> str:
    """``not run``, ``failed: ...``, ``stale: ...``, ``shortened (...)`` or ``full``."""
    if run is not None and run.get("rc") not in (0, None):
        return f"failed: fairseq-train exited {run['rc']}"
    if not scored:
        return "not run"
    if run is None:
        return "full (training not recorded)"
    if run.get("flags") != merged_flags(recipe, run.get("extra", [])):
        return "stale: the config changed after this run"
    if run.get("extra"):
        return "shortened (extra args: " + " ".join(run["extra"]) + ")"
    return "full"


def result_row(recipe: Recipe, out: Path, failure: Optional[str] = None) -> Dict[str, object]:
    """One table row from what a run left in ``out/<training name>`` (``failure``: this
    attempt failed; older scores there are not shown)."""
    ckdir = out / recipe.training_name
    run = read_run_record(ckdir)
    row = {"config": recipe.name, "dataset": recipe.dataset, "setting": recipe.setting,
           "norm": recipe.norm, "paper": recipe.paper, "metric": recipe.metric,
           "published": recipe.published, "decoded": describe_choice(recipe.evaluate),
           "train_seconds": run.get("seconds") if run else None}
    try:
        scores = None if failure else json.loads(
            (ckdir / f"scores-{recipe.name}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        scores = None
    row["status"] = "failed: " + failure if failure else row_status(recipe, run, scores is not None)
    if scores:
        row.update(tokenized_bleu=scores["tokenized_bleu"], sacrebleu=scores["sacrebleu"],
                   sacrebleu_references=scores.get("sacrebleu_references"),
                   sacrebleu_signature=scores["sacrebleu_signature"],
                   checkpoints_averaged=" ".join(scores["averaged"]))
        if recipe.published is not None:
            row["delta"] = round(scores["tokenized_bleu"] - recipe.published, 2)
    return row


def _fmt(v, digits=2):
    if v is None or v == "":
        return "—"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def write_results(rows, out: Path) -> List[str]:
    """Write results.csv and results.md; returns the table's lines."""
    with open(out / "results.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=RESULT_COLUMNS)
        w.writeheader()
        for row in rows:
            w.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in RESULT_COLUMNS})
    lines = [
        "# normplug: reproduction results",
        "",
        "Ours = tokenized BLEU computed as the paper did (fairseq's scorer on the tokenized,",
        "BPE-removed output; compound-split for WMT); Δ = ours − published. Status: `full` =",
        "the config as written; `shortened (...)` = run with extra fairseq-train arguments",
        "(not comparable to the paper); `not run` = no scores in this folder yet; `stale` =",
        "scored, but the config changed after the run; `failed: ...` = why.",
        "",
        "| config | dataset | setting | norm | published | ours | Δ | sacreBLEU | decoded | status |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append("| " + " | ".join([
            r["config"], r["dataset"], r["setting"], r["norm"], _fmt(r.get("published"), 1),
            _fmt(r.get("tokenized_bleu")), _fmt(r.get("delta")), _fmt(r.get("sacrebleu")),
            r["decoded"], r["status"].replace("|", "\\|"),
        ]) + " |")
    refs = {}
    for r in rows:
        if r.get("sacrebleu_references"):
            refs.setdefault((r["sacrebleu_references"], r["sacrebleu_signature"]), []).append(r["config"])
    lines += ["", "sacreBLEU: sacremoses-detokenized hypotheses against"]
    lines += [f"- the {label} (`{sig}`): {', '.join(names)}" for (label, sig), names in refs.items()]
    if not refs:
        lines.append("- — (no row scored yet)")
    lines += ["", "Papers:", ""]
    for paper in sorted({r["paper"] for r in rows}):
        lines.append(f"- {paper}")
    lines.append("")
    (out / "results.md").write_text("\n".join(lines), encoding="utf-8")
    return [line for line in lines if line.startswith("|")]


def reproduce(config_paths: Sequence, out, extra: Sequence[str] = (), data=None,
              table_only=False, log=print) -> int:
    """Train and evaluate each config (or, with ``table_only``, only read what runs left in
    ``out``); results.md / results.csv in ``out``. Returns an exit code."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    recipes = [load_config(p) for p in config_paths]  # every config is checked before any work
    split_extra(extra)
    if not table_only:
        for recipe in recipes:
            check_data(recipe, data)
    rows, trained, failed = [], {}, 0
    for recipe in recipes:
        ckdir = out / recipe.training_name
        try:
            if not table_only:
                if recipe.training_name not in trained:
                    run = read_run_record(ckdir)
                    if (run and run.get("rc") == 0
                            and run.get("flags") == merged_flags(recipe, recipe_changes(extra))):
                        # a finished run; fairseq-train would resume a patience-stopped one
                        log(f"== {recipe.name}: reusing the finished run in {ckdir}")
                        rc = 0
                    else:
                        log(f"== {recipe.name}: training into {ckdir}")
                        rc = train(recipe, save_dir=ckdir, extra=extra, data=data, echo=False, log=log)
                    trained[recipe.training_name] = rc
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


# ----------------------------------------------------------------------------- CLI

def _split_dashdash(argv):
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python scripts/recipes.py",
                                     description=__doc__.split("\n\n")[0],
                                     allow_abbrev=False)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("argv", help="print the fairseq-train command line of a config",
                       allow_abbrev=False)
    p.add_argument("config")
    p.add_argument("--data")
    p.add_argument("--save-dir")
    p = sub.add_parser("train", help="run fairseq-train from a config (extra args pass through)",
                       allow_abbrev=False)
    p.add_argument("config")
    p.add_argument("--data", help="binarized data folder (default: the config's)")
    p = sub.add_parser("evaluate", help="pick/average checkpoints, decode, score (tokenized BLEU, sacreBLEU)",
                       allow_abbrev=False)
    p.add_argument("config")
    p.add_argument("--checkpoint-dir", help="save dir of the run (default checkpoints/<name>)")
    p.add_argument("--checkpoint", help="decode this checkpoint instead of the config's choice")
    p.add_argument("--data", help="binarized data folder (default: the config's)")
    p = sub.add_parser("reproduce", help="train + evaluate configs; results.md/.csv",
                       allow_abbrev=False)
    p.add_argument("configs", nargs="+")
    p.add_argument("--out", default="runs/reproduce", help="output folder (default %(default)s)")
    p.add_argument("--data", help="binarized data folder for every config (default: each config's)")
    p.add_argument("--table-only", action="store_true",
                   help="train and evaluate nothing: tabulate the scores the runs in --out left "
                        "(rows without scores: 'not run')")
    p = sub.add_parser("check", help="validate configs")
    p.add_argument("configs", nargs="+")

    own, extra = _split_dashdash(argv)
    try:
        if own and own[0] == "train":
            # everything fairseq-train understands passes through, our --data excepted
            args, rest = parser.parse_known_args(own)
            extra = rest + extra
        else:
            args = parser.parse_args(own)
        if args.cmd == "argv":
            recipe = load_config(args.config)
            print(" ".join(shlex.quote(a) for a in train_argv(
                recipe, save_dir=args.save_dir, extra=extra, data=args.data)))
        elif args.cmd == "train":
            recipe = load_config(args.config)
            return train(recipe, extra=extra, data=args.data)
        elif args.cmd == "evaluate":
            recipe = load_config(args.config)
            evaluate(recipe, args.checkpoint_dir, data=args.data, checkpoint=args.checkpoint,
                     extra_generate=extra)
        elif args.cmd == "reproduce":
            if args.table_only and extra:
                raise ConfigError("--table-only trains nothing: extra fairseq-train arguments "
                                  f"({' '.join(extra)}) have no effect")
            return reproduce(args.configs, args.out, extra=extra, data=args.data,
                             table_only=args.table_only)
        elif args.cmd == "check":
            for path in args.configs:
                recipe = load_config(path)
                print(f"{path}: ok ({recipe.name}, {recipe.train['arch']})")
    except ConfigError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
