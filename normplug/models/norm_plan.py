"""Which norm sits at which Transformer site, with which options.

A :class:`NormPlan` is read from the model's configuration and builds every site's
norm through the registry; the model never looks inside a norm.
"""
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch.nn as nn
from fairseq.models.transformer.transformer_config import TransformerConfig

from ..errors import NormplugError
from ..norms import NormConfigError, create_norm, norm_options
from .options import NORM_KEYWORDS

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


@dataclass
class NormPlan:
    """Norm name per (stack, site) and the options given."""

    sites: Dict[Tuple[str, str], str]
    options: Dict[str, object]
    heads: Dict[str, int]
    final_warmup: Optional[int] = None

    @classmethod
    def from_config(cls, cfg) -> "NormPlan":
        """From the flat Namespace the model is built from (config.given_options), or the
        TransformerConfig fairseq makes of it, which keeps the plugin's options as attributes."""
        cfg = TransformerConfig.from_namespace(cfg)  # a TransformerConfig comes back as it is
        sites = {(stack, site): getattr(cfg, site_flag(stack, site), None)
                 or getattr(cfg, f"{stack}_norm", None) or "layer" for stack, site in SITES}
        options = {kw: getattr(cfg, name) for name, kw in NORM_KEYWORDS.items()
                   if getattr(cfg, name, None) is not None}
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
