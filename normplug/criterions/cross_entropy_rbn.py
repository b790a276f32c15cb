"""``cross_entropy_rbn``: fairseq's ``cross_entropy`` (the language model's loss) plus the
Regularized-BN penalty of Wang, Wu & Huang (NeurIPS 2022), with training–inference
discrepancy (TID) logging (normplug/rbn.py). At zero weights it is ``cross_entropy``, bit for bit."""
from dataclasses import dataclass

from fairseq.criterions import register_criterion
from fairseq.criterions.cross_entropy import CrossEntropyCriterion, CrossEntropyCriterionConfig

from ..errors import NormplugError
from ..rbn import RBNPenalty, RBNWeights, has_adaptive_softmax


@dataclass
class CrossEntropyRBNConfig(CrossEntropyCriterionConfig, RBNWeights):
    pass


@register_criterion("cross_entropy_rbn", dataclass=CrossEntropyRBNConfig)
class CrossEntropyRBNCriterion(RBNPenalty, CrossEntropyCriterion):
    """Cross entropy + RBN penalty; logs task loss, penalty and TID apart."""

    def __init__(self, task, sentence_avg, rbn_mean_weight=0.0, rbn_var_weight=0.0):
        super().__init__(task, sentence_avg)
        self.init_rbn(rbn_mean_weight, rbn_var_weight)

    @classmethod
    def check_model(cls, cfg, model):
        # fairseq's cross_entropy would take an adaptive softmax's head output for the full
        # softmax and fail in autograd
        if has_adaptive_softmax(model):
            raise NormplugError(
                "--criterion cross_entropy_rbn needs a full softmax, but the model has an adaptive "
                "softmax (--adaptive-softmax-cutoff); use --criterion adaptive_loss_rbn")
        super().check_model(cfg, model)
