"""``label_smoothed_cross_entropy_rbn``: label smoothing plus the Regularized-BN
penalty of Wang, Wu & Huang (NeurIPS 2022), with TID monitoring.

The penalty ``λ_μ Σ_layers Σ_c (μ̂−μ_B)² + λ_σ Σ_layers Σ_c |σ̂²−σ²_B|`` is added
to the token-summed label-smoothed loss before fairseq divides by the number of
target tokens, so its effective weight is λ / ntokens: that is how the
published coefficients (IWSLT14 Post-Norm λ_μ=60, λ_σ=0; Pre-Norm λ_μ=0.1,
λ_σ=0.01) were used, and they only transfer with that scaling (SPEC §2).

The criterion reads the model through one method, ``norm_discrepancies()``
(name -> :class:`normplug.norms.Discrepancy` of the last training forward);
a model without it has no batch-statistics norms.
"""
import math
from dataclasses import dataclass, field
from typing import Dict

import torch

from fairseq import metrics
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)

TERMS = ("rbn_mean", "rbn_var", "tid_mean", "tid_var")


@dataclass
class LabelSmoothedCrossEntropyRBNConfig(LabelSmoothedCrossEntropyCriterionConfig):
    rbn_mean_weight: float = field(
        default=0.0,
        metadata={"help": "λ_μ: weight of Σ_c (μ̂−μ_B)² per BN layer, against the "
                  "token-summed loss (published: 60 Post-Norm, 0.1 Pre-Norm)"},
    )
    rbn_var_weight: float = field(
        default=0.0,
        metadata={"help": "λ_σ: weight of Σ_c |σ̂²−σ²_B| per BN layer, against the "
                  "token-summed loss (published: 0 Post-Norm, 0.01 Pre-Norm)"},
    )


def _discrepancies(model) -> Dict[str, object]:
    read = getattr(model, "norm_discrepancies", None)
    return read() if read is not None else {}


def _layer_names(model):
    names = getattr(model, "batch_stat_norms", None)
    return {} if names is None else names()


def no_batch_norm_message(mean_weight, var_weight, found) -> str:
    return (
        f"normplug: error: --rbn-mean-weight {mean_weight:g} / --rbn-var-weight {var_weight:g} "
        f"need batch-norm layers, but the model has no 'batch' norm (batch-statistics norms: "
        f"{found}); use a *_bn / *_rbn architecture or --encoder-norm batch, or set both "
        "weights to 0"
    )


@register_criterion("label_smoothed_cross_entropy_rbn", dataclass=LabelSmoothedCrossEntropyRBNConfig)
class LabelSmoothedCrossEntropyRBNCriterion(LabelSmoothedCrossEntropyCriterion):
    """Label-smoothed cross entropy + RBN penalty; logs task loss, penalty and TID apart."""

    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0,
                 report_accuracy=False, rbn_mean_weight=0.0, rbn_var_weight=0.0):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        for flag, value in (("--rbn-mean-weight", rbn_mean_weight), ("--rbn-var-weight", rbn_var_weight)):
            if not (value >= 0 and math.isfinite(value)):
                raise SystemExit(f"normplug: error: {flag} must be a finite number >= 0, got {value}")
        self.rbn_mean_weight = float(rbn_mean_weight)
        self.rbn_var_weight = float(rbn_var_weight)
        self._model_checked = False

    def _check_model(self, model):
        """Non-zero weights on a model without BN would silently train plain LN."""
        if self._model_checked:
            return
        self._model_checked = True
        if self.rbn_mean_weight == 0 and self.rbn_var_weight == 0:
            return
        layers = _layer_names(model)
        if not any(getattr(m, "supports_rbn", False) for m in layers.values()):
            found = ", ".join(f"{k} ({m.norm_name})" for k, m in layers.items()) or "none"
            raise SystemExit(no_batch_norm_message(self.rbn_mean_weight, self.rbn_var_weight, found))

    def forward(self, model, sample, reduce=True):
        self._check_model(model)
        loss, sample_size, logging_output = super().forward(model, sample, reduce=reduce)
        terms = _discrepancies(model) if model.training else {}
        logging_output["task_loss"] = loss.data

        zero = loss.new_zeros(())
        totals = {t: zero for t in TERMS}
        layers = _layer_names(model)
        # The same keys in the same order on every step and worker: fairseq's fast
        # stat sync all-reduces the values of all keys as one flat buffer.
        for name, layer in layers.items():
            d = terms.get(name)
            logging_output[f"tid_mean/{name}"] = zero if d is None else d.tid_mean.detach()
            logging_output[f"tid_var/{name}"] = zero if d is None else d.tid_var.detach()
            if d is None:
                continue
            totals["tid_mean"] = totals["tid_mean"] + d.tid_mean
            totals["tid_var"] = totals["tid_var"] + d.tid_var
            if getattr(layer, "supports_rbn", False):  # the penalty sums BN layers only
                totals["rbn_mean"] = totals["rbn_mean"] + d.rbn_mean
                totals["rbn_var"] = totals["rbn_var"] + d.rbn_var

        penalty = zero
        if self.rbn_mean_weight:
            penalty = penalty + self.rbn_mean_weight * totals["rbn_mean"]
        if self.rbn_var_weight:
            penalty = penalty + self.rbn_var_weight * totals["rbn_var"]
        if self.rbn_mean_weight or self.rbn_var_weight:
            loss = loss + penalty
        n_layers = max(len(terms), 1)
        logging_output.update(
            loss=loss.data,
            rbn_penalty=penalty.detach(),
            rbn_mean=totals["rbn_mean"].detach(),
            rbn_var=totals["rbn_var"].detach(),
            tid_mean=totals["tid_mean"].detach() / n_layers,
            tid_var=totals["tid_var"].detach() / n_layers,
            # forwards that measured the norms: TIDs are averaged over these
            rbn_forwards=1 if terms else 0,
        )
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)

        def total(key):
            return sum(log.get(key, 0) for log in logging_outputs)

        sample_size = total("sample_size")
        if sample_size > 0:
            metrics.log_scalar("task_loss", total("task_loss") / sample_size / math.log(2),
                               sample_size, round=3)
            metrics.log_scalar("rbn_penalty", total("rbn_penalty") / sample_size / math.log(2),
                               sample_size, round=4)
        forwards = int(total("rbn_forwards"))
        if forwards == 0:  # validation, or a model without batch-statistics norms
            return
        for key in TERMS:
            metrics.log_scalar(key, total(key) / forwards, forwards, round=4)
        per_layer = sorted(k for k in logging_outputs[0] if k.startswith(("tid_mean/", "tid_var/")))
        if per_layer:
            # one host transfer for all layers, not one per layer
            values = torch.stack([torch.as_tensor(total(k), dtype=torch.float32) for k in per_layer])
            for key, value in zip(per_layer, (values / forwards).tolist()):
                metrics.log_scalar(key, value, forwards, round=4)
