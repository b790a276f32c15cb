"""The ``norm_transformer`` (translation) and ``norm_transformer_lm`` (language model) models
and their named architectures."""
from . import norm_transformer, norm_transformer_lm, architectures, architectures_lm  # noqa: F401
