"""Loading fairseq checkpoints under torch >= 2.6, where ``torch.load`` defaults to
``weights_only=True``.

fairseq 0.12 calls ``torch.load`` without ``weights_only``, so ``fairseq-generate``,
``fairseq-interactive`` and resuming ``fairseq-train`` fail on every checkpoint. Rather
than turning the check off, the one non-tensor type that fairseq translation
checkpoints pickle (``argparse.Namespace``, in which legacy models keep their
arguments) is allow-listed, and the omegaconf containers of the state that fairseq broadcasts from rank 0
when a run of several processes resumes; tests re-derive both sets from fresh checkpoints.
"""
import argparse
import collections
import typing

import torch

SAFE_GLOBALS = [argparse.Namespace]


def broadcast_globals() -> list:
    """A run over several processes that resumes: rank 0 loads the checkpoint (its cfg made an omegaconf
    DictConfig) and fairseq's broadcast_object pickles that state to the other ranks, which torch.load it
    weights-only, its tensors sent apart (placeholders in their stead). Without fairseq nothing is broadcast."""
    try:
        from fairseq.distributed.utils import _TensorPlaceholder
        from omegaconf import DictConfig, ListConfig
        from omegaconf.base import ContainerMetadata, Metadata
        from omegaconf.nodes import AnyNode
    except ImportError:
        return []
    return [DictConfig, ListConfig, ContainerMetadata, Metadata, AnyNode, typing.Any, dict, list, int,
            collections.defaultdict, _TensorPlaceholder]


def allow_fairseq_checkpoints() -> None:
    """Allow-list the types fairseq checkpoints pickle (idempotent)."""
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is not None:  # torch < 2.4 has no weights-only default to satisfy
        add(SAFE_GLOBALS + broadcast_globals())
