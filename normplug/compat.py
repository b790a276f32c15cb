"""Loading fairseq checkpoints under torch >= 2.6, where ``torch.load`` defaults
to ``weights_only=True``.

fairseq 0.12 calls ``torch.load(f, map_location=cpu)`` without ``weights_only``,
so ``fairseq-generate``, ``fairseq-interactive`` and resuming ``fairseq-train``
fail on every checkpoint. Rather than turning the safety check off globally,
we allow-list the exact non-tensor types that a fairseq translation checkpoint
pickles. ``torch.serialization.get_unsafe_globals_in_checkpoint`` on checkpoints
written by ``fairseq-train`` (stock and every normplug architecture, with the
RBN criterion) lists exactly one: ``argparse.Namespace``, in which legacy
models keep their arguments (``cfg.model``). tests/test_compat.py re-checks
this on fresh checkpoints, so a new type shows up as a failing test rather
than as a load error in a user's hands.
"""
import argparse

import torch

SAFE_GLOBALS = [argparse.Namespace]


def allow_fairseq_checkpoints() -> None:
    """Allow-list the types fairseq checkpoints pickle (idempotent)."""
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is not None:  # torch < 2.4 has no weights-only default to satisfy
        add(SAFE_GLOBALS)
