"""What the training benchmarks (train_throughput.py, gpu_check.py) train, by family: every
normplug architecture with the stock fairseq model it is compared with, the flags its task
and loss take, and the synthetic data it trains on.

* ``translation``: ``transformer_iwslt_de_en_<kind>[_prenorm]`` (and ``transformer_wmt_en_de_*``
  on request) against fairseq's ``transformer_iwslt_de_en`` (``transformer_wmt_en_de``) of the
  same Post/Pre-Norm; label-smoothed cross entropy on the synthetic parallel corpus
  (scripts/synthetic.py).
* ``lm``: ``transformer_lm_ptb_<kind>`` and ``transformer_lm_wt103_<kind>`` against fairseq's
  own ``TransformerLanguageModel`` built from the flags that the plugin's ``_ln`` architecture
  of that shape sets: the same layers, dimensions, heads, dropouts, adaptive input and softmax,
  and Post-Norm (fairseq's ``transformer_lm`` architecture would force Pre-Norm).
  ``--task language_modeling`` on the target side of the synthetic corpus, binarized with
  ``fairseq-preprocess --only-source``, in the reference's segments (PTB 32 tokens, full
  softmax, cross entropy; WikiText-103 80 tokens, adaptive loss with its cutoffs
  20k/40k/200k of 267,735 types scaled to the synthetic vocabulary of about 3,000).
"""
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple, Optional

import normplug
from normplug.tools.common import fairseq_exe

REPO = Path(__file__).resolve().parents[1]
PLUGIN_DIR = Path(normplug.__file__).resolve().parent  # --user-dir: the normplug this python imports

FAMILIES = ("translation", "lm")
PRENORM = ["--encoder-normalize-before", "--decoder-normalize-before"]
# shape -> (tokens per segment, fairseq's loss)
LM_SHAPES = {"transformer_lm_ptb": (32, "cross_entropy"), "transformer_lm_wt103": (80, "adaptive_loss")}
WT103_CUTOFFS, WT103_TYPES = (20000, 40000, 200000), 267735


class Run(NamedTuple):
    arch: str
    flags: list  # the task's and the shape's flags
    criterion: str  # fairseq's loss; the plugin's "<criterion>_rbn" adds the RBN penalty to it
    baseline: str  # label of the stock row this one is compared with (a stock row's own label)
    stock_model: Optional[str] = None  # build this fairseq model from the flags ``arch`` sets


def run_quietly(cmd):
    """Run ``cmd``; its output is shown only if it fails (it would bury the benchmark's table)."""
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode:
        raise SystemExit(f"{Path(cmd[1] if cmd[0] == sys.executable else cmd[0]).name} failed "
                         f"(exit {done.returncode}):\n{done.stdout[-3000:]}")


def corpus(family, workdir: Path, lines: int) -> Path:
    """The family's binarized synthetic data in workdir, ``lines`` training sentences (pairs)."""
    raw, bin_dir = workdir / "raw", workdir / "bin"
    binarize = ["--binarize", str(bin_dir)] if family == "translation" else []
    run_quietly([sys.executable, str(REPO / "scripts" / "synthetic.py"), "--out", str(raw), "--seed", "7",
                 "--train", str(lines), "--valid", "50", "--test", "50", *binarize])
    if family == "translation":
        return bin_dir
    dest = workdir / "lm-bin"
    run_quietly([fairseq_exe("fairseq-preprocess"), "--only-source", "--trainpref", str(raw / "train.tgt"),
                    "--validpref", str(raw / "valid.tgt"), "--testpref", str(raw / "test.tgt"),
                    "--destdir", str(dest), "--workers", "1"])
    return dest


def runs(family, data: Path, kinds=None, wmt=False):
    """label -> :class:`Run`, each stock row first and then the plugin's rows it is the baseline
    of; ``kinds``: the architectures' kinds (default: all)."""
    from normplug.models.architectures import KINDS

    kinds = KINDS if kinds is None else kinds
    out = {}
    if family == "translation":
        flags = ["--share-all-embeddings", "--label-smoothing", "0.1"]
        for shape in ["transformer_iwslt_de_en"] + (["transformer_wmt_en_de"] if wmt else []):
            for suffix, stock in (("", f"{shape} (stock)"), ("_prenorm", f"{shape} (stock, prenorm)")):
                out[stock] = Run(shape, flags + (PRENORM if suffix else []), "label_smoothed_cross_entropy", stock)
                for kind in kinds:
                    out[f"{shape}_{kind}{suffix}"] = Run(
                        f"{shape}_{kind}{suffix}", flags, "label_smoothed_cross_entropy", stock)
        return out
    from fairseq.data import Dictionary

    types = len(Dictionary.load(str(data / "dict.txt")))
    cutoffs = ",".join(str(round(c * types / WT103_TYPES)) for c in WT103_CUTOFFS)
    for shape, (segment, criterion) in LM_SHAPES.items():
        flags = ["--task", "language_modeling", "--tokens-per-sample", str(segment)]
        if criterion == "adaptive_loss":  # which refuses torch's DistributedDataParallel, even unused
            flags += ["--adaptive-input-cutoff", cutoffs, "--adaptive-softmax-cutoff", cutoffs,
                      "--ddp-backend", "legacy_ddp"]
        stock = f"{shape} (stock transformer_lm)"
        out[stock] = Run(f"{shape}_ln", flags, criterion, stock, stock_model="transformer_lm")
        for kind in kinds:
            out[f"{shape}_{kind}"] = Run(f"{shape}_{kind}", flags, criterion, stock)
    return out


def parse(run: Run, data: Path, flags):
    """fairseq's training Namespace of ``run`` with further ``flags``."""
    from fairseq import options

    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(data), "--user-dir", str(PLUGIN_DIR), "--arch", run.arch, *run.flags, *flags])
    if run.stock_model:  # the arguments are complete (the architecture has run): fairseq builds from them
        args.arch = run.stock_model
    return args
