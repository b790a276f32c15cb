"""Shared logic of the analysis tools ``normplug-tid`` and ``normplug-average``.

* loading fairseq checkpoints of normplug models, with one-line errors
  (:class:`ToolError`) for the things a user gets wrong;
* iterating a split of the checkpoint's task;
* measuring the training–inference discrepancy (TID, SPEC §2) of every
  batch-statistics norm on held-out batches;
* averaging checkpoints and re-estimating population statistics.

Everything talks to the norms through :class:`normplug.norms.BatchStatNorm`'s
public interface (``batch_statistics``, ``population_statistics``) and their
ordinary training-mode forward; see :func:`reestimate_population_statistics`
for the one place that has to know more.
"""
import math
import os
import re
import tempfile
from contextlib import contextmanager
from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence

import torch
import torch.nn as nn

from .norms import BatchStatNorm
from .norms.base import measure_discrepancy


class ToolError(Exception):
    """A user-facing error: the tools print ``prog: error: <message>`` and exit 2."""


def first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


# --- checkpoints --------------------------------------------------------------

class CheckpointInfo(NamedTuple):
    path: str
    epoch: Optional[int]  # the epoch during which the checkpoint was written
    num_updates: Optional[int]


def checkpoint_info(path: str, state: dict) -> CheckpointInfo:
    """Epoch and update count recorded by ``fairseq-train`` in a checkpoint.

    ``num_updates`` comes from the last ``optimizer_history`` entry. The epoch
    comes from ``extra_state['train_iterator']``: fairseq stores the *next*
    epoch with ``iterations_in_epoch == 0`` when a checkpoint closes an epoch,
    and the current one otherwise; both are turned into the epoch the
    checkpoint was written in (``checkpoint3.pt`` -> 3).
    """
    num_updates = None
    history = state.get("optimizer_history") or []
    if history and isinstance(history[-1], dict) and history[-1].get("num_updates") is not None:
        num_updates = int(history[-1]["num_updates"])
    epoch = None
    itr = (state.get("extra_state") or {}).get("train_iterator") or {}
    if itr.get("epoch") is not None:
        epoch = int(itr["epoch"])
        if int(itr.get("iterations_in_epoch", 0) or 0) == 0:
            epoch -= 1
    return CheckpointInfo(path, epoch, num_updates)


def raw_load(path: str) -> dict:
    """``torch.load`` of a checkpoint (weights-only, normplug's allow-list), as stored."""
    if not os.path.exists(path):
        raise ToolError(f"checkpoint not found: {path}")
    if not os.path.isfile(path):
        raise ToolError(f"checkpoint is not a file: {path}")
    try:
        with open(path, "rb") as f:
            state = torch.load(f, map_location="cpu")
    except Exception as err:  # truncated zip, pickle garbage, wrong file type...
        raise ToolError(f"cannot read checkpoint {path}: {_load_error(err)}") from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise ToolError(f"{path} is not a fairseq checkpoint (no 'model' state dict)")
    if state.get("args") is None and state.get("cfg") is None:
        raise ToolError(f"{path} is not a fairseq checkpoint (neither 'args' nor 'cfg')")
    return state


def _load_error(err: BaseException) -> str:
    """What a failed ``torch.load`` means, in one line."""
    text = str(err)
    if "WeightsUnpickler error:" in text:
        detail = text.split("WeightsUnpickler error:", 1)[1].split("Check the documentation")[0]
        detail = " ".join(detail.split())
        if detail.startswith("Unsupported global"):
            return (f"it pickles an object that weights-only loading refuses ({detail}); "
                    "only trusted checkpoints of fairseq/normplug are supported")
        return f"truncated, corrupt or not a torch checkpoint ({detail})"
    return f"truncated, corrupt or not a torch checkpoint ({first_line(err)})"


def _checkpoint_data_dir(state: dict) -> Optional[str]:
    if state.get("cfg") is not None:
        task = state["cfg"].get("task") or {}
        return task.get("data")
    return getattr(state.get("args"), "data", None)


def load_model(path: str, data: Optional[str] = None, state: Optional[dict] = None):
    """Build the model of a checkpoint with its task; returns (model, task, info).

    ``data`` overrides the data directory recorded in the checkpoint. The
    model is in eval mode on the CPU.
    """
    from fairseq import checkpoint_utils

    raw = raw_load(path) if state is None else state
    info = checkpoint_info(path, raw)
    data_dir = data if data is not None else _checkpoint_data_dir(raw)
    if not data_dir:
        raise ToolError(f"{path} records no data directory; pass --data DIR")
    for one in str(data_dir).split(os.pathsep):
        if not os.path.isdir(one):
            where = "" if data is not None else f" (recorded in {path}; pass --data DIR)"
            raise ToolError(f"data directory not found: {one}{where}")
    overrides = {"data": str(data_dir)}
    try:
        # load again through fairseq: it upgrades old state dicts and applies
        # the override to args/cfg alike
        upgraded = checkpoint_utils.load_checkpoint_to_cpu(path, overrides)
    except Exception as err:
        raise ToolError(f"cannot read checkpoint {path}: {first_line(err)}") from None
    try:
        models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task(
            [path], arg_overrides=overrides, state=upgraded
        )
    except SystemExit as err:  # normplug's own one-line configuration errors
        raise ToolError(f"cannot build the model of {path}: {err}") from None
    except FileNotFoundError as err:
        raise ToolError(f"cannot set up the task of {path} on {data_dir}: {first_line(err)}") from None
    except Exception as err:
        raise ToolError(f"cannot load the model of {path}: {first_line(err)}") from None
    model = models[0]
    model.eval()
    return model, task, info


def batch_stat_norms(model: nn.Module) -> Dict[str, BatchStatNorm]:
    """Batch-statistics norms by short site name (``enc0.attn``), in module order."""
    get = getattr(model, "batch_stat_norms", None)
    if get is not None:
        return dict(get())
    return {name: m for name, m in model.named_modules() if isinstance(m, BatchStatNorm)}


_EPOCH_RE = re.compile(r"^checkpoint(\d+)\.pt$")
_UPDATE_RE = re.compile(r"^checkpoint_(\d+)_(\d+)\.pt$")


def numbered_checkpoints(folder: str, kind: str = "any") -> List[str]:
    """``checkpointN.pt`` (kind 'epoch') / ``checkpoint_E_U.pt`` (kind 'update')
    files of a save dir, oldest first (``checkpoint_last``/``_best`` excluded)."""
    found = []
    for name in os.listdir(folder):
        m = _EPOCH_RE.match(name)
        if m and kind in ("any", "epoch"):
            found.append(((int(m.group(1)), math.inf), name))
        m = _UPDATE_RE.match(name)
        if m and kind in ("any", "update"):
            found.append(((int(m.group(1)), int(m.group(2))), name))
    if kind == "update":  # by update number alone
        found = [((k[1],), n) for k, n in found]
    return [os.path.join(folder, n) for _, n in sorted(found)]


# --- data ---------------------------------------------------------------------

def iterate_batches(task, model, split: str, max_tokens: Optional[int] = 4096,
                    max_sentences: Optional[int] = None, max_batches: Optional[int] = None,
                    seed: int = 1, shuffle: bool = True) -> Iterator[dict]:
    """Batches of ``split`` as fairseq builds them (length-bucketed).

    With ``shuffle`` the order of the batches is a fixed (``seed``) random one,
    so that ``max_batches`` takes a sample of all lengths rather than the
    shortest sentences only.
    """
    from fairseq import utils

    try:
        task.load_dataset(split, epoch=1, combine=False)
    except FileNotFoundError as err:
        raise ToolError(f"split {split!r} not found: {first_line(err)}") from None
    except Exception as err:
        raise ToolError(f"cannot load split {split!r}: {first_line(err)}") from None
    dataset = task.dataset(split)
    itr = task.get_batch_iterator(
        dataset=dataset,
        max_tokens=max_tokens,
        max_sentences=max_sentences,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=True,
        required_batch_size_multiple=1,
        seed=seed,
        num_workers=0,
        epoch=1,
        disable_iterator_cache=True,
    ).next_epoch_itr(shuffle=shuffle)
    done = 0
    for sample in itr:
        if max_batches is not None and done >= max_batches:
            break
        if not sample or "net_input" not in sample:
            continue
        done += 1
        yield sample


def _to(sample, device):
    if isinstance(sample, torch.Tensor):
        return sample.to(device)
    if isinstance(sample, dict):
        return {k: _to(v, device) for k, v in sample.items()}
    if isinstance(sample, (list, tuple)):
        return type(sample)(_to(v, device) for v in sample)
    return sample


def forward(model, sample, device):
    """One teacher-forced forward of ``model`` on ``sample``."""
    net_input = _to(sample["net_input"], device)
    return model(**net_input)


# --- TID ----------------------------------------------------------------------

def _norm_call(args, kwargs):
    """(x, pad_mask) of a norm call ``norm(x, pad_mask)`` in any spelling."""
    x = args[0] if args else kwargs["x"]
    pad_mask = args[1] if len(args) > 1 else kwargs.get("pad_mask")
    return x, pad_mask


def real_tokens(x: torch.Tensor, pad_mask: Optional[torch.Tensor]) -> int:
    """Number of real tokens of a T×B×C input with a B×T padding mask."""
    if pad_mask is None:
        return x.shape[0] * x.shape[1]
    return int((~pad_mask.to(torch.bool)).sum())


class BatchTID(NamedTuple):
    tid_mean: Optional[torch.Tensor]  # None for norms without a mean (PowerNorm)
    tid_var: torch.Tensor
    tokens: int


def batch_tid(norm: BatchStatNorm, x: torch.Tensor, pad_mask: Optional[torch.Tensor]) -> Optional[BatchTID]:
    """TID of one norm on one batch: the batch statistics of ``x`` (as the norm
    computes them in training) against the norm's population statistics.

    Returns None for a batch with fewer than 2 real tokens, whose variance is 0.
    """
    n = real_tokens(x, pad_mask)
    if n < 2:
        return None
    with torch.no_grad():
        try:
            b_mean, b_var = norm.batch_statistics(x, pad_mask)
            p_mean, p_var = norm.population_statistics()
        except NotImplementedError:
            raise ToolError(
                f"norm {getattr(norm, 'norm_name', type(norm).__name__)!r} does not implement "
                "batch_statistics()/population_statistics(): its TID cannot be measured"
            ) from None
        d = measure_discrepancy(b_mean, b_var, p_mean, p_var)
    return BatchTID(None if b_mean is None else d.tid_mean.double(), d.tid_var.double(), n)


class LayerTID(NamedTuple):
    layer: str
    norm: str
    tid_mean: Optional[float]  # None where the norm has no mean statistic
    tid_var: float
    batches: int
    tokens: int


class TIDMeter:
    """Forward pre-hooks on batch-statistics norms that accumulate their TID.

    Averaging over batches is **token-weighted**: a layer's figure is
    Σ_b n_b · TID_b / Σ_b n_b with n_b its real tokens in batch b (source
    tokens for encoder sites, target tokens for decoder sites). With
    ``--max-tokens`` batching the batches are nearly equal and this is close
    to the plain mean; the difference is that a small trailing batch, whose
    statistics are noisier and whose TID is larger, weighs by its size.
    """

    def __init__(self, norms: Dict[str, BatchStatNorm]):
        self.norms = norms
        self._sums = {k: [None, None, 0, 0] for k in norms}  # Σ n·mean, Σ n·var, batches, tokens
        self._handles = []

    def _hook(self, name):
        def hook(module, args, kwargs):
            x, pad_mask = _norm_call(args, kwargs)
            t = batch_tid(module, x, pad_mask)
            if t is None:
                return None
            acc = self._sums[name]
            if t.tid_mean is not None:
                acc[0] = t.tid_mean * t.tokens + (0 if acc[0] is None else acc[0])
            acc[1] = t.tid_var * t.tokens + (0 if acc[1] is None else acc[1])
            acc[2] += 1
            acc[3] += t.tokens
            return None

        return hook

    def __enter__(self):
        for name, module in self.norms.items():
            self._handles.append(module.register_forward_pre_hook(self._hook(name), with_kwargs=True))
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = []
        return False

    def results(self) -> List[LayerTID]:
        out = []
        for name, module in self.norms.items():
            s_mean, s_var, batches, tokens = self._sums[name]
            if tokens == 0:
                out.append(LayerTID(name, getattr(module, "norm_name", type(module).__name__),
                                    None, math.nan, 0, 0))
                continue
            out.append(LayerTID(
                name,
                getattr(module, "norm_name", type(module).__name__),
                None if s_mean is None else float(s_mean) / tokens,
                float(s_var) / tokens,
                batches,
                tokens,
            ))
        return out


def measure_tid(model, task, split="valid", max_tokens=4096, max_sentences=None,
                max_batches=None, seed=1, device="cpu") -> List[LayerTID]:
    """Per-layer TID of ``model`` (in eval mode: every layer normalises with its
    population statistics, as at inference) over batches of ``split``."""
    norms = batch_stat_norms(model)
    model.eval()
    with TIDMeter(norms) as meter, torch.no_grad():
        for sample in iterate_batches(task, model, split, max_tokens, max_sentences,
                                      max_batches, seed=seed):
            forward(model, sample, device)
    return meter.results()


# --- averaging ----------------------------------------------------------------

def average_model_states(states: Sequence[Dict[str, torch.Tensor]], names: Sequence[str] = ()
                         ) -> Dict[str, torch.Tensor]:
    """Element-wise mean of model state dicts (parameters and buffers).

    Floating-point tensors are summed in float64 and cast back to their dtype.
    Integer and boolean tensors (counters such as PowerNorm's ``num_updates``)
    have no meaningful mean: they are taken from ``states[0]``, the newest.
    """
    names = list(names) or [f"#{i}" for i in range(len(states))]
    first = states[0]
    for name, sd in zip(names[1:], states[1:]):
        if set(sd) != set(first):
            diff = sorted(set(sd) ^ set(first))
            raise ToolError(f"checkpoints {names[0]} and {name} have different parameters "
                            f"(e.g. {diff[0]!r}); they cannot be averaged")
        for k, v in sd.items():
            if tuple(v.shape) != tuple(first[k].shape):
                raise ToolError(f"{k!r} has shape {tuple(v.shape)} in {name} but "
                                f"{tuple(first[k].shape)} in {names[0]}")
    out = {}
    for k, v in first.items():
        if not isinstance(v, torch.Tensor) or not v.is_floating_point():
            out[k] = v.clone() if isinstance(v, torch.Tensor) else v
            continue
        acc = torch.zeros(v.shape, dtype=torch.float64)
        for sd in states:
            acc += sd[k].to(torch.float64)
        out[k] = (acc / len(states)).to(v.dtype)
    return out


@contextmanager
def _frozen_except_norms(model: nn.Module, norms: Sequence[nn.Module]):
    """Model in eval mode (no dropout anywhere), the given norms in train mode;
    every mode is restored on exit."""
    modes = {m: m.training for m in model.modules()}
    try:
        model.eval()
        for m in norms:
            m.train()
        yield
    finally:
        for m, mode in modes.items():
            m.training = mode


def _buffers(module: nn.Module) -> Dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.named_buffers(recurse=False)}


class _Reestimator:
    """Turns a norm's own training-time update into an exact cumulative mean.

    * ``batch`` (MaskedBatchNorm): its update is the EMA
      ``r ← (1 − ρ) r + ρ s`` with ρ = ``module.momentum``. Setting ρ = 1/t on
      the t-th batch gives ``r_t = mean(s_1..s_t)`` exactly (t = 1 overwrites
      whatever was there, so no reset is needed).
    * ``power`` (PowerNorm): during warm-up its ψ² update already is the
      cumulative mean over the warm-up forwards, counted in
      ``warmup_steps``. Re-estimation sets the update count to 0 (through the
      fairseq hook ``set_num_updates``) and ``warmup_steps`` to 0, runs the
      batches, then puts both back. ν (the backward statistic) is untouched:
      no backward runs.

    Every buffer other than the population statistics is restored afterwards.
    """

    def __init__(self, module: BatchStatNorm):
        self.module = module
        self.kind = getattr(module, "norm_name", None)
        self.saved = _buffers(module)
        self.saved_momentum = getattr(module, "momentum", None)
        self.steps = 0
        self.expected = [None, None]  # Σ over batches of batch_statistics()
        if self.kind == "power":
            if not (hasattr(module, "set_num_updates") and hasattr(module, "warmup_steps")):
                raise ToolError("this PowerNorm has no warm-up counter to re-estimate ψ² with")
            self.stat_buffers = ("running_psi2",)
            if getattr(module, "warmup_updates", 1) <= 0:
                # num_updates < 0 is never true then; no cumulative phase exists
                raise ToolError("cannot re-estimate ψ² of a PowerNorm with warmup_updates=0")
            module.set_num_updates(0)
            module.warmup_steps.zero_()
        elif hasattr(module, "momentum"):
            self.stat_buffers = tuple(k for k in ("running_mean", "running_var") if k in self.saved)
            if not self.stat_buffers:
                raise ToolError(f"{type(module).__name__}: no running_mean/running_var buffers")
        else:
            raise ToolError(
                f"do not know how to re-estimate the statistics of {type(module).__name__} "
                f"(norm {self.kind!r})"
            )

    def before_batch(self, x, pad_mask):
        if real_tokens(x, pad_mask) == 0:
            return  # the norm does not update on an empty batch
        self.steps += 1
        if self.kind != "power":
            self.module.momentum = 1.0 / self.steps
        # The target, through the public accessor, to check the result against.
        try:
            stats = self.module.batch_statistics(x, pad_mask)
        except NotImplementedError:
            self.expected = None
            return
        if self.expected is not None:
            for i, s in enumerate(stats):
                if s is not None:
                    s = s.detach().double()
                    self.expected[i] = s if self.expected[i] is None else self.expected[i] + s

    def check(self, name):
        """The new population statistics must be the mean of the batch statistics
        (as ``batch_statistics`` reports them); anything else means the norm's
        update does not follow the assumed rule."""
        if self.expected is None or self.steps == 0:
            return
        got = self.module.population_statistics()
        for what, want, have in zip(("mean", "variance"), self.expected, got):
            if want is None or have is None:
                continue
            want = want / self.steps
            if not torch.allclose(have.detach().double(), want, rtol=1e-3, atol=1e-5):
                err = (have.detach().double() - want).abs().max().item()
                raise ToolError(
                    f"re-estimation of {name} ({self.kind}) did not give the mean of its batch "
                    f"{what}s (max error {err:.3g}): the norm's running update is not the "
                    "rule this tool relies on"
                )

    def finish(self):
        m = self.module
        if self.kind != "power":
            m.momentum = self.saved_momentum
        current = dict(m.named_buffers(recurse=False))
        for k, v in self.saved.items():
            if k not in self.stat_buffers:
                current[k].copy_(v)
        if self.kind == "power":
            # set_num_updates keeps the module's own copy in step with fairseq's
            m.set_num_updates(int(self.saved["num_updates"]))
        if self.steps == 0:  # nothing seen: keep the old statistics
            for k in self.stat_buffers:
                current[k].copy_(self.saved[k])
        m.discrepancy()  # drop the terms of the last forward (public, clears them)


def reestimate_population_statistics(model, batches, device="cpu") -> Dict[str, int]:
    """Recompute the population statistics of every batch-statistics norm as the
    exact mean of its batch statistics over ``batches``.

    The model runs in eval mode (dropout off) except the norms, which run in
    train mode so that each normalises with, and is updated by, its batch
    statistics (the "precise BN" procedure); under no_grad, so no parameter
    and no backward statistic changes. Each layer's result is checked against
    the mean of what its public ``batch_statistics`` reports for the same
    inputs. Returns the number of batches seen by each norm.
    """
    norms = batch_stat_norms(model)
    if not norms:
        raise ToolError("the model has no BN/PN layer: nothing to re-estimate")
    params = {k: p.detach().clone() for k, p in model.named_parameters()}
    reest = {}
    handles = []
    try:
        for name, m in norms.items():
            reest[name] = _Reestimator(m)

            def hook(module, args, kwargs, r=reest[name]):
                r.before_batch(*_norm_call(args, kwargs))

            handles.append(m.register_forward_pre_hook(hook, with_kwargs=True))
        with _frozen_except_norms(model, list(norms.values())), torch.no_grad():
            for sample in batches:
                forward(model, sample, device)
        for name, r in reest.items():
            r.check(name)
    finally:
        for h in handles:
            h.remove()
        for r in reest.values():
            r.finish()
    for k, p in model.named_parameters():  # guaranteed by no_grad; checked anyway
        if not torch.equal(p.detach(), params[k]):
            raise RuntimeError(f"parameter {k} changed during re-estimation")
    return {name: r.steps for name, r in reest.items()}


def norm_buffer_keys(model) -> List[str]:
    """State-dict keys of the buffers of every batch-statistics norm."""
    keys = []
    for name, m in model.named_modules():
        if isinstance(m, BatchStatNorm):
            keys += [f"{name}.{b}" for b, _ in m.named_buffers(recurse=False)]
    return keys


# --- files --------------------------------------------------------------------

@contextmanager
def atomic_path(path: str):
    """Yield a temporary path next to ``path``; rename it to ``path`` on success,
    delete it on any error, so ``path`` is never left half-written."""
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
