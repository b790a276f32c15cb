"""Loading fairseq checkpoints under torch >= 2.6, where ``torch.load`` defaults to
``weights_only=True``.

fairseq 0.12 calls ``torch.load`` without ``weights_only``, so ``fairseq-generate``,
``fairseq-interactive`` and resuming ``fairseq-train`` fail on every checkpoint. Rather
than turning the check off, the one non-tensor type that fairseq translation
checkpoints pickle (``argparse.Namespace``, in which legacy models keep their
arguments) is allow-listed; tests re-derive that set from fresh checkpoints.
"""
import argparse

import torch

SAFE_GLOBALS = [argparse.Namespace]


def allow_fairseq_checkpoints() -> None:
    """Allow-list the types fairseq checkpoints pickle (idempotent)."""
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is not None:  # torch < 2.4 has no weights-only default to satisfy
        add(SAFE_GLOBALS)
