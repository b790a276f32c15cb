"""What the translation model (``norm_transformer``) and the language model
(``norm_transformer_lm``) share: the build-time checks,
``--compile-norms``, the refusal of test-batch statistics at inference, and the
site names of the norms with batch statistics that criteria and tools read.

A bad option raises :class:`~normplug.errors.NormplugError`: fairseq's CLIs end with its
traceback, whose last line is the message; the hub interface and a notebook can catch it."""
from typing import Dict

from fairseq.criterions import CRITERION_REGISTRY

from ..norms import BatchStatNorm
from .norm_plan import NormPlan, site_name


class NormModel:
    """Mixin for a fairseq model whose norms come from the normplug registry; put it
    before the fairseq model class. A model class replaces :meth:`build_modules` when
    fairseq's own ``build_model`` cannot build its norms."""

    @classmethod
    def build_model(cls, args, task):
        NormPlan.from_config(args)  # every norm flag checked before anything is built
        model = cls.build_modules(args, task)
        # The criterion's own check of the model (RBN weights without BN, ...) runs here:
        # fairseq builds the model and the criterion before it starts its data threads,
        # and an error in the middle of training can abort the interpreter (README, Limitations).
        check = getattr(CRITERION_REGISTRY.get(getattr(args, "criterion", None)), "check_model", None)
        if check is not None:
            check(args, model)
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
        self.decoder.check_incremental_decoding()
        super().prepare_for_inference_(cfg)

    def batch_stat_norms(self) -> Dict[str, BatchStatNorm]:
        """Every norm with batch statistics, by its logged site name (``enc0.self_attn``)."""
        return {site_name(name): m for name, m in self.named_modules() if isinstance(m, BatchStatNorm)}

