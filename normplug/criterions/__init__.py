"""Criterions of normplug (fairseq does not auto-import a user dir's criterions)."""
from . import adaptive_loss_rbn, cross_entropy_rbn, label_smoothed_cross_entropy_rbn  # noqa: F401
