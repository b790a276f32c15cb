"""One registry of normalization layers by name.

Every norm is an ``nn.Module`` built as ``cls(dim, **options)`` and called as
``norm(x, pad_mask=None)`` with ``x`` of shape T×B×C and ``pad_mask`` a B×T
boolean tensor, True at padding (fairseq's convention). Norms know nothing of
fairseq.
"""
import inspect
import math
from typing import Dict, Iterable, Type

import torch.nn as nn

from ..errors import NormplugError


class NormConfigError(NormplugError):
    """A norm name or option that does not exist or has an invalid value."""


_NORMS: Dict[str, Type[nn.Module]] = {}


def register_norm(name: str):
    """Class decorator: make ``cls`` available as ``create_norm(name, ...)``."""

    def wrap(cls):
        if name in _NORMS:
            raise NormConfigError(f"norm {name!r} is registered twice")
        cls.norm_name = name
        _NORMS[name] = cls
        return cls

    return wrap


def norm_names() -> Iterable[str]:
    """Names of every registered norm, sorted."""
    return sorted(_NORMS)


def norm_class(name: str) -> Type[nn.Module]:
    if name not in _NORMS:
        raise NormConfigError(f"unknown norm {name!r}; valid choices: {', '.join(norm_names())}")
    return _NORMS[name]


def norm_options(name: str) -> Dict[str, object]:
    """The options norm ``name`` accepts, with their defaults."""
    params = inspect.signature(norm_class(name).__init__).parameters
    return {p.name: p.default for p in params.values()
            if p.name not in ("self", "dim") and p.kind is not p.VAR_KEYWORD}


def create_norm(name: str, dim: int, **options) -> nn.Module:
    """Build norm ``name`` over ``dim`` channels; unknown options are an error."""
    valid = norm_options(name)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise NormConfigError(
            f"norm {name!r} has no option {', '.join(map(repr, unknown))}; "
            f"valid options: {', '.join(valid) or '(none)'}"
        )
    if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
        raise NormConfigError(f"norm {name!r}: dim must be a positive int, got {dim!r}")
    return _NORMS[name](dim, **options)


def check_option(norm: str, option: str, value, valid: str, ok) -> None:
    """Raise NormConfigError naming ``value`` and the ``valid`` range unless ``ok(value)``."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and ok(value)):
        raise NormConfigError(f"norm {norm!r}: {option} must be {valid}, got {value!r}")


def check_choice(norm: str, option: str, value, choices) -> None:
    if not any(type(value) is type(c) and value == c for c in choices):  # 1 is not True here
        raise NormConfigError(f"norm {norm!r}: invalid {option}={value!r}; "
                              f"valid choices: {', '.join(map(str, choices))}")
