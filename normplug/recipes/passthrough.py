"""The arguments after ``--``: merged into the recipe once, where the config is read, so that training,
evaluation, the run record and the table all see the same facts. Each flag is understood (it changes the
recipe: direction, seed, split), passed through to fairseq (recorded as a change of the run), or refused in
one line that names the config key to use instead."""
import dataclasses
from typing import Dict, List, Sequence, Tuple

from .config import ConfigError, Recipe

# Flags of either phase the driver owns: what to use instead.
DRIVER_FLAGS = {
    "user-dir": "the driver adds the plugin directory",
    "save-dir": "the run goes to --out OUT (OUT/<name>); give the driver --out",
    "path": "give the driver --checkpoint FILE to score another checkpoint",
    "task": "set train: task in a config (a config with `base: CONFIG` and the key overrides it); the task "
            "decides how the run is evaluated",
    "data": "give the driver --data DIR",
}
# fairseq-generate / fairseq-eval-lm flags the config's evaluate: keys set: they change the numbers.
EVALUATE_KEYS = {"beam": "beam", "lenpen": "lenpen", "max-len-a": "max_len_a", "max-len-b": "max_len_b",
                 "batch-size": "batch_size", "max-sentences": "batch_size", "model-overrides": "model_overrides",
                 "remove-bpe": "remove_bpe", "post-process": "remove_bpe", "bpe": "remove_bpe",
                 "tokenizer": "remove_bpe", "context-window": "context_window",
                 "tokens-per-sample": "context_window (and train: tokens-per-sample)"}
# Flags that change how fast the scores come, never what they are: passed to fairseq-generate / -eval-lm.
EVALUATE_PASSED = ("cpu", "fp16", "bf16", "memory-efficient-fp16", "max-tokens", "num-workers")
LANGUAGES = ("source-lang", "target-lang")


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


def _one_value(key: str, words: List[str]) -> str:
    if len(words) != 1:
        raise ConfigError(f"--{key} takes one value, got {len(words)}: {' '.join(words) or '(none)'}")
    return words[0]


def _direction(recipe: Recipe, given: Dict[str, str]) -> Dict[str, str]:
    """source_lang/target_lang of a recipe with ``--source-lang``/``--target-lang`` given."""
    if recipe.task != "translation":
        raise ConfigError(f"--{next(iter(given))}: {recipe.path} is a language model; it has no direction")
    langs = {"source_lang": given.get("source-lang", recipe.source_lang),
             "target_lang": given.get("target-lang", recipe.target_lang)}
    if langs["source_lang"] == langs["target_lang"]:
        raise ConfigError(f"--source-lang and --target-lang are both {langs['source_lang']!r}")
    return langs


def with_training_arguments(recipe: Recipe, tokens: Sequence[str]) -> Recipe:
    """The recipe trained with fairseq-train's ``tokens``: the direction and seed understood, the rest passed
    to fairseq-train as changes of the run (the table says so)."""
    changes, langs, seed = [], {}, recipe.seed
    for key, words in split_extra(tokens):
        if key in DRIVER_FLAGS:
            raise ConfigError(f"--{key} after --: {DRIVER_FLAGS[key]}")
        if key == "gen-subset":  # fairseq-train takes it and does nothing with it
            raise ConfigError("--gen-subset after -- of a training: the table scores the config's split; score "
                              "another with `normplug-recipe evaluate CONFIG -- --gen-subset SPLIT`")
        if key in LANGUAGES:
            langs[key] = _one_value(key, words)
        elif key == "seed":
            value = _one_value(key, words)
            if not value.isdigit():
                raise ConfigError(f"--seed must be a whole number >= 0, got {value!r}")
            seed = int(value)
        else:
            changes += ["--" + key, *words]
    recipe = dataclasses.replace(recipe, train_extra=(*recipe.train_extra, *changes), seed=seed)
    return dataclasses.replace(recipe, **_direction(recipe, langs)) if langs else recipe


def with_evaluation_arguments(recipe: Recipe, tokens: Sequence[str]) -> Recipe:
    """The recipe evaluated with fairseq-generate's (or -eval-lm's) ``tokens``: the split and direction
    understood, flags of speed passed, whatever else changes the scores refused with its config key."""
    passed, langs, split = [], {}, recipe.evaluate["gen_subset"]
    for key, words in split_extra(tokens):
        if key in DRIVER_FLAGS:
            raise ConfigError(f"--{key} after --: {DRIVER_FLAGS[key]}")
        if key in EVALUATE_KEYS:
            raise ConfigError(f"--{key} after -- changes the scores: set evaluate: {EVALUATE_KEYS[key]} in a config "
                              "(a config with `base: CONFIG` and the key overrides it), so that its scores say so")
        if key in LANGUAGES:
            langs[key] = _one_value(key, words)
        elif key == "gen-subset":
            split = _one_value(key, words)
        elif key in EVALUATE_PASSED:
            passed += ["--" + key, *words]
        else:
            raise ConfigError(f"--{key} after --: the driver passes fairseq-generate and fairseq-eval-lm only "
                              f"--gen-subset, --source-lang, --target-lang and what changes speed, not scores "
                              f"({', '.join('--' + k for k in EVALUATE_PASSED)}); every sentence of the split is "
                              "scored with the config's evaluate: settings")
    recipe = dataclasses.replace(recipe, evaluate={**recipe.evaluate, "gen_subset": split},
                                 evaluate_extra=(*recipe.evaluate_extra, *passed))
    return dataclasses.replace(recipe, **_direction(recipe, langs)) if langs else recipe
