"""Named architectures: every row of SPEC §4 on the IWSLT and WMT base shapes,
Post-Norm and Pre-Norm (``_prenorm``).

``transformer_{iwslt_de_en,wmt_en_de}_{kind}[_prenorm]``; the kinds and their
published placements (SPEC §3):

* ``ln``, ``lnsimple``, ``detach``, ``adanorm``, ``rms``, ``scale``, ``nonorm``:
  that norm at every site (Xu et al. describe AdaNorm/LN-simple as replacing
  LayerNorm; their released final-norms-only placement is
  ``--encoder-norm layer --decoder-norm layer --encoder-final-norm adanorm
  --decoder-final-norm adanorm`` on a Pre-Norm architecture).
* ``bn``, ``rbn``, ``pn``: BatchNorm / BatchNorm / PowerNorm at the encoder's
  self-attention and FFN sites, LayerNorm everywhere else (Wang et al.; Shen
  et al.). ``rbn`` is the ``bn`` model: the regularization is a loss term,
  added by ``--criterion label_smoothed_cross_entropy_rbn``.

Every flag an architecture sets is only a default: command-line flags win.
"""
from fairseq.models import register_model_architecture
from fairseq.models.transformer.transformer_legacy import (
    base_architecture,
    transformer_iwslt_de_en,
    transformer_wmt_en_de,
)

MODEL = "norm_transformer"

# kind -> (norm at every site, norm at the encoder's attention and FFN sites)
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

SHAPES = {
    "transformer_iwslt_de_en": transformer_iwslt_de_en,
    "transformer_wmt_en_de": transformer_wmt_en_de,
}


def _default(args, name, value):
    if getattr(args, name, None) is None:
        setattr(args, name, value)


def _make_architecture(shape_fn, every_site, encoder_sublayers, prenorm):
    def architecture(args):
        _default(args, "encoder_norm", every_site)
        _default(args, "decoder_norm", every_site)
        if encoder_sublayers is not None:
            _default(args, "encoder_attn_norm", encoder_sublayers)
            _default(args, "encoder_ffn_norm", encoder_sublayers)
        if prenorm:
            _default(args, "encoder_normalize_before", True)
            _default(args, "decoder_normalize_before", True)
        shape_fn(args)

    return architecture


ARCHITECTURES = {}
for _shape, _shape_fn in SHAPES.items():
    for _kind, (_every, _enc) in KINDS.items():
        for _prenorm in (False, True):
            _name = f"{_shape}_{_kind}" + ("_prenorm" if _prenorm else "")
            ARCHITECTURES[_name] = register_model_architecture(MODEL, _name)(
                _make_architecture(_shape_fn, _every, _enc, _prenorm)
            )


@register_model_architecture(MODEL, MODEL)
def norm_transformer(args):
    """The stock base Transformer; norms come from the flags (LayerNorm by default)."""
    base_architecture(args)
