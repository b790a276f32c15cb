"""What the translation model (``norm_transformer``) and the language model
(``norm_transformer_lm``) share: the build-time checks (the options, the launch: normplug/launchers.py),
``--compile-norms``, the refusal of test-batch statistics at inference, and the
site names of the norms with batch statistics that criteria and tools read.

A bad option raises :class:`~normplug.errors.NormplugError`: fairseq's CLIs end with its
traceback, whose last line is the message; the hub interface and a notebook can catch it."""
from typing import Dict

from fairseq.criterions import CRITERION_REGISTRY

from ..norms import BatchStatNorm
from ..launchers import check_launch
from .config import given_options, run_group
from .norm_plan import site_name
from .options import check_options


class NormModel:
    """Mixin for a fairseq model whose norms come from the normplug registry; put it
    before the fairseq model class, and name its option dataclass (options.py) ``options``. A
    model class replaces :meth:`build_modules` when fairseq's own ``build_model`` cannot build
    its norms."""

    options = None

    @classmethod
    def build_model(cls, cfg, task):
        args = given_options(cfg)  # the Namespace fairseq's model code reads, with our options
        _, lr_scheduler = run_group(cfg, "lr_scheduler")
        if args is not cfg and getattr(lr_scheduler, "warmup_updates", None) is not None:
            args.warmup_updates = lr_scheduler.warmup_updates  # PowerNorm's default warm-up
        check_options(args, cls.options)  # every option checked before anything is built
        check_launch(bool(getattr(args, "bn_sync_stats", False)))
        model = cls.build_modules(args, task)
        # The criterion's own check of the model (RBN weights without BN, ...) runs here:
        # fairseq builds the model and the criterion before it starts its data threads,
        # and an error in the middle of training can abort the interpreter (README, Limitations).
        criterion, criterion_cfg = run_group(cfg, "criterion")
        check = getattr(CRITERION_REGISTRY.get(criterion), "check_model", None)
        if check is not None:
            check(criterion_cfg, model)
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

