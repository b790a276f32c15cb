"""``norm_transformer``: fairseq's Transformer with every norm site built from the normplug
registry and handed the padding mask of its stream. Its decoder, without cross-attention, is
also the language model's (norm_transformer_lm.py).

The layers keep fairseq's attribute names (norm_plan.SITE_ATTRIBUTES: ``self_attn_layer_norm``,
``encoder_attn_layer_norm``, and ``final_layer_norm`` for the FFN), so a LayerNorm model's
state dict matches the stock Transformer's; a stack's final norm, fairseq's ``layer_norm``,
is ``final_norm`` here, and a stock checkpoint's is renamed on load. Their forwards are
written out here (fairseq 0.12's maths) because fairseq calls a norm as ``norm(x)``,
without the mask.
"""
import math
from typing import Dict, List, Optional

import torch
from torch import Tensor, nn

from fairseq.models import register_model
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoder,
    TransformerEncoder,
    TransformerModel,
)
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from ..errors import NormplugError
from ..norms import BatchStatNorm
from .config import model_config
from .norm_model import NormModel
from .norm_plan import SITE_ATTRIBUTES, STACK_SITES, NormPlan, site_name
from .options import add_option_args, options_for


def init_attention(attn, scheme):
    """Re-initialise an attention's projections; ``kaiming`` is Xu et al.'s ``--init_method km``
    (lancopku/AdaNorm, fairseq/modules/multihead_attention.py): nn.Linear's default weights, zero biases."""
    if scheme == "kaiming":
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj):
            nn.init.kaiming_uniform_(proj.weight, a=math.sqrt(5))
            nn.init.zeros_(proj.bias)


def init_ffn(layer, scheme):
    """Re-initialise a layer's FFN; ``xavier`` is fairseq <= 0.10's ``Linear`` (the papers' releases),
    ``pytorch`` keeps fairseq 0.12's plain nn.Linear."""
    if scheme == "xavier":
        for fc in (layer.fc1, layer.fc2):
            nn.init.xavier_uniform_(fc.weight)
            nn.init.zeros_(fc.bias)


class _ResidualNorm:
    """The residual block of a Transformer layer, Pre- or Post-Norm, with a masked norm."""

    def _residual_block(self, x, norm, pad_mask, sublayer):
        residual = x
        if self.normalize_before:
            x = norm(x, pad_mask)
        x = self.residual_connection(self.dropout_module(sublayer(x)), residual)
        if not self.normalize_before:
            x = norm(x, pad_mask)
        return x

    def _ffn(self, x):
        x = self.activation_dropout_module(self.activation_fn(self.fc1(x)))
        return self.fc2(x)


class NormTransformerEncoderLayer(_ResidualNorm, TransformerEncoderLayerBase):
    """Encoder layer whose two norms receive the source padding mask."""

    def __init__(self, cfg, plan: NormPlan):
        super().__init__(cfg)
        if self.return_fc:
            raise NormplugError("norm_transformer does not support return_fc")
        for site in ("self_attn", "ffn"):
            setattr(self, SITE_ATTRIBUTES[site], plan.build("encoder", site, self.embed_dim))
        init_attention(self.self_attn, getattr(cfg, "attn_init", None))
        init_ffn(self, getattr(cfg, "encoder_ffn_init", None))

    def forward(self, x, encoder_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor] = None):
        if attn_mask is not None:  # as fairseq: a finite large negative keeps fully masked rows finite
            attn_mask = attn_mask.masked_fill(attn_mask.to(torch.bool),
                                              -1e8 if x.dtype == torch.float32 else -1e4)

        def self_attention(h):
            return self.self_attn(query=h, key=h, value=h, key_padding_mask=encoder_padding_mask,
                                  need_weights=False, attn_mask=attn_mask)[0]

        x = self._residual_block(x, self.self_attn_layer_norm, encoder_padding_mask, self_attention)
        return self._residual_block(x, self.final_layer_norm, encoder_padding_mask, self._ffn)


class NormTransformerDecoderLayer(_ResidualNorm, TransformerDecoderLayerBase):
    """Decoder layer whose three norms receive the target padding mask."""

    def __init__(self, cfg, plan: NormPlan, no_encoder_attn=False):
        super().__init__(cfg, no_encoder_attn=no_encoder_attn)
        unsupported = [name for name, on in (
            ("cross-self-attention", self.cross_self_attention), ("scale-heads", self.c_attn is not None),
            ("scale-attn", self.attn_ln is not None), ("scale-fc", self.ffn_layernorm is not None),
            ("scale-resids", self.w_resid is not None)) if on]
        if unsupported:
            raise NormplugError(f"norm_transformer does not support --{unsupported[0]}; "
                                  "drop it or use the stock transformer")
        for site in ("self_attn", "cross_attn", "ffn"):
            if site != "cross_attn" or self.encoder_attn is not None:
                setattr(self, SITE_ATTRIBUTES[site], plan.build("decoder", site, self.embed_dim))
        for attn in (self.self_attn, self.encoder_attn):
            if attn is not None:
                init_attention(attn, getattr(cfg, "attn_init", None))
        init_ffn(self, getattr(cfg, "decoder_ffn_init", None))

    def forward(self, x, encoder_out: Optional[Tensor] = None,
                encoder_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                prev_self_attn_state: Optional[List[Tensor]] = None,
                prev_attn_state: Optional[List[Tensor]] = None,
                self_attn_mask: Optional[Tensor] = None,
                self_attn_padding_mask: Optional[Tensor] = None,
                need_attn: bool = False, need_head_weights: bool = False):
        if prev_self_attn_state is not None or prev_attn_state is not None:
            raise NotImplementedError("norm_transformer does not take prev_*_attn_state")
        tgt_mask = self_attn_padding_mask  # every decoder site normalises target positions
        need_attn = need_attn or need_head_weights
        attn: Optional[Tensor] = None

        def self_attention(h):
            return self.self_attn(query=h, key=h, value=h, key_padding_mask=self_attn_padding_mask,
                                  incremental_state=incremental_state, need_weights=False,
                                  attn_mask=self_attn_mask)[0]

        x = self._residual_block(x, self.self_attn_layer_norm, tgt_mask, self_attention)
        if self.encoder_attn is not None and encoder_out is not None:

            def cross_attention(h):
                nonlocal attn
                h, attn = self.encoder_attn(
                    query=h, key=encoder_out, value=encoder_out, key_padding_mask=encoder_padding_mask,
                    incremental_state=incremental_state, static_kv=True,
                    need_weights=need_attn or (not self.training and self.need_attn),
                    need_head_weights=need_head_weights)
                return h

            x = self._residual_block(x, self.encoder_attn_layer_norm, tgt_mask, cross_attention)
        x = self._residual_block(x, self.final_layer_norm, tgt_mask, self._ffn)
        return x, attn, None


class NormTransformerEncoder(TransformerEncoder):
    """Encoder whose final (Pre-Norm) norm also sees the source mask."""

    def __init__(self, cfg, dictionary, embed_tokens):
        self.norm_plan = NormPlan.from_config(cfg)  # read by build_encoder_layer
        super().__init__(cfg, dictionary, embed_tokens)
        # fairseq's forward applies `layer_norm` without the mask: ours is `final_norm`
        self.final_norm = (self.norm_plan.build("encoder", "final", embed_tokens.embedding_dim)
                           if self.layer_norm is not None else None)
        self.layer_norm = None

    def build_encoder_layer(self, cfg):
        return NormTransformerEncoderLayer(cfg, self.norm_plan)

    def forward(self, src_tokens, src_lengths: Optional[Tensor] = None,
                return_all_hiddens: bool = False, token_embeddings: Optional[Tensor] = None):
        out = super().forward(src_tokens, src_lengths, return_all_hiddens, token_embeddings)
        if self.final_norm is not None:
            out["encoder_out"][0] = self.final_norm(out["encoder_out"][0], out["encoder_padding_mask"][0])
        return out

    def upgrade_state_dict_named(self, state_dict, name):
        _rename_final_norm(state_dict, name)
        return super().upgrade_state_dict_named(state_dict, name)


class NormTransformerDecoder(TransformerDecoder):
    """Decoder whose final (Pre-Norm) norm also sees the target mask."""

    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False):
        self.norm_plan = NormPlan.from_config(cfg)
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        self.final_norm = (self.norm_plan.build("decoder", "final", self.embed_dim)
                           if self.layer_norm is not None else None)
        self.layer_norm = None
        if self.final_norm is not None and self.project_out_dim is not None:
            raise NormplugError("norm_transformer: --decoder-output-dim must equal "
                                  "--decoder-embed-dim when the decoder has a final norm (Pre-Norm)")

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return NormTransformerDecoderLayer(cfg, self.norm_plan, no_encoder_attn=no_encoder_attn)

    def extract_features(self, prev_output_tokens, encoder_out=None, incremental_state=None,
                         full_context_alignment=False, alignment_layer=None, alignment_heads=None):
        if incremental_state is not None and not self.training:
            self.check_incremental_decoding()
        x, extra = super().extract_features(prev_output_tokens, encoder_out, incremental_state,
                                            full_context_alignment, alignment_layer, alignment_heads)
        if self.final_norm is not None:
            tokens = prev_output_tokens[:, -1:] if incremental_state is not None else prev_output_tokens
            # x is B×T×C here; norms take T×B×C
            x = self.final_norm(x.transpose(0, 1), tokens.eq(self.padding_idx)).transpose(0, 1)
        return x, extra

    def check_incremental_decoding(self):
        """Refuse norms that need the whole test batch when decoding token by token."""
        for name, module in self.named_modules():
            if isinstance(module, BatchStatNorm) and module.uses_batch_stats_in_eval:
                raise NormplugError(
                    f"decoder norm {site_name('decoder.' + name)} ({module.norm_name}) normalises with "
                    "test-batch statistics, which incremental decoding (one token at a time) cannot "
                    "provide and which pool future tokens in a language model; use --bn-test-stats "
                    "population, or keep batch norms out of a translation decoder")

    def upgrade_state_dict_named(self, state_dict, name):
        _rename_final_norm(state_dict, name)
        return super().upgrade_state_dict_named(state_dict, name)


def _rename_final_norm(state_dict, name):
    """Stock Pre-Norm checkpoints call the final norm `layer_norm`."""
    for key in [k for k in state_dict if k.startswith(f"{name}.layer_norm.")]:
        state_dict[f"{name}.final_norm." + key[len(f"{name}.layer_norm."):]] = state_dict.pop(key)


# fairseq-train's flags and fairseq-hydra-train's `model.*` keys: fairseq's Transformer's, and ours
TranslationNormOptions = options_for("TranslationNormOptions", STACK_SITES)
NormTransformerConfig = model_config("NormTransformerConfig", TransformerConfig, TranslationNormOptions)


@register_model("norm_transformer", dataclass=NormTransformerConfig)
class NormTransformerModel(NormModel, TransformerModel):
    """Transformer whose every norm site comes from the normplug registry."""

    options = TranslationNormOptions

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)  # fairseq's flags, from its TransformerConfig
        add_option_args(parser, TranslationNormOptions)

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        return NormTransformerEncoder(cfg, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        return NormTransformerDecoder(cfg, tgt_dict, embed_tokens,
                                      no_encoder_attn=cfg.no_cross_attention)
