"""Experiment configs (``configs/*.yaml``) -> fairseq command lines, evaluation and
reproduction tables. All the logic behind ``scripts/train.sh``,
``scripts/evaluate.sh``, ``scripts/reproduce.sh`` and the demo lives here.

A config is one published row of SPEC §4: a YAML mapping with the keys

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
``evaluate``              decoding and scoring, see :data:`EVALUATE_KEYS`
``notes``                 list of strings: every value the SPEC does not give, and why
``shares_training_with``  (optional) name of a config whose training run (checkpoints)
                          this one reuses -- it differs only in decoding
========================  ==================================================================

Command line (the scripts call these)::

    python scripts/recipes.py argv CONFIG [--data DIR] [--save-dir DIR] [-- EXTRA...]
    python scripts/recipes.py train CONFIG [--data DIR] [--save-dir DIR] [EXTRA...]
    python scripts/recipes.py evaluate CONFIG [--checkpoint-dir DIR] [--data DIR]
    python scripts/recipes.py reproduce CONFIG... [--out DIR] [--data DIR] [-- EXTRA...]
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
    "average_last_epochs": (REQUIRED, (int,)),   # N last checkpointE.pt averaged; 1 = the last
    "gen_subset": ("test", (str,)),
    "beam": (REQUIRED, (int,)),
    "lenpen": (REQUIRED, (int, float)),
    "max_len_a": (REQUIRED, (int, float)),
    "max_len_b": (REQUIRED, (int,)),
    "batch_size": (128, (int,)),
    "remove_bpe": (REQUIRED, (str, type(None))),  # fairseq --remove-bpe value; null = none
    "lowercase": (False, (bool,)),               # lowercase hyps and refs for tokenized BLEU
    "compound_split": (False, (bool,)),          # ##AT##-##AT## splitting (WMT)
    "model_overrides": (None, (dict, type(None))),  # fairseq-generate --model-overrides
    "detok_lang": (None, (str, type(None))),     # sacremoses language (default target_lang)
}

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
    for key in ("average_last_epochs", "beam", "batch_size"):
        if ev[key] < 1:
            raise ConfigError(f"{where}: evaluate: {key!r} must be >= 1, got {ev[key]}")
    if ev["detok_lang"] is None:
        ev["detok_lang"] = raw["target_lang"]

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


def detokenized_sacrebleu(hyps: Sequence[str], refs: Sequence[str], lang: str):
    """sacremoses-detokenize both sides, then sacreBLEU; returns (score, signature)."""
    from sacrebleu.metrics import BLEU
    from sacremoses import MosesDetokenizer

    md = MosesDetokenizer(lang=lang)

    def detok(line):
        return md.detokenize(line.split())

    bleu = BLEU()
    result = bleu.corpus_score([detok(h) for h in hyps], [[detok(r) for r in refs]])
    return result.score, str(bleu.get_signature())


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

def epoch_checkpoints(folder) -> List[Path]:
    """checkpointE.pt files of a save dir, oldest epoch first."""
    found = []
    for p in Path(folder).glob("checkpoint*.pt"):
        m = re.fullmatch(r"checkpoint(\d+)\.pt", p.name)
        if m:
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


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


def choose_checkpoint(recipe: Recipe, ckdir: Path, log=print):
    """Average the last N epoch checkpoints (normplug-average); returns (path, [inputs])."""
    ckdir = Path(ckdir)
    found = epoch_checkpoints(ckdir)
    if not found:
        last = ckdir / "checkpoint_last.pt"
        if last.exists():
            log(f"no epoch checkpoints in {ckdir}; using {last.name}")
            return last, [last]
        raise ConfigError(f"no checkpoints (checkpointN.pt) in {ckdir}: train first "
                          f"(scripts/train.sh {recipe.path})")
    n = recipe.evaluate["average_last_epochs"]
    chosen = found[-n:]
    if len(chosen) < n:
        log(f"only {len(chosen)} epoch checkpoint(s) in {ckdir}, recipe averages {n}: "
            f"averaging {len(chosen)}")
    if len(chosen) == 1:
        return chosen[0], chosen
    out = ckdir / f"averaged_last{len(chosen)}.pt"
    stamp = ckdir / f"averaged_last{len(chosen)}.inputs"
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


def evaluate(recipe: Recipe, ckdir=None, data=None, checkpoint=None, extra_generate=(),
             log=print) -> Dict[str, object]:
    """Decode the test set, score it both ways, write scores-<name>.{json,csv} in ckdir."""
    ckdir = Path(ckdir) if ckdir else recipe.default_save_dir()
    t0 = time.time()
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
    ev = recipe.evaluate
    tok, tok_detail = tokenized_bleu(hyps, refs, lowercase=ev["lowercase"],
                                     split=ev["compound_split"])
    sacre, signature = detokenized_sacrebleu(hyps, refs, ev["detok_lang"])
    scores = {
        "config": str(recipe.path),
        "name": recipe.name,
        "checkpoint": str(path),
        "averaged": [p.name for p in inputs],
        "sentences": len(hyps),
        "tokenized_bleu": round(tok, 2),
        "tokenized_bleu_detail": tok_detail,
        "tokenized_bleu_settings": {"lowercase": ev["lowercase"],
                                    "compound_split": ev["compound_split"],
                                    "remove_bpe": ev["remove_bpe"]},
        "fairseq_generate_bleu": generate_bleu,
        "sacrebleu": round(sacre, 2),
        "sacrebleu_signature": signature,
        "sacrebleu_note": ("sacremoses-detokenized hypotheses against the sacremoses-detokenized "
                           "references of the binarized test set (as cased as that data is)"),
        "published": recipe.published,
        "metric": recipe.metric,
        "decoding": {k: ev[k] for k in ("gen_subset", "beam", "lenpen", "max_len_a",
                                        "max_len_b", "model_overrides")},
        "seconds": round(time.time() - t0, 1),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }
    with open(ckdir / f"scores-{recipe.name}.json", "w", encoding="utf-8") as f:
        json.dump(scores, f, indent=2)
        f.write("\n")
    keys = ["name", "tokenized_bleu", "sacrebleu", "sacrebleu_signature", "published",
            "checkpoint", "sentences"]
    with open(ckdir / f"scores-{recipe.name}.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(keys)
        w.writerow([scores[k] for k in keys])
    log(f"{recipe.name}: tokenized BLEU {tok:.2f} ({tok_detail})"
        + (f" [fairseq-generate: {generate_bleu:.2f}]" if generate_bleu is not None else ""))
    log(f"{recipe.name}: sacreBLEU {sacre:.2f}  {signature}")
    if recipe.published is not None:
        log(f"{recipe.name}: published {recipe.published} ({recipe.metric})")
    log(f"wrote {ckdir / f'scores-{recipe.name}.json'}")
    return scores


# ----------------------------------------------------------------------------- training

def train(recipe: Recipe, save_dir=None, extra=(), data=None, log_path=None, echo=True,
          log=print) -> int:
    save_dir = Path(save_dir) if save_dir else recipe.default_save_dir()
    # a --save-dir among the extra arguments wins
    for key, words in split_extra(extra):
        if key == "save-dir" and words:
            save_dir = Path(words[0])
    save_dir.mkdir(parents=True, exist_ok=True)
    argv = train_argv(recipe, save_dir=save_dir, extra=extra, data=data)
    log("$ " + " ".join(shlex.quote(a) for a in argv))
    rc, _ = _run(argv, log_path=log_path or save_dir / "train.log", echo=echo)
    return rc


# ----------------------------------------------------------------------------- reproduce

RESULT_COLUMNS = ["config", "dataset", "setting", "norm", "paper", "metric", "published",
                  "tokenized_bleu", "delta", "sacrebleu", "sacrebleu_signature", "recipe",
                  "checkpoints_averaged", "train_seconds", "status"]


def _fmt(v, digits=2):
    if v is None or v == "":
        return "—"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def write_results(rows, out: Path):
    with open(out / "results.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=RESULT_COLUMNS)
        w.writeheader()
        for row in rows:
            w.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in RESULT_COLUMNS})
    lines = [
        "# normplug: reproduction results",
        "",
        "Ours = tokenized BLEU computed as the paper did (fairseq's scorer on the tokenized,",
        "BPE-removed output; compound-split for WMT); Δ = ours − published.",
        "Recipe `full` = the config as written; otherwise the extra fairseq-train",
        "arguments that shortened or changed it (such a run is not comparable to the paper).",
        "",
        "| config | dataset | setting | norm | published | ours | Δ | sacreBLEU | recipe | status |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append("| " + " | ".join([
            r["config"], r["dataset"], r["setting"], r["norm"], _fmt(r.get("published"), 1),
            _fmt(r.get("tokenized_bleu")), _fmt(r.get("delta")), _fmt(r.get("sacrebleu")),
            r["recipe"].replace("|", "\\|"), r["status"].replace("|", "\\|"),
        ]) + " |")
    sigs = sorted({r["sacrebleu_signature"] for r in rows if r.get("sacrebleu_signature")})
    lines += ["", "sacreBLEU: sacremoses-detokenized hypotheses and references of the binarized "
              "test set; signature" + ("s" if len(sigs) > 1 else "") + ":"]
    lines += [f"`{s}`" for s in sigs] or ["—"]
    lines += ["", "Papers:", ""]
    for paper in sorted({r["paper"] for r in rows}):
        lines.append(f"- {paper}")
    lines.append("")
    (out / "results.md").write_text("\n".join(lines), encoding="utf-8")


def reproduce(config_paths: Sequence, out, extra: Sequence[str] = (), data=None,
              log=print) -> int:
    """Train and evaluate each config; results.md / results.csv in ``out``. Returns an exit code."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    recipes = [load_config(p) for p in config_paths]  # every config is checked before any work
    split_extra(extra)
    recipe_label = "full" if not extra else "shortened (extra args: " + " ".join(extra) + ")"
    rows, trained, failed = [], {}, 0
    for recipe in recipes:
        ckdir = out / recipe.training_name
        row = {"config": recipe.name, "dataset": recipe.dataset, "setting": recipe.setting,
               "norm": recipe.norm, "paper": recipe.paper, "metric": recipe.metric,
               "published": recipe.published, "recipe": recipe_label, "status": "ok"}
        try:
            if recipe.training_name not in trained:
                log(f"== {recipe.name}: training into {ckdir}")
                t0 = time.time()
                rc = train(recipe, save_dir=ckdir, extra=extra, data=data, echo=False, log=log)
                trained[recipe.training_name] = (rc, round(time.time() - t0, 1))
            rc, seconds = trained[recipe.training_name]
            row["train_seconds"] = seconds
            if rc != 0:
                raise RuntimeError(f"fairseq-train exited {rc}; see {ckdir / 'train.log'}")
            log(f"== {recipe.name}: evaluating")
            scores = evaluate(recipe, ckdir, data=data, log=log)
            row.update(tokenized_bleu=scores["tokenized_bleu"], sacrebleu=scores["sacrebleu"],
                       sacrebleu_signature=scores["sacrebleu_signature"],
                       checkpoints_averaged=" ".join(scores["averaged"]))
            if recipe.published is not None:
                row["delta"] = round(scores["tokenized_bleu"] - recipe.published, 2)
        except (RuntimeError, ConfigError, OSError) as err:
            failed += 1
            row["status"] = "failed: " + " ".join(str(err).split())[:300]
            log(f"== {recipe.name}: {row['status']}")
        rows.append(row)
        write_results(rows, out)  # after every config: partial results survive a crash
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
    p = sub.add_parser("evaluate", help="average, decode, score (tokenized BLEU and sacreBLEU)",
                       allow_abbrev=False)
    p.add_argument("config")
    p.add_argument("--checkpoint-dir", help="save dir of the run (default checkpoints/<name>)")
    p.add_argument("--checkpoint", help="score this checkpoint instead of averaging")
    p.add_argument("--data", help="binarized data folder (default: the config's)")
    p = sub.add_parser("reproduce", help="train + evaluate configs; results.md/.csv",
                       allow_abbrev=False)
    p.add_argument("configs", nargs="+")
    p.add_argument("--out", default="runs/reproduce", help="output folder (default %(default)s)")
    p.add_argument("--data", help="binarized data folder for every config (default: each config's)")
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
            return reproduce(args.configs, args.out, extra=extra, data=args.data)
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
