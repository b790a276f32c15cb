"""Regularized BN (Wang, Wu & Huang, NeurIPS 2022): the penalty on the gap between batch and
population statistics, and the training–inference discrepancy (TID) logged beside it.

What every RBN criterion shares, written once: the weights, the refusal of weights on a
model without BN, the penalty, and the logging keys. The model is read through one method,
``batch_stat_norms()`` (site name -> norm with batch statistics); each norm reports the
:class:`~normplug.norms.Discrepancy` of its last training forward.

    L_RBN = λ_μ Σ_layers Σ_c (μ̂_c − μ_B,c)² + λ_σ Σ_layers Σ_c |σ̂²_c − σ²_B,c|

summed over the BN layers only (PowerNorm layers are in the TID logs, not the penalty), and
added to the criterion's token-summed loss before fairseq divides by the sample size: its
effective weight is λ / sample size, which the published coefficients assume.
"""
import math
from dataclasses import dataclass, field

import torch

from .errors import NormplugError

TERMS = ("rbn_mean", "rbn_var", "tid_mean", "tid_var")


@dataclass
class RBNWeights:
    """The two weights, as fields of every RBN criterion's config."""

    rbn_mean_weight: float = field(default=0.0, metadata={
        "help": "λ_μ: weight of Σ_c (μ̂−μ_B)² per BN layer against the token-summed loss "
                "(published for IWSLT14: 60 Post-Norm, 0.1 Pre-Norm)"})
    rbn_var_weight: float = field(default=0.0, metadata={
        "help": "λ_σ: weight of Σ_c |σ̂²−σ²_B| per BN layer against the token-summed loss "
                "(published for IWSLT14: 0 Post-Norm, 0.01 Pre-Norm)"})


def batch_stat_norms(model):
    """Site name -> norm with batch statistics, or {} for a model that has none."""
    get = getattr(model, "batch_stat_norms", None)
    return {} if get is None else get()


def has_adaptive_softmax(model) -> bool:
    """Whether the model's output is an adaptive softmax (adaptive_loss_rbn's) or a full one
    (cross_entropy_rbn's, label_smoothed_cross_entropy_rbn's)."""
    return getattr(getattr(model, "decoder", None), "adaptive_softmax", None) is not None


def check_weights(mean_weight, var_weight, model=None):
    """Raise NormplugError for a weight that is not a finite number >= 0, or for non-zero
    weights on a model without BN (it would silently train without the penalty)."""
    for flag, value in (("--rbn-mean-weight", mean_weight), ("--rbn-var-weight", var_weight)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise NormplugError(f"{flag} must be a finite number >= 0, got {value}")
    if model is None or not (mean_weight or var_weight):
        return
    norms = batch_stat_norms(model)
    if not any(m.supports_rbn for m in norms.values()):
        found = ", ".join(f"{k} ({m.norm_name})" for k, m in norms.items()) or "none"
        raise NormplugError(
            f"--rbn-mean-weight {mean_weight:g} / --rbn-var-weight {var_weight:g} need batch-norm "
            f"layers, but the model has no 'batch' norm (batch-statistics norms: {found}); use a "
            "*_bn / *_rbn architecture or a 'batch' site (e.g. --decoder-ffn-norm batch), or set "
            "both weights to 0")


class RBNPenalty:
    """Mixin for a fairseq criterion: adds the penalty to the loss of ``super().forward`` and
    logs task loss, penalty and TID apart, with the same keys on every step and worker."""

    def init_rbn(self, rbn_mean_weight, rbn_var_weight):
        check_weights(rbn_mean_weight, rbn_var_weight)
        self.rbn_mean_weight, self.rbn_var_weight = float(rbn_mean_weight), float(rbn_var_weight)
        self._model_checked = False

    @classmethod
    def check_model(cls, cfg, model):
        """Raise NormplugError for a model this criterion cannot train with the options in
        ``cfg`` (the criterion itself, or the Namespace normplug's models are built from)."""
        check_weights(getattr(cfg, "rbn_mean_weight", 0), getattr(cfg, "rbn_var_weight", 0), model)

    def forward(self, model, sample, reduce=True):
        if not self._model_checked:  # normplug's models are also checked when built
            self.check_model(self, model)  # before any autograd: a clear error, not a traceback
            self._model_checked = True
        loss, sample_size, logging_output = super().forward(model, sample, reduce=reduce)
        norms = batch_stat_norms(model)
        found = {name: norm.discrepancy() for name, norm in norms.items()} if model.training else {}
        found = {name: d for name, d in found.items() if d is not None}
        zero = loss.new_zeros(())
        totals = dict.fromkeys(TERMS, zero)
        # The same keys on every step and worker: fairseq's fast stat sync all-reduces the
        # values of all keys as one flat buffer. A norm without a mean statistic (PowerNorm)
        # has no mean TID: no key, and no zero diluting the average.
        with_mean = {name for name, norm in norms.items() if norm.population_statistics()[0] is not None}
        measured_means = 0
        for name, norm in norms.items():
            d = found.get(name)
            if name in with_mean:
                logging_output[f"tid_mean/{name}"] = zero if d is None else d.tid_mean.detach()
            logging_output[f"tid_var/{name}"] = zero if d is None else d.tid_var.detach()
            if d is None:
                continue
            if name in with_mean:
                totals["tid_mean"] = totals["tid_mean"] + d.tid_mean.detach()
                measured_means += 1
            totals["tid_var"] = totals["tid_var"] + d.tid_var.detach()
            if norm.supports_rbn:  # the penalty sums the BN layers only
                totals["rbn_mean"] = totals["rbn_mean"] + d.rbn_mean
                totals["rbn_var"] = totals["rbn_var"] + d.rbn_var
        penalty = zero  # zero weights add nothing, not even a zero gradient
        if self.rbn_mean_weight:
            penalty = penalty + self.rbn_mean_weight * totals["rbn_mean"]
        if self.rbn_var_weight:
            penalty = penalty + self.rbn_var_weight * totals["rbn_var"]
        logging_output.update(
            task_loss=loss.data,
            loss=(loss + penalty).data,
            rbn_penalty=penalty.detach(),
            rbn_mean=totals["rbn_mean"].detach(),
            rbn_var=totals["rbn_var"].detach(),
            tid_var=totals["tid_var"] / max(len(found), 1),
            rbn_forwards=1 if found else 0,  # forwards that measured the norms: TIDs average over these
        )
        if with_mean:
            logging_output["tid_mean"] = totals["tid_mean"] / max(measured_means, 1)
        return loss + penalty, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        from fairseq import metrics

        def total(key):
            return sum(log.get(key, 0) for log in logging_outputs)

        sample_size = total("sample_size")
        if sample_size > 0:
            for key in ("task_loss", "rbn_penalty"):
                metrics.log_scalar(key, total(key) / sample_size / math.log(2), sample_size, round=4)
        forwards = int(total("rbn_forwards"))
        if forwards == 0:  # validation, or a model without batch-statistics norms
            return
        keys = [k for k in TERMS if k in logging_outputs[0]] + sorted(
            k for k in logging_outputs[0] if k.startswith(("tid_mean/", "tid_var/")))
        # one host transfer for every value, not one per layer
        values = torch.stack([torch.as_tensor(total(k), dtype=torch.float32) for k in keys]) / forwards
        for key, value in zip(keys, values.tolist()):
            metrics.log_scalar(key, value, forwards, round=4)
