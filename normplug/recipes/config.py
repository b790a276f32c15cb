"""The config format: one YAML file per published row (``base: FILE`` merged in), read into a
:class:`Recipe`; its paths are relative to the current directory, as fairseq's are."""
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

import yaml

from normplug.errors import NormplugError

REQUIRED = object()
# key -> (default or REQUIRED, allowed types); each task adds its own (TASK_KEYS)
TOP_KEYS = {key: (REQUIRED, (str,)) for key in (
    "name", "dataset", "setting", "norm", "paper", "metric", "data", "provenance")}
TOP_KEYS.update(published=(REQUIRED, (int, float, type(None))), train=(REQUIRED, (dict,)),
                evaluate=(REQUIRED, (dict,)), shares_training_with=(None, (str, type(None))))
CHECKPOINT_KEYS = {  # which checkpoint is evaluated: exactly one of the three
    "checkpoint": (None, (str, type(None))),            # best | last
    "average_last_epochs": (None, (int, type(None))),   # the last N checkpointE.pt
    "average_last_updates": (None, (int, type(None))),  # the last N checkpoint_E_U.pt
}
CHECKPOINT_CHOICES = tuple(CHECKPOINT_KEYS)
TRANSLATION_EVALUATE_KEYS = {
    **CHECKPOINT_KEYS, "gen_subset": ("test", (str,)), "beam": (REQUIRED, (int,)), "lenpen": (REQUIRED, (int, float)),
    "max_len_a": (REQUIRED, (int, float)), "max_len_b": (REQUIRED, (int,)), "batch_size": (128, (int,)),
    "remove_bpe": (REQUIRED, (str, type(None))),    # fairseq --remove-bpe value ("@@ ", sentencepiece); null = none
    "lowercase": (False, (bool,)),                  # lowercase hyps and refs (both BLEUs)
    "compound_split": (False, (bool,)),             # ##AT##-##AT## splitting (WMT)
    "model_overrides": (None, (dict, type(None))),  # fairseq-generate --model-overrides
    "detok_lang": (None, (str, type(None))),        # sacremoses language (default target_lang)
    "sacrebleu_test_set": (None, (str, type(None))),  # sacreBLEU's references (wmt14/full); null: the test set's
    # scripts/prepare-text.sh data: hypotheses detokenized by --post-process sentencepiece, scored by sacreBLEU
    # and chrF against the raw text it kept (DATA/raw/SPLIT.TGT); no tokenized BLEU
    "raw_references": (False, (bool,)),
}
LM_EVALUATE_KEYS = {
    **CHECKPOINT_KEYS, "gen_subset": ("test", (str,)), "batch_size": (10, (int,)),  # windows a batch
    # fairseq's sliding window: each window of the training length scores its last
    # (length - context_window) tokens with the context_window tokens before them
    "context_window": (REQUIRED, (int,))}
TASK_KEYS = {  # the fairseq tasks with recipes: their top-level keys and evaluate: keys
    # null languages: those of the data folder's prepare.json (scripts/prepare-text.sh), read by load_config
    "translation": ({"source_lang": (REQUIRED, (str, type(None))), "target_lang": (REQUIRED, (str, type(None)))},
                    TRANSLATION_EVALUATE_KEYS),
    "language_modeling": ({}, LM_EVALUATE_KEYS)}
RESERVED_TRAIN = {"user-dir": "the driver adds the plugin directory", "data": "use the top-level key data",
                  "save-dir": "chosen per run (--save-dir on the command line)",
                  "cpu": "the driver adds it when no GPU is available",
                  "distributed-world-size": "the driver pins 1 GPU, as the papers trained (more: --gpus N)",
                  "source-lang": "use the top-level key source_lang",
                  "target-lang": "use the top-level key target_lang"}
TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", dict: "a mapping", list: "a list",
              bool: "true or false", type(None): "null"}


class ConfigError(NormplugError):
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
    provenance: str
    train: Dict[str, object]
    evaluate: Dict[str, object]
    shares_training_with: Optional[str] = None
    source_lang: Optional[str] = None  # translation
    target_lang: Optional[str] = None
    seed: int = 1  # fairseq-train's --seed: the config's, or the one the driver was given
    train_extra: Tuple[str, ...] = ()  # fairseq-train arguments over the config's: a changed run
    evaluate_extra: Tuple[str, ...] = ()  # fairseq-generate / -eval-lm arguments that change speed, not scores

    @property
    def training_name(self) -> str:  # this config's run, or the one it shares
        return self.shares_training_with or self.name

    @property
    def task(self) -> str:
        return task_name(self.train)

    def train_value(self, flag: str):  # written with dashes or underscores
        return self.train.get(flag, self.train.get(flag.replace("-", "_")))

    @property
    def data_path(self) -> Path:
        return Path(self.data).resolve()

    @property
    def detok_lang(self) -> str:  # sacremoses' language: the config's, or the target language
        return self.evaluate.get("detok_lang") or self.target_lang


def task_name(train) -> str:
    """The fairseq task of a config's ``train:`` mapping (translation unless it says)."""
    return str(train.get("task", "translation")) if isinstance(train, dict) else "translation"


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
            names = " or ".join(TYPE_NAMES[t] for t in types if t is not int or float not in types)  # ints are numbers
            raise ConfigError(f"{where}key {key!r} must be {names}, got {type(value).__name__} {value!r}")
    return out


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML keeps the last of two equal keys; a config refuses them."""

    def construct_mapping(self, node, deep=False):
        keys = [self.construct_object(key, deep=deep) for key, _ in node.value]
        for i, key in enumerate(keys):
            if key in keys[:i]:
                raise ConfigError(f"duplicate key {key!r} (line {node.value[i][0].start_mark.line + 1})")
        return super().construct_mapping(node, deep)


def read_merged(path: Path, chain=()) -> dict:
    """A config's mapping, its ``base:`` chain merged in (its values win); ``chain``: the files that led here."""
    chain = (*chain, path)
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except ConfigError as err:  # a duplicate key
        raise ConfigError(f"{path}: {err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(err).split())}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: must be a YAML mapping with keys {', '.join(TOP_KEYS)}")
    base = raw.pop("base", None)
    if base is None:
        return raw
    base_path = path.parent / str(base)
    if not isinstance(base, str) or not base_path.is_file():
        raise ConfigError(f"{path}: base file {base_path} not found")
    if base_path.resolve() in {p.resolve() for p in chain}:
        raise ConfigError(f"{chain[0]}: its base files form a loop: {' -> '.join(map(str, (*chain, base_path)))}")
    return merge(read_merged(base_path, chain), raw)


def merge(base: dict, child: dict) -> dict:
    """Mappings merge key by key (the child wins); any other child value replaces the base's."""
    out = dict(base)
    for key, value in child.items():
        both = isinstance(value, dict) and isinstance(base.get(key), dict)
        out[key] = merge(base[key], value) if both else value
    return out


def load_config(path, data=None) -> "Recipe":
    """Read one config and check what its format owns; fairseq's flags are fairseq's to check. ``data``: the data
    folder that replaces the config's (--data), whose prepare.json gives the languages a config leaves null."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    raw = read_merged(path)
    name = task_name(raw.get("train"))
    if name not in TASK_KEYS:
        raise ConfigError(f"{path}: train: task {name!r} has no recipes here (known: {', '.join(TASK_KEYS)})")
    top_keys, evaluate_keys = TASK_KEYS[name]
    top = _checked(f"{path}: ", raw, {**TOP_KEYS, **top_keys})
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
    ev = _checked(f"{path}: evaluate: ", top["evaluate"], evaluate_keys)
    chosen = [k for k in CHECKPOINT_CHOICES if ev[k] is not None]
    if len(chosen) != 1:
        raise ConfigError(f"{path}: evaluate: set exactly one of {', '.join(map(repr, CHECKPOINT_CHOICES))} "
                          f"(which checkpoint is evaluated), got {' and '.join(map(repr, chosen)) or 'none'}")
    if ev["checkpoint"] not in (None, "best", "last"):
        raise ConfigError(f"{path}: evaluate: 'checkpoint' must be one of best, last, got {ev['checkpoint']!r}")
    for key in ("average_last_epochs", "average_last_updates", "beam", "batch_size"):
        if ev.get(key) is not None and ev[key] < 1:
            raise ConfigError(f"{path}: evaluate: {key!r} must be >= 1, got {ev[key]}")
    if data is not None:
        top["data"] = str(Path(data).resolve())
    if name == "translation" and None in (top["source_lang"], top["target_lang"]):
        top.update(data_languages(Path(top["data"])))
    seed = top["train"].get("seed", 1)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ConfigError(f"{path}: train: 'seed' must be a whole number >= 0, got {seed!r}")
    top.update(evaluate=ev, path=path, seed=seed)
    top["published"] = None if top["published"] is None else float(top["published"])
    recipe = Recipe(**top)
    (check_translation if name == "translation" else check_language_model)(recipe)
    return recipe


def data_languages(folder: Path) -> Dict[str, Optional[str]]:
    """source_lang and target_lang of a data folder's prepare.json (none without one: check_data says so)."""
    import json
    try:
        info = json.loads((folder / "prepare.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {key: info.get(key) for key in ("source_lang", "target_lang")}


def raw_references_path(recipe: Recipe) -> Path:
    """The raw text that scripts/prepare-text.sh kept of the evaluated split's target side."""
    return recipe.data_path / "raw" / f"{recipe.evaluate['gen_subset']}.{recipe.target_lang}"


def check_translation(recipe: Recipe):
    """sacreBLEU's language and references."""
    ev = recipe.evaluate
    if ev["raw_references"] and ev["sacrebleu_test_set"] is not None:
        raise ConfigError(f"{recipe.path}: evaluate: raw_references and sacrebleu_test_set both name the "
                          "references: set one")
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
    """Evaluation uses windows of the training length: train: must say it, and the context leave a token."""
    length, context = recipe.train_value("tokens-per-sample"), recipe.evaluate["context_window"]
    if not isinstance(length, int) or isinstance(length, bool) or length < 2:
        raise ConfigError(f"{recipe.path}: train: 'tokens-per-sample' must be set to the training length "
                          f"(an integer >= 2; evaluation uses windows of that length), got {length!r}")
    if not 1 <= context < length:
        raise ConfigError(f"{recipe.path}: evaluate: 'context_window' must be in 1 .. {length - 1} (the "
                          f"training length {length} minus at least one scored token), got {context}")
