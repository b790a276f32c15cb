"""Which norm sits at which Transformer site, with which options.

A :class:`NormPlan` is read from the model's configuration and builds every site's
norm through the registry; the model never looks inside a norm.
"""
import argparse
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch.nn as nn
from fairseq.models.transformer.transformer_config import TransformerConfig

from ..errors import NormplugError
from ..norms import NormConfigError, create_norm, norm_names, norm_options
from ..norms.impl import IMPLS

# Each norm site has one name: in plan keys, in flags (--{stack}-{site}-norm) and in logs
# (enc0.self_attn, dec.final). Its module keeps fairseq's attribute name, so that a stock
# checkpoint loads: fairseq calls the FFN's norm `final_layer_norm`; a stack's final
# (Pre-Norm) norm is fairseq's `layer_norm`, held here as `final_norm` (see norm_transformer.py).
SITE_ATTRIBUTES = {
    "self_attn": "self_attn_layer_norm",
    "cross_attn": "encoder_attn_layer_norm",
    "ffn": "final_layer_norm",
    "final": "final_norm",
}
STACK_SITES = {"encoder": ("self_attn", "ffn", "final"),
               "decoder": ("self_attn", "cross_attn", "ffn", "final")}
SITES = tuple((stack, site) for stack, sites in STACK_SITES.items() for site in sites)
_LOG_STACKS = {"encoder": "enc", "decoder": "dec"}


def site_flag(stack: str, site: str) -> str:
    """The flag's destination that overrides one site: ``encoder_self_attn_norm``."""
    return f"{stack}_{site}_norm"


def site_name(module_name: str) -> str:
    """The logged name of a norm module: ``encoder.layers.3.final_layer_norm`` -> ``enc3.ffn``,
    ``decoder.final_norm`` -> ``dec.final``."""
    sites = {attribute: site for site, attribute in SITE_ATTRIBUTES.items()}
    parts = module_name.split(".")
    stack = _LOG_STACKS[parts[0]]
    if len(parts) == 4 and parts[1] == "layers":
        return f"{stack}{parts[2]}.{sites[parts[3]]}"
    return f"{stack}.{sites[parts[1]]}"


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
    "norm_impl": "impl",
}


def _number(kind, ok, valid):
    def parse(text):
        value = kind(text)
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {valid}, got {text}")
        return value
    return parse


def add_norm_args(parser, sites=SITES):
    """The plugin's model flags for a model with these (stack, site) pairs of SITES. No
    defaults here: the architectures fill them, and fairseq's model group leaves an unset
    flag absent."""
    names = list(norm_names())
    stacks = dict.fromkeys(stack for stack, _ in sites)  # in order, once each
    add = parser.add_argument
    for stack in stacks:
        add(f"--{stack}-norm", choices=names, metavar="NORM",
            help=f"norm at every {stack} site; one of {', '.join(names)}")
    for stack, site in sites:
        add("--" + site_flag(stack, site).replace("_", "-"), choices=names, metavar="NORM",
            help=f"override the {stack} {site.replace('_', '-')} site (default: --{stack}-norm)")
    add("--norm-eps", type=_number(float, lambda v: v > 0, "> 0"),
        help="epsilon of every plugin norm (default: each norm's own)")
    add("--bn-momentum", type=_number(float, lambda v: 0 < v <= 1, "in (0, 1]"),
        help="running-statistics momentum of batch norms (default 0.05)")
    add("--bn-test-stats", choices=["population", "batch"],
        help="statistics of batch norms in eval (default population)")
    add("--bn-sync-stats", action="store_true", default=None,
        help="sum the statistics of batch and power norms over distributed workers")
    add("--adanorm-k", type=_number(float, lambda v: v >= 0, ">= 0"), help="AdaNorm k (default 0.1)")
    add("--adanorm-scale", type=_number(float, lambda v: v > 0, "> 0"), help="AdaNorm C (default 1.0)")
    add("--detach-mode", choices=["mean", "std", "both"], help="what DetachNorm detaches (default both)")
    add("--power-warmup", type=_number(int, lambda v: v >= 0, ">= 0"),
        help="PowerNorm warm-up in updates (default: --warmup-updates)")
    add("--power-final-warmup", type=_number(int, lambda v: v >= 0, ">= 0"),
        help="warm-up of a PowerNorm at a stack's final norm (default: --power-warmup; "
             "Shen et al.'s release: 1000)")
    add("--power-alpha-fwd", type=_number(float, lambda v: 0 <= v <= 1, "in [0, 1]"),
        help="PowerNorm forward EMA factor (default 0.9)")
    add("--power-alpha-bkw", type=_number(float, lambda v: 0 <= v <= 1, "in [0, 1]"),
        help="PowerNorm backward EMA factor (default 0.9)")
    add("--power-groups", type=_number(int, lambda v: v > 0, "> 0"),
        help="PowerNorm group-scaling groups (default: attention heads)")
    add("--attn-init", choices=["fairseq", "kaiming"],
        help="attention projections: fairseq's Xavier init (default), or kaiming: nn.Linear's "
             "default weights (kaiming_uniform, a=sqrt(5)) with zero biases, as Xu et al.'s --init_method km")
    for stack in stacks:
        add(f"--{stack}-ffn-init", choices=["pytorch", "xavier"],
            help=f"{stack} FFN layers: pytorch: nn.Linear's default init (fairseq 0.12's, the default); "
                 "xavier: Xavier-uniform weights and zero biases (fairseq <= 0.10's Linear)")
    add("--norm-impl", choices=IMPLS,
        help="fused norms' implementation: torch code, Triton kernels (CUDA), or auto (default): "
             "the torch code, until a norm's kernels pass the GPU check (benchmarks/gpu_check.sh)")
    add("--compile-norms", action="store_true", default=None,
        help="compile every plugin norm with torch.compile (first batches of each shape are slower)")


@dataclass
class NormPlan:
    """Norm name per (stack, site) and the options given on the command line."""

    sites: Dict[Tuple[str, str], str]
    options: Dict[str, object]
    heads: Dict[str, int]
    final_warmup: Optional[int] = None

    @classmethod
    def from_config(cls, cfg) -> "NormPlan":
        """From fairseq's TransformerConfig (which keeps plugin flags as attributes) or the flat
        Namespace fairseq hands a legacy model such as the language model."""
        cfg = TransformerConfig.from_namespace(cfg)  # a TransformerConfig comes back as it is
        sites = {(stack, site): getattr(cfg, site_flag(stack, site), None)
                 or getattr(cfg, f"{stack}_norm", None) or "layer" for stack, site in SITES}
        options = {kw: getattr(cfg, flag) for flag, kw in NORM_OPTION_FLAGS.items()
                   if getattr(cfg, flag, None) is not None}
        if "warmup_updates" not in options and getattr(cfg, "warmup_updates", None):
            options["warmup_updates"] = int(cfg.warmup_updates)  # PowerNorm's warm-up is the lr's
        heads = {"encoder": cfg.encoder.attention_heads, "decoder": cfg.decoder.attention_heads}
        return cls(sites, options, heads, getattr(cfg, "power_final_warmup", None))

    def build(self, stack: str, site: str, dim: int) -> nn.Module:
        name = self.sites[(stack, site)]
        accepted = norm_options(name)
        kwargs = {k: v for k, v in self.options.items() if k in accepted}
        if "groups" in accepted:
            kwargs.setdefault("groups", self.heads[stack])
        if "warmup_updates" in accepted and site == "final" and self.final_warmup is not None:
            kwargs["warmup_updates"] = self.final_warmup
        try:
            return create_norm(name, dim, **kwargs)
        except NormConfigError as err:
            flag = site_flag(stack, site).replace("_", "-")
            raise NormplugError(f"{stack} {site} site (--{flag} {name}): {err}") from None
