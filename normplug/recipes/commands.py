"""The fairseq command lines of a recipe, and the driver's child processes and files."""
import contextlib
import io
import json
import logging
import os
import re
import shlex
import signal
import subprocess
import threading
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

import normplug
from normplug.errors import NormplugError
from normplug.tools.common import atomic_path, fairseq_exe, first_line

from .config import ConfigError, Recipe
from .passthrough import split_extra

PLUGIN_DIR = Path(normplug.__file__).resolve().parent  # what --user-dir imports


def _words(value) -> Optional[List[str]]:
    """A config value as argv words; None = leave the flag out."""
    if value is True:
        return []
    if value is False or value is None:
        return None
    # repr of a float is exact and what argparse's float() reads back (0.0005, 1e-07)
    return [repr(v) if isinstance(v, float) else str(v) for v in (value if isinstance(value, list) else [value])]


def merged_flags(recipe: Recipe) -> Dict[str, List[str]]:
    """The fairseq-train flags of a recipe: the config's, its seed, the extra arguments over them (an override
    goes last, in the log)."""
    flags = {key: words for key, value in recipe.train.items() if (words := _words(value)) is not None}
    flags.pop("seed", None)
    flags["seed"] = [str(recipe.seed)]
    for key, words in split_extra(recipe.train_extra):
        flags.pop(key, None)
        flags[key] = words
    return flags


def flag_changes(old: Dict[str, List[str]], new: Dict[str, List[str]]) -> str:
    """What differs from one set of fairseq-train flags to another: ``--lr 0.0005 -> 0.001, ...``."""
    def said(flags, key):
        return (" ".join(flags[key]) or "(set)") if key in flags else "(unset)"
    return ", ".join(f"--{key} {said(old, key)} -> {said(new, key)}"
                     for key in dict.fromkeys([*old, *new]) if old.get(key) != new.get(key))


def use_gpu(gpu: Optional[bool] = None) -> bool:  # None: whether this machine has one
    return torch.cuda.is_available() if gpu is None else gpu


def train_argv(recipe: Recipe, save_dir, gpu: Optional[bool] = None, exe: bool = True) -> List[str]:
    """The full ``fairseq-train`` command line of a recipe (``exe`` False: its arguments only): ``--cpu``
    without a GPU, else one GPU, as the papers trained (fairseq 0.12 takes every visible GPU unless told;
    ``--distributed-world-size N`` among the extra arguments spreads a run, its BN statistics per GPU)."""
    languages = {f"{side}-lang": [lang] for side, lang in (("source", recipe.source_lang),
                                                            ("target", recipe.target_lang)) if lang}
    # every epoch's batches from seed + epoch: a run resumed from any checkpoint is bitwise the uninterrupted one
    # (by default fairseq keeps the batches of the epoch it started in, which a resumed run does not know)
    flags = {"user-dir": [str(PLUGIN_DIR)], **languages, "update-epoch-batch-itr": ["True"], **merged_flags(recipe),
             "save-dir": [str(Path(save_dir).resolve())]}
    if "cpu" not in flags:
        flags.update({"distributed-world-size": flags.get("distributed-world-size", ["1"])} if use_gpu(gpu) else
                     {"cpu": []})
    argv = [fairseq_exe("fairseq-train")] if exe else []
    argv.append(str(recipe.data_path))
    for key, words in flags.items():
        argv += ["--" + key, *words]
    return argv


_FAIRSEQ_PARSER = threading.Lock()
STOPPING_RULES = ("max-epoch", "max-update")


def check_flags(recipe: Recipe, argv: Sequence[str], processes_here: Optional[int] = None):
    """Refuse, in one line naming the config, what fairseq-train would refuse of ``argv`` (no executable) or
    train nothing with: its parser, a stopping rule <= 0, more GPUs than visible, and the plugin's checks of
    the task, model and criterion it builds (built here on the meta device: shapes only, no data read)."""
    from fairseq import options, tasks
    err = io.StringIO()
    with _FAIRSEQ_PARSER, contextlib.redirect_stderr(err):
        logging.disable(logging.INFO)  # "--user-dir ... has already been imported"
        try:
            args = options.parse_args_and_arch(options.get_training_parser(), list(argv))
            check_stopping_rules(args, argv)
            if processes_here:  # one node's share of a run over several
                check_visible_gpus(processes_here)
            elif args.distributed_init_method is None:  # workers started by hand (gloo on CPUs) name theirs
                check_visible_gpus(args.distributed_world_size, "--distributed-world-size")
            task = tasks.setup_task(args)
            with torch.device("meta"):
                task.build_model(args)
                task.build_criterion(args)
        except SystemExit:
            said = (err.getvalue().strip().splitlines() or ["exited"])[-1].split(": error: ", 1)[-1]
            raise ConfigError(f"{recipe.path}: fairseq-train refuses its arguments: {said}") from None
        except NormplugError as problem:  # the plugin's checks, and a stopping rule: one line each
            raise ConfigError(f"{recipe.path}: fairseq-train refuses its arguments: {problem}") from None
        except Exception as problem:
            raise ConfigError(f"{recipe.path}: fairseq-train cannot build its task, model and criterion: "
                              f"{first_line(problem)}") from None
        finally:
            logging.disable(logging.NOTSET)


def check_stopping_rules(args, argv: Sequence[str]):
    """Raise NormplugError for --max-epoch/--max-update <= 0 given in ``argv``: below 0 fairseq-train stops
    before its first update and exits 0; 0 is its default, "no limit"."""
    for flag in STOPPING_RULES:
        value = getattr(args, flag.replace("-", "_"))
        given = any(word == f"--{flag}" or word.startswith(f"--{flag}=") for word in argv)
        if value < 0 or (given and value == 0):
            raise NormplugError(f"--{flag} {value} trains nothing: give a number over 0 (below 0 fairseq-train "
                                "stops at once and exits 0; it reads 0 as no limit: leave the flag out for that)")


def _scoring_argv(tool, recipe: Recipe, checkpoint, gpu, flags, exe) -> List[str]:
    """``tool`` (``exe`` False: its arguments only) on a checkpoint with ``flags``, --cpu without a GPU, and
    the recipe's evaluation arguments."""
    gpu_or_cpu = [] if use_gpu(gpu) or "--cpu" in recipe.evaluate_extra else ["--cpu"]
    return [*([fairseq_exe(tool)] if exe else []), str(recipe.data_path), "--user-dir", str(PLUGIN_DIR),
            "--path", str(checkpoint), *flags, *gpu_or_cpu, *recipe.evaluate_extra]


def generate_argv(recipe: Recipe, checkpoint, gpu: Optional[bool] = None, exe: bool = True) -> List[str]:
    """``fairseq-generate`` with the recipe's decoding settings."""
    ev = recipe.evaluate
    languages = ["--source-lang", recipe.source_lang, "--target-lang", recipe.target_lang] if recipe.source_lang else []
    flags = [*languages, "--gen-subset", ev["gen_subset"],
             # fairseq 0.12's batch_by_size drops the sentences that do not fill a multiple
             # of 8 at the end of a batch (30 test sentences: 24 decoded); 1 decodes them all
             "--required-batch-size-multiple", "1"]
    for key in ("beam", "lenpen", "max_len_a", "max_len_b", "batch_size"):
        flags += ["--" + key.replace("_", "-"), *_words(ev[key])]
    if ev["remove_bpe"]:  # fairseq's --post-process, alias --remove-bpe (the papers' "@@ ")
        flags += ["--post-process" if ev["remove_bpe"] == "sentencepiece" else "--remove-bpe", ev["remove_bpe"]]
    if ev["model_overrides"]:
        flags += ["--model-overrides", python_dict(ev["model_overrides"])]
    return _scoring_argv("fairseq-generate", recipe, checkpoint, gpu, flags, exe)


def python_dict(mapping) -> str:
    """A dict as fairseq's --model-overrides reads it (ast.literal_eval) and as a person types it: its strings
    in JSON's double quotes, so that a shell's single quotes hold the whole."""
    return "{" + ", ".join(f"{json.dumps(str(k))}: {json.dumps(v) if isinstance(v, str) else repr(v)}"
                           for k, v in mapping.items()) + "}"


def command_line(argv: Sequence) -> str:
    """``argv`` as a person types it: shlex's single quotes, or double quotes around a word that holds a single
    quote and nothing a shell expands inside double quotes."""
    return " ".join(f'"{word}"' if "'" in word and not set(word) & set('"$`\\!') else shlex.quote(word)
                    for word in map(str, argv))


def check_visible_gpus(gpus: int, flag: str = "--gpus"):
    """Refuse, before anything starts, a run over more GPUs than this process sees (fairseq-train would stop
    with an AssertionError after its start-up); ``flag`` asked for them."""
    visible = torch.cuda.device_count()
    if gpus > max(visible, 1):
        devices = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise ConfigError(f"{flag} {gpus}: {visible} GPU{'' if visible == 1 else 's'} visible here"
                          f"{'' if devices is None else f' (CUDA_VISIBLE_DEVICES={devices})'}; --dry-run prints "
                          f"the {gpus}-GPU command lines on any machine")


def eval_lm_argv(recipe: Recipe, checkpoint, context_window: int, gpu: Optional[bool] = None,
                 exe: bool = True) -> List[str]:
    """``fairseq-eval-lm`` on windows of the training length, each scoring its last tokens after context_window."""
    ev, length = recipe.evaluate, recipe.train_value("tokens-per-sample")
    flags = ["--task", "language_modeling", "--gen-subset", ev["gen_subset"], "--sample-break-mode", "none",
             "--tokens-per-sample", str(length), "--context-window", str(context_window),
             "--batch-size", str(ev["batch_size"]), "--no-progress-bar",
             *(["--output-word-probs"] if context_window == 0 else [])]  # each window's log-probability: compare
    return _scoring_argv("fairseq-eval-lm", recipe, checkpoint, gpu, flags, exe)


def child_env(threads: Optional[int] = None) -> Dict[str, str]:
    """Every child's environment: this normplug first on the path; ``threads`` caps BLAS/OpenMP."""
    env = dict(os.environ)
    env.setdefault("PYTHONWARNINGS", "ignore")
    env["PYTHONPATH"] = os.pathsep.join([str(PLUGIN_DIR.parent)] + [p for p in [env.get("PYTHONPATH")] if p])
    if threads:
        env.update({v: str(threads) for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")})
    return env


def run_logged(argv, log_path=None, echo=None, env=None, mode="w") -> Tuple[int, str]:
    """Run a command, its stdout and stderr written (``mode`` "a": appended) to ``log_path`` and, line by
    line, given to ``echo``. Returns (exit status, output)."""
    lines = []
    with open(log_path or os.devnull, mode, encoding="utf-8") as log:
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


def run_checked(argv, what: str, log_path) -> str:
    """:func:`run_logged`, its output returned; a failure raises the tool's own last error line."""
    rc, text = run_logged(argv, log_path)
    if rc != 0:
        raise RuntimeError(f"{what} failed (exit {rc}): {last_error(text)} (full log: {log_path})")
    return text


def last_error(text: str) -> str:
    """The last ``SomeError: message`` line of a Python tool's output (a traceback's last word), else its last
    line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"([\w.]*(Error|Exception)|KeyboardInterrupt)(: |$)", line)]
    return (errors or lines or ["(no output)"])[-1]


def write_atomic(path: Path, text: str):
    """Write a whole file or nothing: a reader never sees a half-written one."""
    with atomic_path(str(path)) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")
