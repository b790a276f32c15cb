"""Clear one-line errors where fairseq would print a traceback from deep inside itself.

Two places, both without patching fairseq:

* ``check_training_run(args)``, called by the model's ``build_model`` under
  ``fairseq-train`` (before the trainer exists, so before anything is written):
  refuses a checkpoint to resume from that is truncated or not a checkpoint,
  and ``--bf16`` where fairseq 0.12 turns it into ``--tpu`` without torch_xla.
  Every distributed worker builds the model, so every worker stops (fairseq
  reads the checkpoint on rank 0 only; the other ranks would wait for it).
* ``install_excepthook()``, run when ``--user-dir`` imports normplug: an uncaught
  exception raised while fairseq reads a damaged checkpoint
  (``fairseq-generate --path``, ``fairseq-interactive``, …) or sets up the task
  from a data directory without its dictionaries/splits is reported as one
  ``normplug: error:`` line naming the file. Anything else keeps Python's normal
  traceback; ``NORMPLUG_TRACEBACK=1`` shows the traceback in every case.
"""
import os
import sys
import zipfile
from typing import Iterable, List, Optional

PREFIX = "normplug: error:"


# --------------------------------------------------------------------------- checkpoints
def checkpoint_problem(path: str) -> Optional[str]:
    """Why ``path`` cannot be a loadable PyTorch checkpoint, or None if it looks intact.

    Cheap: a zip checkpoint (torch >= 1.6) is checked through its central
    directory, which sits at the end of the file, so any truncation shows; the
    legacy (pre-zip) format is loaded once.
    """
    try:
        size = os.path.getsize(path)
    except OSError as err:
        return f"cannot be read ({err.strerror})"
    if size == 0:
        return "is empty (0 bytes)"
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, OSError, ValueError) as err:
            return f"is a damaged zip archive ({err})"
        if not any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
            return "is a zip archive but not a PyTorch checkpoint (no data.pkl)"
        return None
    with open(path, "rb") as f:
        head = f.read(4)
    if head.startswith(b"PK"):
        return f"is truncated or damaged ({size} bytes; its zip directory is missing)"
    if head[:1] == b"\x80":  # legacy torch.save format: a pickle stream
        import torch

        try:
            torch.load(path, map_location="cpu")
        except Exception as err:  # noqa: BLE001 - any failure means "cannot be loaded"
            return f"cannot be loaded ({type(err).__name__}: {err})"
        return None
    return f"is not a PyTorch checkpoint ({size} bytes)"


def intact_checkpoints(folder: str, exclude: Iterable[str] = ()) -> List[str]:
    """Checkpoint files in ``folder`` that look loadable, newest first."""
    skip = {os.path.abspath(p) for p in exclude}
    try:
        names = [n for n in os.listdir(folder) if n.startswith("checkpoint") and n.endswith(".pt")]
    except OSError:
        return []
    paths = [os.path.join(folder, n) for n in names]
    paths = [p for p in paths if os.path.abspath(p) not in skip and os.path.isfile(p)]
    paths.sort(key=os.path.getmtime, reverse=True)
    return [p for p in paths if checkpoint_problem(p) is None]


def damaged_checkpoint_message(path: str, problem: str, *, resuming: bool) -> str:
    msg = f"{PREFIX} checkpoint {path} {problem}"
    if resuming:
        others = intact_checkpoints(os.path.dirname(path) or ".", exclude=[path])
        if others:
            msg += (f"; intact checkpoints in that folder: {', '.join(os.path.basename(p) for p in others[:4])}"
                    f" — resume from one with --restore-file {others[0]}")
        msg += " (or move the damaged file away to start from scratch)"
    return msg


def restore_path(args) -> Optional[str]:
    """The file ``fairseq-train`` will resume from, as fairseq 0.12's
    ``checkpoint_utils.load_checkpoint`` picks it, or None if there is none."""
    save_dir = getattr(args, "save_dir", None)
    restore = getattr(args, "restore_file", None)
    if save_dir is None or restore is None:
        return None
    suffix = getattr(args, "checkpoint_suffix", "") or ""
    if restore == "checkpoint_last.pt":
        path = os.path.join(save_dir, f"checkpoint_last{suffix}.pt")
        finetune = getattr(args, "finetune_from_model", None)
        if not os.path.exists(path) and finetune:
            path = finetune
    else:
        path = restore.replace(".pt", suffix + ".pt")
    return path if os.path.isfile(path) else None


def _in_fairseq_train() -> bool:
    """True when called under fairseq_cli.train.main (fairseq-train, hydra-train)."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "main" and code.co_filename.replace("\\", "/").endswith("fairseq_cli/train.py"):
            return True
        frame = frame.f_back
    return False


def _has_torch_xla() -> bool:
    try:
        import torch_xla  # noqa: F401
    except ImportError:
        return False
    return True


def check_training_run(args) -> None:
    """Refuse, before anything is built or written, a training run that fairseq
    would abort with a traceback. Does nothing outside fairseq-train."""
    if not _in_fairseq_train():
        return
    if getattr(args, "bf16", False) and getattr(args, "tpu", False) and not _has_torch_xla():
        raise SystemExit(
            f"{PREFIX} fairseq 0.12 turns --bf16 / --memory-efficient-bf16 into --tpu, which "
            "needs torch_xla (not installed), so bf16 training cannot start here. Use "
            "--memory-efficient-fp16 or --fp16 (--fp16-no-flatten-grads on CPU), --amp on a "
            "GPU, or float32"
        )
    path = restore_path(args)
    if path is not None:
        problem = checkpoint_problem(path)
        if problem is not None:
            raise SystemExit(damaged_checkpoint_message(path, problem, resuming=True))


# --------------------------------------------------------------------------- excepthook
def _frames(tb):
    while tb is not None:
        yield tb.tb_frame
        tb = tb.tb_next


def explain(exc: BaseException) -> Optional[str]:
    """A one-line message for a known fairseq failure, or None (keep the traceback)."""
    if not isinstance(exc, Exception):
        return None
    frames = list(_frames(exc.__traceback__))
    for frame in frames:
        if (frame.f_code.co_name == "load_checkpoint_to_cpu"
                and frame.f_globals.get("__name__") == "fairseq.checkpoint_utils"):
            path = frame.f_locals.get("path")
            if isinstance(path, str) and os.path.isfile(path):
                problem = checkpoint_problem(path)
                if problem is not None:
                    return damaged_checkpoint_message(path, problem, resuming=False)
            return None
    for frame in frames:
        module = frame.f_globals.get("__name__", "")
        if frame.f_code.co_name in ("setup_task", "load_dataset") and module.startswith("fairseq.tasks"):
            cfg = frame.f_locals.get("cfg") or frame.f_locals.get("args")
            if cfg is None:
                task = frame.f_locals.get("self")
                cfg = getattr(task, "cfg", None)
            data = getattr(cfg, "data", None)
            missing = isinstance(exc, OSError) and (exc.filename is not None or "not found" in str(exc))
            if missing or "Could not infer language pair" in str(exc):
                return (
                    f"{PREFIX} the data directory {data!r} is not usable: {exc}. fairseq expects "
                    "the output of fairseq-preprocess there: dict.SRC.txt, dict.TGT.txt and "
                    "SPLIT.SRC-TGT.{SRC,TGT}.{bin,idx} (pass --source-lang/--target-lang if "
                    "it holds more than one pair)"
                )
            return None
    return None


_previous_hook = None


def _excepthook(exc_type, exc, tb):
    try:
        message = explain(exc)
    except Exception:  # noqa: BLE001 - never hide the original error behind our own
        message = None
    if message is None or os.environ.get("NORMPLUG_TRACEBACK"):
        (_previous_hook or sys.__excepthook__)(exc_type, exc, tb)
    if message is not None:
        print(message + " (NORMPLUG_TRACEBACK=1 shows the traceback)", file=sys.stderr, flush=True)


def install_excepthook() -> None:
    """Route uncaught exceptions through :func:`explain` (idempotent)."""
    global _previous_hook
    if sys.excepthook is not _excepthook:
        _previous_hook = sys.excepthook
        sys.excepthook = _excepthook
