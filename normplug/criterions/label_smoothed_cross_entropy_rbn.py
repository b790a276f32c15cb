"""``label_smoothed_cross_entropy_rbn``: label smoothing plus the Regularized-BN penalty of
Wang, Wu & Huang (NeurIPS 2022), with training–inference discrepancy (TID) logging
(normplug/rbn.py). At zero weights it is ``label_smoothed_cross_entropy``, bit for bit."""
from dataclasses import dataclass

from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)

from ..rbn import RBNPenalty, RBNWeights


@dataclass
class LabelSmoothedCrossEntropyRBNConfig(LabelSmoothedCrossEntropyCriterionConfig, RBNWeights):
    pass


@register_criterion("label_smoothed_cross_entropy_rbn", dataclass=LabelSmoothedCrossEntropyRBNConfig)
class LabelSmoothedCrossEntropyRBNCriterion(RBNPenalty, LabelSmoothedCrossEntropyCriterion):
    """Label-smoothed cross entropy + RBN penalty; logs task loss, penalty and TID apart."""

    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0,
                 report_accuracy=False, rbn_mean_weight=0.0, rbn_var_weight=0.0):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        self.init_rbn(rbn_mean_weight, rbn_var_weight)
