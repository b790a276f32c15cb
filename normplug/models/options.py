"""The plugin's model options, declared once, as dataclass fields: fairseq registers the
dataclass with the model (a fairseq-hydra-train config sets ``model.bn_momentum``) and
fairseq-train's flags (``--bn-momentum``) are generated from the same fields.

Every option defaults to None, "not given": the architectures fill what they set, and each
norm its own defaults. A field's metadata holds its help, its valid choices or range (checked
when a flag is parsed, and when a model is built from a config that came through no flag),
and the norm keyword it feeds.
"""
import argparse
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Optional, get_args

from fairseq.dataclass import FairseqDataclass

from ..errors import NormplugError
from ..norms import norm_names
from ..norms.impl import IMPLS


def _option(help, choices=None, valid=None, norm_keyword=None):
    """A model option. ``choices``: a tuple, or a function giving one when asked (the norm
    registry's names, so that a norm registered after import is a choice too); ``valid``:
    (test, words) for a number."""
    return field(default=None, metadata={"help": help, "choices": choices, "valid": valid,
                                         "norm_keyword": norm_keyword})


@dataclass
class NormOptions(FairseqDataclass):
    """The options every plugin model has; :func:`options_for` adds those of its stacks and sites."""

    norm_eps: Optional[float] = _option("epsilon of every plugin norm (default: each norm's own)",
                                        valid=(lambda v: v > 0, "> 0"), norm_keyword="eps")
    bn_momentum: Optional[float] = _option("running-statistics momentum of batch norms (default 0.05)",
                                           valid=(lambda v: 0 < v <= 1, "in (0, 1]"), norm_keyword="momentum")
    bn_test_stats: Optional[str] = _option("statistics of batch norms in eval (default population)",
                                           choices=("population", "batch"), norm_keyword="test_stats")
    bn_sync_stats: Optional[bool] = _option("sum the statistics of batch and power norms over distributed "
                                            "workers", norm_keyword="sync_stats")
    adanorm_k: Optional[float] = _option("AdaNorm k (default 0.1)", valid=(lambda v: v >= 0, ">= 0"),
                                         norm_keyword="k")
    adanorm_scale: Optional[float] = _option("AdaNorm C (default 1.0)", valid=(lambda v: v > 0, "> 0"),
                                             norm_keyword="scale")
    detach_mode: Optional[str] = _option("what DetachNorm detaches (default both)",
                                         choices=("mean", "std", "both"), norm_keyword="detach")
    power_warmup: Optional[int] = _option("PowerNorm warm-up in updates (default: --warmup-updates)",
                                          valid=(lambda v: v >= 0, ">= 0"), norm_keyword="warmup_updates")
    power_final_warmup: Optional[int] = _option(
        "warm-up of a PowerNorm at a stack's final norm (default: --power-warmup; Shen et al.'s release: "
        "1000)", valid=(lambda v: v >= 0, ">= 0"))
    power_alpha_fwd: Optional[float] = _option("PowerNorm forward EMA factor (default 0.9)",
                                               valid=(lambda v: 0 <= v <= 1, "in [0, 1]"),
                                               norm_keyword="alpha_fwd")
    power_alpha_bkw: Optional[float] = _option("PowerNorm backward EMA factor (default 0.9)",
                                               valid=(lambda v: 0 <= v <= 1, "in [0, 1]"),
                                               norm_keyword="alpha_bkw")
    power_groups: Optional[int] = _option("PowerNorm group-scaling groups (default: attention heads)",
                                          valid=(lambda v: v > 0, "> 0"), norm_keyword="groups")
    attn_init: Optional[str] = _option(
        "attention projections: fairseq's Xavier init (default), or kaiming: nn.Linear's default weights "
        "(kaiming_uniform, a=sqrt(5)) with zero biases, as Xu et al.'s --init_method km",
        choices=("fairseq", "kaiming"))
    norm_impl: Optional[str] = _option("fused norms' implementation: torch code, Triton kernels, or auto "
                                       "(default): the torch code, until a norm's kernels pass the GPU check "
                                       "(benchmarks/gpu_check.sh)",
                                       choices=IMPLS, norm_keyword="impl")
    compile_norms: Optional[bool] = _option("compile every plugin norm with torch.compile (first batches of "
                                            "each shape are slower)")


def options_for(name, stack_sites):
    """The options of a model whose stacks have these norm sites ({"decoder": ("self_attn", ...)}):
    NormOptions and, per stack, ``{stack}_norm`` (every site), ``{stack}_{site}_norm`` (one site)
    and ``{stack}_ffn_init``."""
    specs = []
    for stack, sites in stack_sites.items():
        every = f"norm at every {stack} site; one of {', '.join(norm_names())}"
        specs.append((f"{stack}_norm", Optional[str], _option(every, choices=norm_names)))
        specs += [(f"{stack}_{site}_norm", Optional[str],
                   _option(f"override the {stack} {site.replace('_', '-')} site (default: --{stack}-norm)",
                           choices=norm_names)) for site in sites]
        ffn_init = (f"{stack} FFN layers: pytorch: nn.Linear's default init (fairseq 0.12's, the default); "
                    "xavier: Xavier-uniform weights and zero biases (fairseq <= 0.10's Linear)")
        specs.append((f"{stack}_ffn_init", Optional[str], _option(ffn_init, choices=("pytorch", "xavier"))))
    return make_dataclass(name, specs, bases=(NormOptions,))


# option -> the norm keyword it feeds (only norms that take it get it)
NORM_KEYWORDS = {f.name: f.metadata["norm_keyword"] for f in fields(NormOptions)
                 if f.metadata.get("norm_keyword")}


def _choices(f):
    choices = f.metadata["choices"]
    return tuple(choices() if callable(choices) else choices)


def _problem(f, value):
    """Why ``value`` is not valid for option ``f`` ("must be ..."), or None."""
    if f.metadata.get("choices") and value not in _choices(f):
        return f"must be one of {', '.join(_choices(f))}"
    valid = f.metadata.get("valid")
    if valid and not valid[0](value):
        return f"must be {valid[1]}"
    return None


def _option_fields(options):
    return [f for f in fields(options) if not f.name.startswith("_")]


def add_option_args(parser, options):
    """fairseq-train's flags for the fields of ``options``: ``--bn-momentum`` for ``bn_momentum``.
    No defaults: fairseq's model group leaves an unset flag absent, for the architectures to fill."""
    for f in _option_fields(options):
        flag, kind = "--" + f.name.replace("_", "-"), get_args(f.type)[0]  # Optional[X] -> X
        if kind is bool:
            parser.add_argument(flag, action="store_true", default=None, help=f.metadata["help"])
        elif f.metadata["choices"]:
            metavar = "NORM" if f.metadata["choices"] is norm_names else None
            parser.add_argument(flag, choices=_choices(f), metavar=metavar, help=f.metadata["help"])
        else:
            parser.add_argument(flag, type=_parser(f, kind), help=f.metadata["help"])


def _parser(f, kind):
    def parse(text):
        value = kind(text)
        problem = _problem(f, value)
        if problem:
            raise argparse.ArgumentTypeError(f"{problem}, got {text}")
        return value
    return parse


def check_options(args, options):
    """Raise NormplugError, in one line, for an option outside its choices or range: for a config
    that came through no flag (fairseq-hydra-train's), what parsing the flag would have refused."""
    for f in _option_fields(options):
        value = getattr(args, f.name, None)
        problem = None if value is None else _problem(f, value)
        if problem:
            flag = "--" + f.name.replace("_", "-")
            raise NormplugError(f"model option {f.name} ({flag}) {problem}, got {value!r}")
