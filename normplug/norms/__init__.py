"""Normalization layers by name: ``create_norm("batch", 512, momentum=0.05)``."""
from .base import BatchStatNorm, Discrepancy
from .registry import NormConfigError, create_norm, norm_class, norm_names, norm_options, register_norm
from . import per_token, batch, power  # noqa: F401,E402  (register the norms)

__all__ = ["BatchStatNorm", "Discrepancy", "NormConfigError", "create_norm", "norm_class",
           "norm_names", "norm_options", "register_norm"]
