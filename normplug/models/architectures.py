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

Every flag an architecture sets is a default: command-line flags win.
"""
from fairseq.models import register_model_architecture
from fairseq.models.transformer.transformer_legacy import (
    base_architecture,
    transformer_iwslt_de_en,
    transformer_vaswani_wmt_en_de_big,
    transformer_wmt_en_de,
)

MODEL = "norm_transformer"

_ENCODER_SUBLAYERS = ("encoder_attn_norm", "encoder_ffn_norm")

# kind -> (norm at every site, {flag: default} on top)
KINDS = {
    "ln": ("layer", {}),
    "lnsimple": ("layer_simple", {}),
    "detach": ("detach", {}),
    "adanorm": ("adanorm", {}),
    "rms": ("rms", {}),
    "scale": ("scale", {}),
    "nonorm": ("identity", {}),
    "bn": ("layer", dict.fromkeys(_ENCODER_SUBLAYERS, "batch")),
    "rbn": ("layer", dict.fromkeys(_ENCODER_SUBLAYERS, "batch")),
    "pn": ("layer", {**dict.fromkeys(_ENCODER_SUBLAYERS, "power"), "encoder_final_norm": "power",
                     "power_final_warmup": 1000}),
}

SHAPES = {"transformer_iwslt_de_en": transformer_iwslt_de_en, "transformer_wmt_en_de": transformer_wmt_en_de,
          "transformer_vaswani_wmt_en_de_big": transformer_vaswani_wmt_en_de_big}


def _make_architecture(shape_fn, every_site, defaults, prenorm):
    def architecture(args):
        for flag, value in {"encoder_norm": every_site, "decoder_norm": every_site, **defaults}.items():
            if getattr(args, flag, None) is None:
                setattr(args, flag, value)
        if prenorm:
            for flag in ("encoder_normalize_before", "decoder_normalize_before"):
                if getattr(args, flag, None) is None:
                    setattr(args, flag, True)
        shape_fn(args)

    return architecture


ARCHITECTURES = {}
for _shape, _shape_fn in SHAPES.items():
    for _kind, (_every, _defaults) in KINDS.items():
        for _prenorm in (False, True):
            _name = f"{_shape}_{_kind}" + ("_prenorm" if _prenorm else "")
            ARCHITECTURES[_name] = register_model_architecture(MODEL, _name)(
                _make_architecture(_shape_fn, _every, _defaults, _prenorm))


@register_model_architecture(MODEL, MODEL)
def norm_transformer(args):
    """The stock base Transformer; norms come from the flags (LayerNorm by default)."""
    base_architecture(args)
