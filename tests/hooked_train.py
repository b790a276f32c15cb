"""Test-only entry point: ``fairseq-train`` with three optional hooks, set by environment.

Usage: ``python tests/hooked_train.py <fairseq-train arguments>``.

* ``HOOK_DUMP_DIR``: after every checkpoint save (fairseq calls ``save_checkpoint``
  on every rank, but writes files on rank 0 only), each rank writes its model's
  state dict to ``rank{R}_update{N}.pt`` there, so tests can compare the
  parameters and running statistics of every worker; with it, the number of
  training steps this rank ran on fairseq's dummy batch (a worker out of data).
* ``HOOK_PAUSE_AT_UPDATE=K``: once the checkpoint at update K is written, print
  ``HOOK-PAUSED`` to stderr and sleep, so a test can SIGKILL the process at a
  known point (the kill itself is real: no clean-up code runs).
* ``HOOK_CPU_BF16=1``: keep ``--bf16`` but drop the ``--tpu`` that fairseq 0.12's
  argument post-processing forces on with it (``options.parse_args_and_arch``:
  ``if args.bf16: args.tpu = True``), which makes ``fairseq-train --bf16 --cpu`` fail
  without torch_xla. Everything else is fairseq's own bf16 training path (model
  cast to bf16, FP16Optimizer with float32 master weights).

Nothing here is part of normplug; it patches fairseq only inside this test process.
"""
import os
import sys
import time

from fairseq_cli import train  # first: it sets up fairseq's log format

import torch
from fairseq import checkpoint_utils, options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.distributed import utils as distributed_utils
from fairseq.trainer import Trainer

DUMP_DIR = os.environ.get("HOOK_DUMP_DIR")
PAUSE_AT = int(os.environ.get("HOOK_PAUSE_AT_UPDATE", "0") or 0)
CPU_BF16 = os.environ.get("HOOK_CPU_BF16") == "1"

_original_save = checkpoint_utils.save_checkpoint
_original_prepare = Trainer._prepare_sample
_dummy_train_batches = 0


def _prepare_sample(self, sample, is_dummy=False):
    """Count the training steps that ran on fairseq's dummy batch (worker out of data)."""
    global _dummy_train_batches
    out = _original_prepare(self, sample, is_dummy)
    if out[1] and self.model.training:
        _dummy_train_batches += 1
    return out


Trainer._prepare_sample = _prepare_sample


def _save_checkpoint(cfg, trainer, epoch_itr, val_loss):
    result = _original_save(cfg, trainer, epoch_itr, val_loss)
    updates = trainer.get_num_updates()
    if DUMP_DIR:
        state = {k: v.detach().clone() for k, v in trainer.get_model().state_dict().items()}
        rank = trainer.data_parallel_rank
        torch.save({"num_updates": updates, "rank": rank, "model": state,
                    "dummy_train_batches": _dummy_train_batches},
                   os.path.join(DUMP_DIR, f"rank{rank}_update{updates}.pt"))
    if PAUSE_AT and updates == PAUSE_AT:
        print(f"HOOK-PAUSED at update {updates}", file=sys.stderr, flush=True)
        while True:
            time.sleep(60)
    return result


checkpoint_utils.save_checkpoint = _save_checkpoint


def main():
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser)
    if CPU_BF16 and args.bf16:
        args.tpu = False
    cfg = convert_namespace_to_omegaconf(args)
    distributed_utils.call_main(cfg, train.main)


if __name__ == "__main__":
    main()
