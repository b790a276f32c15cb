"""The fairseq command lines of a recipe, and the driver's child processes and files."""
import contextlib
import io
import logging
import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import normplug
from normplug.tools.common import atomic_path, fairseq_exe

from .config import ConfigError, Recipe

PLUGIN_DIR = Path(normplug.__file__).resolve().parent  # what --user-dir imports


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
    """The recipe's train flags, the extra arguments over them (an override goes last, in the log)."""
    flags = {key: words for key, value in recipe.train.items() if (words := _words(value)) is not None}
    for key, words in split_extra(extra):
        flags.pop(key, None)
        flags[key] = words
    return flags


def flag_changes(old: Dict[str, List[str]], new: Dict[str, List[str]]) -> str:
    """What differs from one set of fairseq-train flags to another: ``--lr 0.0005 -> 0.001, ...``."""
    def said(flags, key):
        return (" ".join(flags[key]) or "(set)") if key in flags else "(unset)"
    return ", ".join(f"--{key} {said(old, key)} -> {said(new, key)}"
                     for key in dict.fromkeys([*old, *new]) if old.get(key) != new.get(key))


def recipe_changes(extra: Sequence[str]) -> List[str]:
    """The extra fairseq-train arguments that change the recipe (``--save-dir`` does not)."""
    return [w for key, words in split_extra(extra) if key != "save-dir" for w in ("--" + key, *words)]


def use_gpu(gpu: Optional[bool] = None) -> bool:
    import torch

    return torch.cuda.is_available() if gpu is None else gpu


def device_flags(flags: Dict[str, List[str]], gpus: int = 1, bn_sync_stats: bool = False,
                 gpu: Optional[bool] = None) -> Dict[str, List[str]]:
    """``--cpu``, or the GPU count pinned (fairseq 0.12 takes every visible GPU unless told);
    N GPUs divide update-freq by N, which keeps the effective batch."""
    if gpus < 1:
        raise ConfigError(f"--gpus must be 1 or more, got {gpus}")
    if bn_sync_stats and gpus == 1:
        raise ConfigError("--bn-sync-stats syncs BN statistics across GPUs: it needs --gpus N with N > 1")
    if "cpu" in flags or not use_gpu(gpu):
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
    """fairseq-train's own parser on ``argv`` (no executable); its error as one line naming the config."""
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


def _scoring_argv(tool, recipe: Recipe, checkpoint, data, gpu, extra, flags) -> List[str]:
    """``tool`` on a checkpoint of the recipe with ``flags``, then --cpu without a GPU, then ``extra``."""
    return [fairseq_exe(tool), str(recipe.data_path(data)), "--user-dir", str(PLUGIN_DIR),
            "--path", str(checkpoint), *flags, *([] if use_gpu(gpu) else ["--cpu"]), *extra]


def generate_argv(recipe: Recipe, checkpoint, data=None, gpu: Optional[bool] = None,
                  extra: Sequence[str] = ()) -> List[str]:
    """``fairseq-generate`` with the recipe's decoding settings."""
    ev = recipe.evaluate
    flags = ["--source-lang", recipe.source_lang, "--target-lang", recipe.target_lang,
             "--gen-subset", ev["gen_subset"],
             # fairseq 0.12's batch_by_size drops the sentences that do not fill a multiple
             # of 8 at the end of a batch (30 test sentences: 24 decoded); 1 decodes them all
             "--required-batch-size-multiple", "1"]
    for key in ("beam", "lenpen", "max_len_a", "max_len_b", "batch_size"):
        flags += ["--" + key.replace("_", "-"), *_words(ev[key])]
    if ev["remove_bpe"]:
        flags += ["--remove-bpe", ev["remove_bpe"]]
    if ev["model_overrides"]:
        flags += ["--model-overrides", repr(dict(ev["model_overrides"]))]
    return _scoring_argv("fairseq-generate", recipe, checkpoint, data, gpu, extra, flags)


def eval_lm_argv(recipe: Recipe, checkpoint, context_window: int, data=None, gpu: Optional[bool] = None,
                 extra: Sequence[str] = ()) -> List[str]:
    """``fairseq-eval-lm`` on windows of the training length, each scoring its last
    (length - context_window) tokens with the context_window tokens before them."""
    ev, length = recipe.evaluate, recipe.train_value("tokens-per-sample")
    flags = ["--task", "language_modeling", "--gen-subset", ev["gen_subset"], "--sample-break-mode", "none",
             "--tokens-per-sample", str(length), "--context-window", str(context_window),
             "--batch-size", str(ev["batch_size"]), "--no-progress-bar"]
    return _scoring_argv("fairseq-eval-lm", recipe, checkpoint, data, gpu, extra, flags)


def child_env(threads: Optional[int] = None) -> Dict[str, str]:
    """Every child's environment: this normplug first on the path; ``threads`` caps BLAS/OpenMP."""
    env = dict(os.environ)
    env.setdefault("PYTHONWARNINGS", "ignore")
    env["PYTHONPATH"] = os.pathsep.join([str(PLUGIN_DIR.parent)] + [p for p in [env.get("PYTHONPATH")] if p])
    if threads:
        env.update({v: str(threads) for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")})
    return env


def run_logged(argv, log_path=None, echo=None, env=None) -> Tuple[int, str]:
    """Run a command, its stdout and stderr appended to ``log_path`` (a relaunch continues its log) and,
    line by line, given to ``echo``. Returns (exit status, output)."""
    lines = []
    with open(log_path or os.devnull, "a", encoding="utf-8") as log:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env or child_env(), bufsize=1)
        try:
            for line in proc.stdout:
                lines.append(line)
                log.write(line)
                log.flush()
                if echo:
                    echo(line)
        except KeyboardInterrupt:  # a terminal's ^C reached the child too, a `kill -INT` of ours did not
            proc.send_signal(signal.SIGINT)
            log.write(proc.stdout.read())  # its last words go to the log, not the terminal
            proc.wait()
            raise
        rc = proc.wait()
    return rc, "".join(lines)


def run_checked(argv, what: str, log_path=None, env=None) -> str:
    """:func:`run_logged`, its output returned; a failure raises the output's tail."""
    rc, text = run_logged(argv, log_path, env=env)
    if rc != 0:
        see = f"; see {log_path}" if log_path else ""
        raise RuntimeError(f"{what} failed (exit {rc}){see}:\n{text[-3000:]}")
    return text


def write_atomic(path: Path, text: str):
    """Write a whole file or nothing: a reader never sees a half-written one."""
    with atomic_path(str(path)) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")
