"""Which norm sits at which Transformer site, with which options (SPEC §3).

A :class:`NormPlan` is made once from fairseq's argument namespace and builds
every site's norm through the registry; the model never looks inside a norm.
"""
import argparse
from dataclasses import dataclass, field
from typing import Dict

import torch.nn as nn

from ..norms import NormConfigError, create_norm, norm_names, norm_options

# (stack, site) -> the command-line flag that overrides it
SITES = {
    ("encoder", "attn"): "encoder_attn_norm",
    ("encoder", "ffn"): "encoder_ffn_norm",
    ("encoder", "final"): "encoder_final_norm",
    ("decoder", "self_attn"): "decoder_self_attn_norm",
    ("decoder", "cross_attn"): "decoder_cross_attn_norm",
    ("decoder", "ffn"): "decoder_ffn_norm",
    ("decoder", "final"): "decoder_final_norm",
}

# command-line option -> the norm keyword it feeds (only norms that take it get it)
NORM_OPTION_FLAGS = {
    "norm_eps": "eps",
    "bn_momentum": "momentum",
    "bn_test_stats": "test_stats",
    "bn_sync_stats": "sync_stats",
    "adanorm_k": "k",
    "adanorm_scale": "scale",
    "detach_mode": "detach",
    "power_warmup": "warmup_updates",
    "power_alpha_fwd": "alpha_fwd",
    "power_alpha_bkw": "alpha_bkw",
    "power_groups": "groups",
}


def _positive_float(text):
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _unit_interval(text):
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def _nonnegative_int(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _positive_int(text):
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def add_norm_args(parser):
    """The plugin's model flags (no defaults here: architectures fill them)."""
    names = list(norm_names())
    # fairseq hands add_args its model group (argument_default=SUPPRESS), so an
    # unset flag stays absent and architectures can fill it.
    group = parser
    group.add_argument("--encoder-norm", choices=names, metavar="NORM",
                       help=f"norm at every encoder site; one of {', '.join(names)}")
    group.add_argument("--decoder-norm", choices=names, metavar="NORM",
                       help="norm at every decoder site")
    for (stack, site), dest in SITES.items():
        group.add_argument("--" + dest.replace("_", "-"), choices=names, metavar="NORM",
                           help=f"override the {stack} {site.replace('_', '-')} site "
                           f"(default: --{stack}-norm)")
    group.add_argument("--norm-eps", type=_positive_float,
                       help="epsilon of every plugin norm (default: each norm's own)")
    group.add_argument("--bn-momentum", type=_unit_interval,
                       help="running-statistics momentum of batch norms (default 0.05)")
    group.add_argument("--bn-test-stats", choices=["population", "batch"],
                       help="statistics of batch norms in eval (default population)")
    group.add_argument("--bn-sync-stats", action="store_true", default=None,
                       help="reduce the batch statistics of batch and power norms across "
                       "distributed workers (identical running statistics on every worker)")
    group.add_argument("--adanorm-k", type=float, help="AdaNorm k (default 0.1)")
    group.add_argument("--adanorm-scale", type=_positive_float, help="AdaNorm C (default 1.0)")
    group.add_argument("--detach-mode", choices=["mean", "std", "both"],
                       help="what DetachNorm detaches (default both)")
    group.add_argument("--power-warmup", type=_nonnegative_int,
                       help="PowerNorm warm-up in updates (default: --warmup-updates)")
    group.add_argument("--power-alpha-fwd", type=_unit_interval, help="PowerNorm forward EMA (0.9)")
    group.add_argument("--power-alpha-bkw", type=_unit_interval, help="PowerNorm backward EMA (0.9)")
    group.add_argument("--power-groups", type=_positive_int,
                       help="PowerNorm group-scaling groups (default: attention heads)")


@dataclass
class NormPlan:
    """Norm name per (stack, site) and the options given on the command line."""

    sites: Dict[tuple, str]
    options: Dict[str, object] = field(default_factory=dict)
    heads: Dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_args(cls, args) -> "NormPlan":
        sites = {}
        for (stack, site), dest in SITES.items():
            name = getattr(args, dest, None) or getattr(args, f"{stack}_norm", None) or "layer"
            if name not in set(norm_names()):
                raise NormConfigError(
                    f"--{dest.replace('_', '-')}: unknown norm {name!r}; "
                    f"valid choices: {', '.join(norm_names())}"
                )
            sites[(stack, site)] = name
        options = {
            kw: getattr(args, flag) for flag, kw in NORM_OPTION_FLAGS.items()
            if getattr(args, flag, None) is not None
        }
        if "warmup_updates" not in options and getattr(args, "warmup_updates", None):
            # SPEC §2: PowerNorm's warm-up is the learning-rate warm-up
            options["warmup_updates"] = int(args.warmup_updates)
        heads = {
            "encoder": getattr(args, "encoder_attention_heads", 1),
            "decoder": getattr(args, "decoder_attention_heads", 1),
        }
        plan = cls(sites, options, heads)
        plan.check(args)
        return plan

    def check(self, args):
        """Refuse combinations that cannot work, before anything is built."""
        for stack in ("encoder", "decoder"):
            dim = getattr(args, f"{stack}_embed_dim", None)
            if dim is None:
                continue
            for (st, site), name in self.sites.items():
                if st == stack:
                    self.build(stack, site, dim)  # builds and discards: validates options

    def build(self, stack: str, site: str, dim: int) -> nn.Module:
        name = self.sites[(stack, site)]
        accepted = norm_options(name)
        kwargs = {k: v for k, v in self.options.items() if k in accepted}
        if "groups" in accepted and "groups" not in kwargs:
            kwargs["groups"] = self.heads.get(stack, 1)
        try:
            return create_norm(name, dim, **kwargs)
        except NormConfigError as err:
            flag = SITES[(stack, site)].replace("_", "-")
            raise NormConfigError(f"{stack} {site} site (--{flag} {name}): {err}") from None
