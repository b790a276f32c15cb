"""Criterions of normplug (fairseq does not auto-import a user dir's criterions)."""
from . import label_smoothed_cross_entropy_rbn  # noqa: F401
