"""What the translation model (``norm_transformer``) and the language model
(``norm_transformer_lm``) share: the build-time checks and their one-line errors,
``--compile-norms``, the refusal of test-batch statistics at inference, and the
site names of the norms with batch statistics that criteria and tools read."""
from typing import Dict

from fairseq.criterions import CRITERION_REGISTRY

from ..norms import BatchStatNorm, NormConfigError
from .norm_plan import NormPlan


class NormModel:
    """Mixin for a fairseq model whose norms come from the normplug registry; put it
    before the fairseq model class. A model class replaces :meth:`build_modules` when
    fairseq's own ``build_model`` cannot build its norms."""

    @classmethod
    def build_model(cls, args, task):
        try:
            NormPlan.from_config(args)  # every norm flag checked before anything is built
            model = cls.build_modules(args, task)
            # The criterion's own check of the model (RBN weights without BN, ...) runs here:
            # fairseq builds the model and the criterion before it starts its data threads,
            # and an exit in the middle of training can abort the interpreter (README, Limitations).
            check = getattr(CRITERION_REGISTRY.get(getattr(args, "criterion", None)), "check_model", None)
            if check is not None:
                check(args, model)
        except NormConfigError as err:  # a user's flag combination: one line, no traceback
            raise SystemExit(f"normplug: error: {err}")
        if getattr(args, "compile_norms", False):
            for norm in model.modules():
                if hasattr(norm, "norm_name"):
                    norm.compile()  # in place: parameter and buffer names stay as they are
        return model

    @classmethod
    def build_modules(cls, args, task):
        """The fairseq model class's own build."""
        return super().build_model(args, task)

    def prepare_for_inference_(self, cfg):
        # fairseq-generate, -interactive and -eval-lm call this before any output
        try:
            self.decoder.check_incremental_decoding()
        except NormConfigError as err:
            raise SystemExit(f"normplug: error: {err}")
        super().prepare_for_inference_(cfg)

    def batch_stat_norms(self) -> Dict[str, BatchStatNorm]:
        """Every norm with batch statistics, by a short site name (``enc0.attn``)."""
        return {site_name(name): m for name, m in self.named_modules() if isinstance(m, BatchStatNorm)}


_SITE_SHORT = {"self_attn_layer_norm": "attn", "encoder_attn_layer_norm": "cross",
               "final_layer_norm": "ffn", "final_norm": "final"}


def site_name(module_name: str) -> str:
    """``encoder.layers.3.final_layer_norm`` -> ``enc3.ffn``; ``decoder.final_norm`` -> ``dec.final``."""
    parts = module_name.split(".")
    stack = {"encoder": "enc", "decoder": "dec"}.get(parts[0], parts[0])
    if len(parts) == 4 and parts[1] == "layers":
        return f"{stack}{parts[2]}.{_SITE_SHORT.get(parts[3], parts[3])}"
    return f"{stack}." + ".".join(_SITE_SHORT.get(p, p) for p in parts[1:])
