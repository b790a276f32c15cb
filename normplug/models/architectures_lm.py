"""Named language-model architectures: ``transformer_lm_ptb_{kind}`` and
``transformer_lm_wt103_{kind}`` for every kind of :data:`architectures.KINDS`, on
``norm_transformer_lm``.

* ``ln``, ``lnsimple``, ``detach``, ``adanorm``, ``rms``, ``scale``, ``nonorm``: that norm at
  every site.
* ``bn``, ``rbn``, ``pn``: BatchNorm (``rbn``: the ``bn`` model, trained with
  ``--criterion cross_entropy_rbn`` or ``adaptive_loss_rbn``) or PowerNorm at every layer's
  self-attention and FFN sites; LayerNorm at the final site of a Pre-Norm stack.

Post-Norm, as the reference runs (no ``--pre_lnorm``); ``--decoder-normalize-before`` gives
Pre-Norm. No release holds the papers' language-model code: Wang, Wu & Huang (RegularizedBN
README) and Shen et al. edited the norm of Ma et al. 2019's tensorized Transformer
(szhangtju/The-compression-of-Transformer, on kimiyoung/transformer-xl). The sizes are its
scripts' (BTD-Transformer/run_ptb.sh of 2020-01-02, d079a71; run_wt103.sh):

* PTB: 3 layers, d_model 256, d_inner 2100, dropout 0.3 (also after the FFN's ReLU, as its
  PositionwiseFF), attention dropout 0, full softmax with the input embedding tied to it.
* WikiText-103: 6 layers, d_model 256, d_inner 2100, dropout 0.1, attention dropout 0,
  adaptive input and adaptive softmax with cutoffs 20000, 40000, 200000, tied, every cluster
  at the full width (its ``--div_val 1``: fairseq's factor 1).

What differs from the reference, beyond the norms:

* Attention: the scripts' ``--n_head 1`` is kept (it divides d_model), but in fairseq's
  multi-head attention, one head of width 256; the reference's is a one-head block-term
  tensorized attention (``--d_head 40``). PowerNorm's group scaling has one group per head:
  one group here.
* Positions: fairseq adds sinusoidal absolute position embeddings to the (√d-scaled) token
  embeddings; transformer-xl puts relative sinusoidal encodings, with learned biases, inside
  the attention. With ``--mem_len 0`` neither has a recurrence memory.
* fairseq's adaptive input gives every band a d×d projection (tied to the adaptive softmax's
  tail projections by ``--tie-adaptive-proj``), where transformer-xl at ``--div_val 1`` has
  none; fairseq's output layer has no bias, and no dropout before it; initialisation is
  fairseq's.
* Training schedule and data are the caller's: the scripts train with Adam at 2.5e-4, no
  warm-up, cosine decay to 0 (PTB 20k steps, segments of 32, batch 120; WikiText-103 200k
  steps, segments of 80, batch 60), clip 0.25.

Every option an architecture sets is a default: a flag or a hydra ``model.*`` key wins. The bare
``norm_transformer_lm`` is fairseq's ``transformer_lm`` shape, Post-Norm unless
``--decoder-normalize-before``, LayerNorm at every site unless the options say otherwise.
"""
from .architectures import KINDS, set_defaults
from .config import register_architecture
from .norm_transformer_lm import lm_base_architecture

MODEL = "norm_transformer_lm"


def transformer_lm_ptb(args):
    set_defaults(args, {"decoder_layers": 3, "decoder_embed_dim": 256, "decoder_ffn_embed_dim": 2100,
                        "decoder_attention_heads": 1, "dropout": 0.3, "attention_dropout": 0.0,
                        "share_decoder_input_output_embed": True})
    set_defaults(args, {"activation_dropout": args.dropout})
    lm_base_architecture(args)


def transformer_lm_wt103(args):
    cutoffs = "20000,40000,200000"
    set_defaults(args, {"decoder_layers": 6, "decoder_embed_dim": 256, "decoder_ffn_embed_dim": 2100,
                        "decoder_attention_heads": 1, "dropout": 0.1, "attention_dropout": 0.0,
                        "adaptive_input": True, "adaptive_input_factor": 1, "adaptive_input_cutoff": cutoffs,
                        "adaptive_softmax_factor": 1, "adaptive_softmax_cutoff": cutoffs,
                        "tie_adaptive_weights": True, "tie_adaptive_proj": True})
    set_defaults(args, {"activation_dropout": args.dropout})
    lm_base_architecture(args)


LM_SHAPES = {"transformer_lm_ptb": transformer_lm_ptb, "transformer_lm_wt103": transformer_lm_wt103}


def _lm_defaults(kind):
    every_site, sublayers = KINDS[kind]
    defaults = {"decoder_norm": every_site}
    if sublayers is not None:
        defaults.update(decoder_self_attn_norm=sublayers, decoder_ffn_norm=sublayers)
    return defaults


def _make_lm_architecture(shape_fn, defaults):
    def architecture(args):
        set_defaults(args, defaults)
        shape_fn(args)

    return architecture


LM_ARCHITECTURES = {}
for _shape, _shape_fn in LM_SHAPES.items():
    for _kind in KINDS:
        _name = f"{_shape}_{_kind}"
        LM_ARCHITECTURES[_name] = register_architecture(MODEL, _name)(
            _make_lm_architecture(_shape_fn, _lm_defaults(_kind)))
