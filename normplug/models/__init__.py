"""The ``norm_transformer`` model and its named architectures."""
from . import norm_transformer, architectures  # noqa: F401
