"""How fairseq hands a plugin model its options, from either entry point.

Each model registers a dataclass (:func:`model_config`): fairseq's flat model fields and the
plugin's norm options. fairseq-train fills it from its flags, fairseq-hydra-train from the
config; fairseq merges the config with it, which refuses an unknown key or a mistyped value.

"Not given" is None in that dataclass, as it is an absent attribute in fairseq-train's flat
Namespace: so an architecture, which fills the options left unset, gives the same model from
either entry point. fairseq's architecture functions test for absence (``getattr`` with a
default); :func:`register_architecture` hands them the given options only.
"""
from argparse import Namespace
from dataclasses import field, fields, is_dataclass, make_dataclass
from typing import Optional

from fairseq.models import register_model_architecture
from omegaconf import OmegaConf

# The BASE-layer fields keep fairseq's defaults: its trainer compares the model config's base_layers
# with 0, and its LM base architecture would fill base_shuffle, an int field, with False
KEEP_DEFAULTS = {"base_layers", "base_sublayers", "base_shuffle"}


def _flat_fields(config, prefix=""):
    """(name, field) of a fairseq model dataclass, as its flat flags name them: TransformerConfig's
    ``encoder.embed_dim`` is ``encoder_embed_dim``."""
    for f in fields(config):
        if f.name.startswith("_"):
            continue
        if isinstance(f.type, type) and is_dataclass(f.type):
            yield from _flat_fields(f.type, f"{prefix}{f.name}_")
        else:
            yield prefix + f.name, f


def _keep_namespace(cls, args):
    # fairseq turns a flat Namespace (a model built in process, an old checkpoint) into the
    # dataclass for the bare model name only; kept whole, as for every named architecture, it
    # keeps the run's settings the model reads (criterion, learning-rate warm-up)
    return args


def model_config(name, fairseq_config, options):
    """The dataclass a model registers: ``options`` and the flat fields of ``fairseq_config``, every
    one None until given, but fairseq's interpolations from other groups (the task's
    ``tokens_per_sample``) and KEEP_DEFAULTS."""
    specs = []
    for key, f in _flat_fields(fairseq_config):
        default = str(f.default)  # an interpolation of the hierarchical model is flattened away
        if key in KEEP_DEFAULTS or (default.startswith("${") and not default.startswith("${model.")):
            specs.append((key, f.type, field(default=f.default, default_factory=f.default_factory,
                                             metadata=f.metadata)))
        else:
            specs.append((key, Optional[f.type], field(default=None, metadata=f.metadata)))
    return make_dataclass(name, specs, bases=(options,),
                          namespace={"from_namespace": classmethod(_keep_namespace)})


def given_options(cfg) -> Namespace:
    """``cfg`` as fairseq's architecture functions and model code read it: a flat Namespace in
    which an option not given is absent. A Namespace is that already; a config of the model's
    dataclass (DictConfig) is converted, without its None fields."""
    if isinstance(cfg, Namespace):
        return cfg
    values = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    return Namespace(**{key: value for key, value in values.items() if value is not None})


def register_architecture(model_name, arch_name):
    """fairseq's ``register_model_architecture`` for a function that, as fairseq's own, fills the
    options absent from a flat Namespace; a config of the model's dataclass gets its None fields
    filled the same way."""
    def register(fill):
        def architecture(cfg):
            args = given_options(cfg)
            fill(args)
            if args is not cfg:  # fairseq calls this on the config in open_dict: new keys allowed
                for key, value in vars(args).items():
                    if cfg.get(key) is None:
                        cfg[key] = value
        register_model_architecture(model_name, arch_name)(architecture)
        return fill
    return register


def run_group(cfg, group):
    """(name, options) of another group of the run's config, ``criterion`` or ``lr_scheduler``, seen
    from the config fairseq builds the model from: a node of the run's config (fairseq hands a
    dataclass model its own group only), or a flat Namespace, which holds every group's options."""
    if isinstance(cfg, Namespace):
        return getattr(cfg, group, None), cfg
    root = cfg._get_root()  # OmegaConf's own walk up the tree, also how it resolves ${...}
    node = root[group] if root is not cfg and group in root else None
    return getattr(node, "_name", None), node
