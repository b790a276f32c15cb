"""``norm_transformer_lm``: fairseq's Transformer language model (``--task language_modeling``)
whose decoder is the translation model's :class:`NormTransformerDecoder` without
cross-attention: every site (self-attention, FFN, and the final norm of a Pre-Norm stack)
built from the normplug registry by ``--decoder-norm`` and the per-site flags, handed the
target padding mask, Post-Norm unless ``--decoder-normalize-before``. Site names:
``dec0.self_attn``, ``dec0.ffn``, ``dec.final``. Adaptive input and adaptive softmax are fairseq's.

Causality. In training, a norm with batch statistics (BN, PowerNorm) pools every real token
of the batch, later positions of the same sequence included, as the papers' language-model
runs did: each position's output depends, per channel, on the future through μ_B and σ²_B.
In evaluation it uses its population statistics only, so the model is causal at inference
(a full forward gives each position the log-probabilities that token-by-token incremental
decoding gives), and padding changes no real token's output. Test-batch statistics
(``--bn-test-stats batch``) would pool future tokens at inference: the model refuses them
in incremental decoding and in fairseq-eval-lm / fairseq-generate.
"""
from fairseq import options
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import register_model
from fairseq.models.transformer_lm import (
    DEFAULT_MAX_TARGET_POSITIONS,
    TransformerLanguageModel,
    TransformerLanguageModelConfig,
    base_lm_architecture,
)
from fairseq.modules import AdaptiveInput

from ..errors import NormplugError
from .config import model_config
from .norm_model import NormModel
from .norm_transformer import NormTransformerDecoder
from .options import add_option_args, options_for


def lm_base_architecture(args):
    """fairseq's ``base_lm_architecture`` with ``--decoder-normalize-before`` honoured:
    fairseq's forces Pre-Norm; here Post-Norm unless the flag is given."""
    normalize_before = getattr(args, "decoder_normalize_before", None) or False
    base_lm_architecture(args)
    args.decoder_normalize_before = normalize_before


# fairseq-train's flags and fairseq-hydra-train's `model.*` keys: fairseq's transformer_lm's, and ours
# for the decoder's sites (no cross-attention)
LMNormOptions = options_for("LMNormOptions", {"decoder": ("self_attn", "ffn", "final")})
NormTransformerLMConfig = model_config("NormTransformerLMConfig", TransformerLanguageModelConfig,
                                       LMNormOptions)


@register_model("norm_transformer_lm", dataclass=NormTransformerLMConfig)
class NormTransformerLanguageModel(NormModel, TransformerLanguageModel):
    """Transformer language model whose every norm site comes from the normplug registry."""

    options = LMNormOptions

    @classmethod
    def add_args(cls, parser):
        gen_parser_from_dataclass(parser, TransformerLanguageModelConfig(), delete_default=True)
        add_option_args(parser, LMNormOptions)

    @classmethod
    def build_modules(cls, args, task):
        # fairseq's TransformerLanguageModel.build_model constructs its decoder class inside the
        # method, so its steps before the decoder are repeated here (its asserts as one-line
        # errors), less character embeddings
        lm_base_architecture(args)  # every architecture ends on it; the bare model name has none
        if getattr(args, "character_embeddings", False):
            raise NormplugError("norm_transformer_lm does not support --character-embeddings")
        if args.decoder_layers_to_keep:
            args.decoder_layers = len(args.decoder_layers_to_keep.split(","))
        if getattr(args, "max_target_positions", None) is None:
            args.max_target_positions = getattr(args, "tokens_per_sample", DEFAULT_MAX_TARGET_POSITIONS)
        dictionary = task.source_dictionary
        if args.adaptive_input:
            embed_tokens = AdaptiveInput(
                len(dictionary), dictionary.pad(), args.decoder_input_dim, args.adaptive_input_factor,
                args.decoder_embed_dim, options.eval_str_list(args.adaptive_input_cutoff, type=int),
                args.quant_noise_pq, args.quant_noise_pq_block_size)
        else:
            embed_tokens = cls.build_embedding(args, dictionary, args.decoder_input_dim)
        if args.tie_adaptive_weights:
            for ok, needs in (
                    (args.adaptive_input, "--adaptive-input"),
                    (args.adaptive_input_factor == args.adaptive_softmax_factor,
                     "--adaptive-input-factor equal to --adaptive-softmax-factor"),
                    (args.adaptive_input_cutoff == args.adaptive_softmax_cutoff,
                     "--adaptive-input-cutoff equal to --adaptive-softmax-cutoff"),
                    (args.decoder_input_dim == args.decoder_output_dim,
                     "--decoder-input-dim equal to --decoder-output-dim")):
                if not ok:
                    raise NormplugError(f"--tie-adaptive-weights needs {needs}")
        return cls(NormTransformerDecoder(args, task.target_dictionary, embed_tokens, no_encoder_attn=True))
