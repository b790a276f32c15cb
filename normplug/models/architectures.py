"""Named architectures: ``transformer_{iwslt_de_en,wmt_en_de,vaswani_wmt_en_de_big}_{kind}[_prenorm]``,
Post-Norm and Pre-Norm, on fairseq's IWSLT and WMT base shapes and the big WMT model
(1024/4096/16 heads/6+6, dropout 0.3: fairseq's ``transformer_vaswani_wmt_en_de_big``;
with ``_prenorm`` and ``--attention-dropout 0.1 --activation-dropout 0.1`` it is
``transformer_wmt_en_de_big_t2t``, the model of Shen et al.'s WMT14 runs).

* ``ln``, ``lnsimple``, ``detach``, ``adanorm``, ``rms``, ``scale``, ``nonorm``: that norm at
  every site, as Xu et al. describe replacing LayerNorm (their release swaps only the
  stacks' final norms: ``--encoder-norm layer --decoder-norm layer --encoder-final-norm
  KIND --decoder-final-norm KIND`` on a ``_prenorm`` architecture).
* ``bn``, ``rbn``: BatchNorm at the encoder's self-attention and FFN sites, LayerNorm
  elsewhere (Wang, Wu & Huang's release). ``rbn`` is the ``bn`` model: the regularization
  is a loss term of ``--criterion label_smoothed_cross_entropy_rbn``.
* ``pn``: PowerNorm at the encoder's self-attention and FFN sites and, in Pre-Norm, at the
  encoder's final norm with a warm-up of 1000 updates; LayerNorm elsewhere (Shen et al.'s
  release, ``train-iwslt14.sh power power layer layer``).

Every option an architecture sets is a default: a flag or a hydra ``model.*`` key wins. The bare
``norm_transformer`` is fairseq's base Transformer, LayerNorm at every site unless the options say
otherwise. The language-model architectures (architectures_lm.py) are built from the same KINDS.
"""
from fairseq.models.transformer.transformer_legacy import (
    transformer_iwslt_de_en,
    transformer_vaswani_wmt_en_de_big,
    transformer_wmt_en_de,
)

from .config import register_architecture

MODEL = "norm_transformer"

# kind -> (norm at every site, the batch-statistics norm at the sublayer sites where the papers
# put it: the encoder's self-attention and FFN in translation, every layer's in a language model)
KINDS = {
    "ln": ("layer", None),
    "lnsimple": ("layer_simple", None),
    "detach": ("detach", None),
    "adanorm": ("adanorm", None),
    "rms": ("rms", None),
    "scale": ("scale", None),
    "nonorm": ("identity", None),
    "bn": ("layer", "batch"),
    "rbn": ("layer", "batch"),
    "pn": ("layer", "power"),
}

SHAPES = {"transformer_iwslt_de_en": transformer_iwslt_de_en, "transformer_wmt_en_de": transformer_wmt_en_de,
          "transformer_vaswani_wmt_en_de_big": transformer_vaswani_wmt_en_de_big}


def _translation_defaults(kind):
    every_site, sublayers = KINDS[kind]
    defaults = {"encoder_norm": every_site, "decoder_norm": every_site}
    if sublayers is not None:
        defaults.update(encoder_self_attn_norm=sublayers, encoder_ffn_norm=sublayers)
    if sublayers == "power":  # Shen et al.'s release: also the encoder's final (Pre-Norm) norm
        defaults.update(encoder_final_norm="power", power_final_warmup=1000)
    return defaults


def set_defaults(args, defaults):
    """Each option left unset gets its default."""
    for flag, value in defaults.items():
        if getattr(args, flag, None) is None:
            setattr(args, flag, value)


def _make_architecture(shape_fn, defaults, prenorm):
    def architecture(args):
        set_defaults(args, defaults)
        if prenorm:
            set_defaults(args, {"encoder_normalize_before": True, "decoder_normalize_before": True})
        shape_fn(args)

    return architecture


ARCHITECTURES = {}
for _shape, _shape_fn in SHAPES.items():
    for _kind in KINDS:
        for _prenorm in (False, True):
            _name = f"{_shape}_{_kind}" + ("_prenorm" if _prenorm else "")
            ARCHITECTURES[_name] = register_architecture(MODEL, _name)(
                _make_architecture(_shape_fn, _translation_defaults(_kind), _prenorm))
