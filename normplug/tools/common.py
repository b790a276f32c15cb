"""What ``normplug-tid``, ``normplug-average`` and the recipe driver share: finding fairseq, reading
checkpoints and data splits, one-line errors, and outputs that are never left half-written."""
import argparse
import importlib.metadata
import itertools
import logging
import math
import os
import re
import shlex
import shutil
import sys
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List, NamedTuple, Optional

import torch

from ..errors import NormplugError


class ToolError(NormplugError):
    """A user-facing error: the tools print ``prog: error: <message>`` and exit 2."""


# fairseq itself, installed after normplug's fairseq extra (its runtime dependencies) without its own: both
# builds declare torchaudio, which pulls a second torch (README, "Using it from your own environment")
FAIRSEQ = "fairseq-fixed==0.12.3.1" if sys.version_info >= (3, 11) else "fairseq==0.12.2"
INSTALL_FAIRSEQ = f"pip install --no-deps --no-build-isolation {FAIRSEQ}"
README_ROUTE = "README: Using it from your own environment"


def unmet_requirements(extra: str = "fairseq") -> List[str]:
    """What the installed normplug declares (with ``extra``) for this Python that is missing or at a
    version outside its range, as pip requirements."""
    from packaging.requirements import Requirement
    unmet = []
    for text in importlib.metadata.requires("normplug") or []:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        try:
            met = req.specifier.contains(importlib.metadata.version(req.name), prereleases=True)
        except importlib.metadata.PackageNotFoundError:
            met = False
        if not met:
            unmet.append(f"{req.name}{req.specifier}")
    return unmet


def install_fairseq_hint() -> str:
    """The command that installs what fairseq lacks here (its dependencies that are missing, then fairseq
    if it is missing), or "" where nothing is; never a command whose work is already done."""
    try:
        unmet = unmet_requirements()
    except importlib.metadata.PackageNotFoundError:  # normplug imported from a checkout, not installed
        return f'install them: pip install -e ".[fairseq]" in the normplug checkout, then {INSTALL_FAIRSEQ} ' \
               f"({README_ROUTE})"
    steps = [f"pip install {' '.join(shlex.quote(r) for r in unmet)}"] if unmet else []
    if not any(_installed(name) for name in ("fairseq", "fairseq-fixed")):
        steps.append(INSTALL_FAIRSEQ)
    return f"install {'them' if unmet else 'it'}: {' && '.join(steps)} ({README_ROUTE})" if steps else ""


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def need_fairseq(what: str):
    """Refuse in one line, naming the module that failed and the command that installs it, where
    fairseq does not import."""
    try:
        import fairseq  # noqa: F401
    except ImportError as err:
        hint = install_fairseq_hint() or ("fairseq and every package normplug declares for it are installed: "
                                          "`python -c 'import fairseq'` shows the whole error")
        raise ToolError(f"{what} needs fairseq, which does not import ({first_line(err)}); {hint}") from None


def fairseq_exe(tool: str) -> str:
    """``fairseq-train`` etc. next to the running interpreter, else from PATH."""
    here = Path(sys.executable).parent / tool
    found = str(here) if here.exists() else shutil.which(tool)
    if not found:
        hint = install_fairseq_hint() or "fairseq is installed: put the folder of its console scripts on PATH"
        raise ToolError(f"{tool} is neither next to {sys.executable} nor on PATH; {hint}")
    return found


def first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def configure_logging(verbose: bool):
    """Only warnings and errors unless -v (importing fairseq sets the root logger to DEBUG)."""
    logging.basicConfig(force=True, level=logging.INFO if verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s")
    if not verbose:
        warnings.filterwarnings("ignore")


def positive(text: str) -> int:
    """argparse's type of a count: a whole number over 0."""
    if not text.isdigit() or int(text) == 0:
        raise argparse.ArgumentTypeError(f"must be a whole number over 0, got {text!r}")
    return int(text)


def add_data_args(group, split: str, purpose: str):
    """The data and batching options both tools read a split with."""
    group.add_argument("--data", metavar="DIR", help="binarized data directory (default: the checkpoint's)")
    group.add_argument("--split", default=split, help=f"data split to {purpose} (default: {split})")
    group.add_argument("--max-tokens", type=positive, default=4096,
                       help="tokens per batch; use the training batch size (default: 4096)")
    group.add_argument("--max-batches", type=positive, help="at most K random batches of the split (default: all)")
    group.add_argument("--seed", type=int, default=1, help="which random batches, in which order (default: 1)")
    group.add_argument("--cpu", action="store_true", help="run on the CPU even if a GPU is available")


@contextmanager
def atomic_path(path: str):
    """A temporary path next to ``path``, renamed to it on success and deleted on any error."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ToolError(f"output directory not found: {folder}")
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the output normal permissions
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# epoch: the epoch during which the checkpoint was written
CheckpointInfo = NamedTuple("CheckpointInfo", [("path", str), ("epoch", Optional[int]),
                                               ("num_updates", Optional[int])])


def checkpoint_info(path: str, state: dict) -> CheckpointInfo:
    """Epoch and update count; fairseq stores the *next* epoch when a checkpoint closes one."""
    history = state.get("optimizer_history") or []
    num_updates = history[-1].get("num_updates") if history and isinstance(history[-1], dict) else None
    itr = (state.get("extra_state") or {}).get("train_iterator") or {}
    epoch = itr.get("epoch")
    if epoch is not None and not itr.get("iterations_in_epoch"):
        epoch -= 1
    return CheckpointInfo(path, epoch, num_updates)


def raw_load(path: str) -> dict:
    """A checkpoint as stored (weights-only, normplug's allow-list), checked to be fairseq's."""
    if not os.path.isfile(path):
        raise ToolError(f"checkpoint not found: {path}")
    try:
        state = torch.load(path, map_location="cpu")
    except Exception as err:  # truncated zip, pickle garbage, wrong file type, unsafe global
        why = "it pickles an object that weights-only loading refuses" if "Unsupported global" in str(err) \
            else "truncated, corrupt or not a torch checkpoint"
        raise ToolError(f"cannot read checkpoint {path}: {why} ({first_line(err)})") from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise ToolError(f"{path} is not a fairseq checkpoint (no 'model' state dict)")
    if state.get("args") is None and state.get("cfg") is None:
        raise ToolError(f"{path} is not a fairseq checkpoint (neither 'args' nor 'cfg')")
    return state


_EPOCH = re.compile(r"^checkpoint(\d+)\.pt$")
_UPDATE = re.compile(r"^checkpoint_(\d+)_(\d+)\.pt$")


def numbered_checkpoints(folder: str, kind: str = "any") -> List[str]:
    """``checkpointE.pt`` ('epoch') and/or ``checkpoint_E_U.pt`` ('update') of a save dir, oldest
    first (an epoch's own after its updates')."""
    found = []
    for name in os.listdir(folder):
        epoch, update = _EPOCH.match(name), _UPDATE.match(name)
        if epoch and kind in ("any", "epoch"):
            found.append(((int(epoch.group(1)), math.inf), name))
        if update and kind in ("any", "update"):
            found.append(((int(update.group(1)), int(update.group(2))), name))
    return [os.path.join(folder, name) for _, name in sorted(found)]


def load_model(path: str, data: Optional[str] = None):
    """(model in eval mode on the CPU, task, info); ``data`` overrides the recorded data directory."""
    from fairseq import checkpoint_utils
    state = raw_load(path)
    info = checkpoint_info(path, state)
    cfg = state.get("cfg")
    data_dir = data or (cfg["task"].get("data") if cfg is not None else getattr(state["args"], "data", None))
    if not data_dir:
        raise ToolError(f"{path} records no data directory; pass --data DIR")
    for one in str(data_dir).split(os.pathsep):
        if not os.path.isdir(one):
            where = "" if data else f" (recorded in {path}; pass --data DIR)"
            raise ToolError(f"data directory not found: {one}{where}")
    try:
        models, _, task = checkpoint_utils.load_model_ensemble_and_task(
            [path], arg_overrides={"data": str(data_dir)})
    except NormplugError as err:  # normplug's own configuration errors, already one line
        raise ToolError(f"cannot build the model of {path}: {err}") from None
    except Exception as err:
        raise ToolError(f"cannot load the model of {path} with data {data_dir}: {first_line(err)}") from None
    return models[0].eval(), task, info


def iterate_batches(task, model, split: str, max_tokens: int = 4096, max_batches: Optional[int] = None,
                    seed: int = 1) -> Iterator[dict]:
    """fairseq's length-bucketed batches of ``split`` in a fixed random order, so that
    ``max_batches`` samples every length."""
    from fairseq import utils
    try:
        task.load_dataset(split, epoch=1, combine=False)
    except Exception as err:
        raise ToolError(f"cannot load split {split!r}: {first_line(err)}") from None
    itr = task.get_batch_iterator(
        dataset=task.dataset(split), max_tokens=max_tokens,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=True, required_batch_size_multiple=1, seed=seed, num_workers=0,
        epoch=1, disable_iterator_cache=True,
    ).next_epoch_itr(shuffle=True)
    yield from itertools.islice((sample for sample in itr if sample and "net_input" in sample), max_batches)


def run_model(model, sample, device):
    """One teacher-forced forward of ``model`` on ``sample``."""
    return model(**{k: v.to(device) if torch.is_tensor(v) else v for k, v in sample["net_input"].items()})


def hook_norm_inputs(norms, record):
    """Forward pre-hooks calling ``record(name, module, x, pad_mask)``; returns their handles."""
    def hook(name):
        def pre_hook(module, args, kwargs):
            record(name, module, args[0] if args else kwargs["x"],
                   args[1] if len(args) > 1 else kwargs.get("pad_mask"))
        return pre_hook
    return [m.register_forward_pre_hook(hook(name), with_kwargs=True) for name, m in norms.items()]


def device_for(args) -> str:
    return "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"


def run_tool(prog: str, body):
    """Run ``body()``; a bad input or option (NormplugError) or ^C ends it as argparse does:
    ``prog: error: message`` on stderr, exit status 2."""
    try:
        return body()
    except NormplugError as err:
        message = str(err)
    except KeyboardInterrupt:
        message = "interrupted"
    print(f"{prog}: error: {message}", file=sys.stderr)
    sys.exit(2)
