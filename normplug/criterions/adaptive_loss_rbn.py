"""``adaptive_loss_rbn``: fairseq's ``adaptive_loss`` (the loss of an adaptive-softmax language
model, e.g. WikiText-103) plus the Regularized-BN penalty of Wang, Wu & Huang (NeurIPS 2022),
with training–inference discrepancy (TID) logging (normplug/rbn.py). At zero weights it is
``adaptive_loss``, bit for bit."""
from dataclasses import dataclass

from fairseq.criterions import register_criterion
from fairseq.criterions.adaptive_loss import AdaptiveLoss, AdaptiveLossConfig

from ..errors import NormplugError
from ..rbn import RBNPenalty, RBNWeights, has_adaptive_softmax


@dataclass
class AdaptiveLossRBNConfig(AdaptiveLossConfig, RBNWeights):
    pass


@register_criterion("adaptive_loss_rbn", dataclass=AdaptiveLossRBNConfig)
class AdaptiveLossRBN(RBNPenalty, AdaptiveLoss):
    """Adaptive-softmax loss + RBN penalty; logs task loss, penalty and TID apart."""

    @classmethod
    def build_criterion(cls, cfg: AdaptiveLossRBNConfig, task):
        criterion = super().build_criterion(cfg, task)  # fairseq's DDP check; it passes sentence_avg only
        criterion.init_rbn(cfg.rbn_mean_weight, cfg.rbn_var_weight)
        return criterion

    @classmethod
    def check_model(cls, cfg, model):
        # fairseq's adaptive_loss only asserts this, in the middle of the first step
        if not has_adaptive_softmax(model):
            raise NormplugError(
                "--criterion adaptive_loss_rbn needs a model with an adaptive softmax "
                "(--adaptive-softmax-cutoff); use --criterion cross_entropy_rbn for a full softmax")
        super().check_model(cfg, model)
