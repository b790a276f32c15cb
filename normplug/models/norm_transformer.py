"""``norm_transformer``: fairseq's Transformer with every norm site built from
the normplug registry and handed the padding mask of its stream.

The layers keep fairseq's attribute names (``self_attn_layer_norm``,
``encoder_attn_layer_norm``, ``final_layer_norm``) so that a LayerNorm model's
state dict matches the stock Transformer's. Their forward passes are written
out here (same maths as fairseq 0.12's layers) because a norm needs the mask
and fairseq calls norms as ``norm(x)``; writing them out also means no fused
eval fast path can ever bypass a plugin norm.
"""
from typing import Dict, List, Optional

import torch
from torch import Tensor

from fairseq.models import register_model
from fairseq.models.transformer import (
    TransformerDecoder,
    TransformerEncoder,
    TransformerModel,
)
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)

from ..errors import check_training_run
from ..norms import BatchStatNorm, Discrepancy, NormConfigError
from .norm_plan import NormPlan, add_norm_args


class _ResidualNormMixin:
    """The residual block of a Transformer layer, Pre- or Post-Norm."""

    def _residual_block(self, x, norm, pad_mask, sublayer):
        residual = x
        if self.normalize_before:
            x = norm(x, pad_mask)
        x = self.dropout_module(sublayer(x))
        x = self.residual_connection(x, residual)
        if not self.normalize_before:
            x = norm(x, pad_mask)
        return x

    def _ffn(self, x):
        x = self.activation_fn(self.fc1(x))
        x = self.activation_dropout_module(x)
        return self.fc2(x)


class NormTransformerEncoderLayer(_ResidualNormMixin, TransformerEncoderLayerBase):
    """Encoder layer whose two norms receive the source padding mask."""

    def __init__(self, cfg, attn_norm, ffn_norm):
        super().__init__(cfg)
        self.self_attn_layer_norm = attn_norm
        self.final_layer_norm = ffn_norm
        if self.return_fc:
            raise NormConfigError("norm_transformer does not support return_fc")

    def forward(self, x, encoder_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor] = None):
        if attn_mask is not None:
            # as in fairseq: a finite large negative, so fully masked rows stay finite
            attn_mask = attn_mask.masked_fill(
                attn_mask.to(torch.bool), -1e8 if x.dtype == torch.float32 else -1e4
            )

        def self_attention(h):
            return self.self_attn(
                query=h, key=h, value=h, key_padding_mask=encoder_padding_mask,
                need_weights=False, attn_mask=attn_mask,
            )[0]

        x = self._residual_block(x, self.self_attn_layer_norm, encoder_padding_mask, self_attention)
        return self._residual_block(x, self.final_layer_norm, encoder_padding_mask, self._ffn)


class NormTransformerDecoderLayer(_ResidualNormMixin, TransformerDecoderLayerBase):
    """Decoder layer whose three norms receive the target padding mask."""

    def __init__(self, cfg, self_attn_norm, cross_attn_norm, ffn_norm, no_encoder_attn=False):
        super().__init__(cfg, no_encoder_attn=no_encoder_attn)
        unsupported = [
            name for name, on in (
                ("cross_self_attention", self.cross_self_attention),
                ("scale_heads", self.c_attn is not None),
                ("scale_attn", self.attn_ln is not None),
                ("scale_fc", self.ffn_layernorm is not None),
                ("scale_resids", self.w_resid is not None),
            ) if on
        ]
        if unsupported:
            raise NormConfigError(
                f"norm_transformer does not support --{unsupported[0].replace('_', '-')}; "
                "drop it or use the stock transformer"
            )
        self.self_attn_layer_norm = self_attn_norm
        self.encoder_attn_layer_norm = cross_attn_norm if self.encoder_attn is not None else None
        self.final_layer_norm = ffn_norm

    def forward(
        self,
        x,
        encoder_out: Optional[Tensor] = None,
        encoder_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        prev_self_attn_state: Optional[List[Tensor]] = None,
        prev_attn_state: Optional[List[Tensor]] = None,
        self_attn_mask: Optional[Tensor] = None,
        self_attn_padding_mask: Optional[Tensor] = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
    ):
        if prev_self_attn_state is not None or prev_attn_state is not None:
            raise NotImplementedError("norm_transformer does not take prev_*_attn_state")
        # Every decoder site normalises target positions: target mask throughout.
        tgt_mask = self_attn_padding_mask
        need_attn = need_attn or need_head_weights
        attn: Optional[Tensor] = None

        def self_attention(h):
            return self.self_attn(
                query=h, key=h, value=h, key_padding_mask=self_attn_padding_mask,
                incremental_state=incremental_state, need_weights=False,
                attn_mask=self_attn_mask,
            )[0]

        x = self._residual_block(x, self.self_attn_layer_norm, tgt_mask, self_attention)

        if self.encoder_attn is not None and encoder_out is not None:

            def cross_attention(h):
                nonlocal attn
                h, attn = self.encoder_attn(
                    query=h, key=encoder_out, value=encoder_out,
                    key_padding_mask=encoder_padding_mask,
                    incremental_state=incremental_state, static_kv=True,
                    need_weights=need_attn or (not self.training and self.need_attn),
                    need_head_weights=need_head_weights,
                )
                return h

            x = self._residual_block(x, self.encoder_attn_layer_norm, tgt_mask, cross_attention)

        x = self._residual_block(x, self.final_layer_norm, tgt_mask, self._ffn)
        return x, attn, None


class NormTransformerEncoder(TransformerEncoder):
    """Encoder whose final (Pre-Norm) norm also sees the source mask."""

    def __init__(self, args, dictionary, embed_tokens, plan: NormPlan):
        self.norm_plan = plan  # read by build_encoder_layer during super().__init__
        super().__init__(args, dictionary, embed_tokens)
        dim = embed_tokens.embedding_dim
        # fairseq built `layer_norm` for Pre-Norm; ours must get the mask, so it
        # lives under another name and fairseq's forward skips `layer_norm`.
        self.final_norm = plan.build("encoder", "final", dim) if self.layer_norm is not None else None
        self.layer_norm = None

    def build_encoder_layer(self, cfg):
        dim = cfg.encoder.embed_dim
        return NormTransformerEncoderLayer(
            cfg,
            attn_norm=self.norm_plan.build("encoder", "attn", dim),
            ffn_norm=self.norm_plan.build("encoder", "ffn", dim),
        )

    def forward(self, src_tokens, src_lengths: Optional[Tensor] = None,
                return_all_hiddens: bool = False, token_embeddings: Optional[Tensor] = None):
        out = super().forward(src_tokens, src_lengths, return_all_hiddens, token_embeddings)
        if self.final_norm is not None:
            pad_mask = out["encoder_padding_mask"][0] if out["encoder_padding_mask"] else None
            out["encoder_out"][0] = self.final_norm(out["encoder_out"][0], pad_mask)
        return out

    def upgrade_state_dict_named(self, state_dict, name):
        _rename_final_norm(state_dict, name)
        return super().upgrade_state_dict_named(state_dict, name)


class NormTransformerDecoder(TransformerDecoder):
    """Decoder whose final (Pre-Norm) norm also sees the target mask."""

    def __init__(self, args, dictionary, embed_tokens, plan: NormPlan, no_encoder_attn=False):
        self.norm_plan = plan
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        dim = self.embed_dim
        self.final_norm = plan.build("decoder", "final", dim) if self.layer_norm is not None else None
        self.layer_norm = None
        if self.final_norm is not None and self.project_out_dim is not None:
            raise NormConfigError(
                "norm_transformer: --decoder-output-dim must equal --decoder-embed-dim "
                "when the decoder has a final norm (Pre-Norm)"
            )

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        dim = cfg.decoder.embed_dim
        build = self.norm_plan.build
        return NormTransformerDecoderLayer(
            cfg,
            self_attn_norm=build("decoder", "self_attn", dim),
            cross_attn_norm=build("decoder", "cross_attn", dim),
            ffn_norm=build("decoder", "ffn", dim),
            no_encoder_attn=no_encoder_attn,
        )

    def extract_features(self, prev_output_tokens, encoder_out=None, incremental_state=None,
                         full_context_alignment=False, alignment_layer=None, alignment_heads=None):
        if incremental_state is not None and not self.training:
            self.check_incremental_decoding()
        x, extra = super().extract_features(
            prev_output_tokens, encoder_out, incremental_state,
            full_context_alignment, alignment_layer, alignment_heads,
        )
        if self.final_norm is not None:
            tokens = prev_output_tokens[:, -1:] if incremental_state is not None else prev_output_tokens
            pad_mask = tokens.eq(self.padding_idx)
            # x is B×T×C here; norms take T×B×C
            x = self.final_norm(x.transpose(0, 1), pad_mask if pad_mask.any() else None).transpose(0, 1)
        return x, extra

    def check_incremental_decoding(self):
        """Refuse norms that need the whole test batch when decoding token by token."""
        for name, module in self.named_modules():
            if isinstance(module, BatchStatNorm) and module.uses_batch_stats_in_eval:
                raise NormConfigError(
                    f"decoder norm {name!r} ({module.norm_name}) normalises with test-batch "
                    "statistics, which incremental decoding (one token at a time) cannot "
                    "provide; use --bn-test-stats population, or keep batch norms out of "
                    "the decoder"
                )

    def upgrade_state_dict_named(self, state_dict, name):
        _rename_final_norm(state_dict, name)
        return super().upgrade_state_dict_named(state_dict, name)


def _rename_final_norm(state_dict, name):
    """Stock Pre-Norm checkpoints call the final norm `layer_norm`."""
    for key in [k for k in state_dict if k.startswith(f"{name}.layer_norm.")]:
        state_dict[f"{name}.final_norm." + key[len(f"{name}.layer_norm."):]] = state_dict.pop(key)


@register_model("norm_transformer")
class NormTransformerModel(TransformerModel):
    """Transformer whose every norm site comes from the normplug registry."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_norm_args(parser)

    @classmethod
    def build_model(cls, args, task):
        # The plan is made and checked here, from the full argument namespace;
        # fairseq hands the encoder/decoder builders a TransformerConfig that
        # has no room for plugin options.
        # Under fairseq-train: refuse a damaged checkpoint to resume from (and
        # --bf16 without torch_xla) before the trainer exists, on every worker.
        check_training_run(args)
        try:
            plan = NormPlan.from_args(args)
            _check_rbn_criterion(args, plan)
            cls._plan_in_construction = plan
            return super().build_model(args, task)
        except NormConfigError as err:
            # a user's flag combination: a one-line message, not a traceback
            raise SystemExit(f"normplug: error: {err}")
        finally:
            cls._plan_in_construction = None

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return NormTransformerEncoder(args, src_dict, embed_tokens, cls._current_plan())

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return NormTransformerDecoder(
            args, tgt_dict, embed_tokens, cls._current_plan(),
            no_encoder_attn=getattr(args, "no_cross_attention", False),
        )

    _plan_in_construction: Optional[NormPlan] = None

    @classmethod
    def _current_plan(cls) -> NormPlan:
        if cls._plan_in_construction is None:
            raise RuntimeError("build NormTransformerModel through build_model(args, task)")
        return cls._plan_in_construction

    def prepare_for_inference_(self, cfg):
        # fairseq-generate/-interactive decode incrementally: refuse up front,
        # before any output is written.
        try:
            self.decoder.check_incremental_decoding()
        except NormConfigError as err:
            raise SystemExit(f"normplug: error: {err}")
        super().prepare_for_inference_(cfg)

    # -- the interface the criterion reads -----------------------------------

    def batch_stat_norms(self) -> Dict[str, BatchStatNorm]:
        """Every norm with batch statistics, by a short site name (e.g. ``enc0.attn``).

        The criterion asks on every step; the sites are fixed once the model is
        built, so the module walk is done once (rebuilt if a site was replaced)."""
        cached = self.__dict__.get("_batch_stat_norms")
        if cached is None or any(self.get_submodule(path) is not m for path, m in cached[1]):
            found = [(name, m) for name, m in self.named_modules() if isinstance(m, BatchStatNorm)]
            cached = ({site_name(name): m for name, m in found}, found)
            self.__dict__["_batch_stat_norms"] = cached
        return cached[0]

    def norm_discrepancies(self) -> Dict[str, Discrepancy]:
        """Terms of the last training forward of each batch-statistics norm."""
        out = {}
        for name, module in self.batch_stat_norms().items():
            d = module.discrepancy()
            if d is not None:
                out[name] = d
        return out


def _check_rbn_criterion(args, plan: NormPlan):
    """RBN weights on a model without BN would train plain LN: refuse before training.

    The criterion checks this too, at its first step, for models that are not ours."""
    from ..criterions.label_smoothed_cross_entropy_rbn import no_batch_norm_message

    if getattr(args, "criterion", None) != "label_smoothed_cross_entropy_rbn":
        return
    weights = (getattr(args, "rbn_mean_weight", 0) or 0, getattr(args, "rbn_var_weight", 0) or 0)
    built = {key: name for key, name in plan.sites.items()  # final norms exist in Pre-Norm only
             if key[1] != "final" or getattr(args, f"{key[0]}_normalize_before", False)}
    if any(w > 0 for w in weights) and "batch" not in built.values():
        found = ", ".join(f"{stack} {site} ({name})" for (stack, site), name in built.items()
                          if name == "power") or "none"
        raise SystemExit(no_batch_norm_message(*weights, found))


_SITE_SHORT = {
    "self_attn_layer_norm": "attn",
    "encoder_attn_layer_norm": "cross",
    "final_layer_norm": "ffn",
    "final_norm": "final",
}


def site_name(module_name: str) -> str:
    """``encoder.layers.3.final_layer_norm`` -> ``enc3.ffn``; ``decoder.final_norm`` -> ``dec.final``."""
    parts = module_name.split(".")
    stack = {"encoder": "enc", "decoder": "dec"}.get(parts[0], parts[0])
    if len(parts) == 4 and parts[1] == "layers":
        return f"{stack}{parts[2]}.{_SITE_SHORT.get(parts[3], parts[3])}"
    return f"{stack}." + ".".join(_SITE_SHORT.get(p, p) for p in parts[1:])
