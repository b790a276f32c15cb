"""The launch check: a run that its launcher started as several processes must train as one
fairseq process group. fairseq 0.12 starts no group when ``--distributed-world-size`` is 1, its
default without a GPU (and on one-GPU nodes), even under torchrun (``WORLD_SIZE``, ``RANK``) or
srun; each process then trains alone on the whole corpus and exits 0. fairseq's distributed_main
starts the group before it builds the model, so at model build the group says what fairseq did.
"""
import logging
import os

import torch.distributed as dist

from .errors import NormplugError

logger = logging.getLogger(__name__)

# launcher variable -> (launcher, the flags that make fairseq start the group its processes form)
LAUNCHERS = {
    "WORLD_SIZE": ("torchrun", "--distributed-world-size {n}"),
    # srun's own count of the tasks it started; a batch script's SLURM_NTASKS is the allocation's,
    # and a lone fairseq-generate in it is not one of several processes
    "SLURM_STEP_NUM_TASKS": ("srun", "--distributed-world-size {n} --distributed-port PORT (one task per "
                                     "GPU), or one task per node and --distributed-port PORT"),
}


def launched_processes():
    """(number, variable, launcher, flags) of the processes a launcher says this run has, when several."""
    for variable, (launcher, flags) in LAUNCHERS.items():
        value = os.environ.get(variable, "")
        if value.isdigit() and int(value) > 1:
            return int(value), variable, launcher, flags.format(n=value)
    return None


def check_launch(sync_stats: bool) -> None:
    """Refuse (``sync_stats``) or warn, one line, when the launcher started more processes than
    fairseq's process group holds: each group would train alone."""
    launched = launched_processes()
    if launched is None:
        return
    count, variable, launcher, flags = launched
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if world >= count:
        return
    group = "no process group" if world == 1 else f"a process group of {world}"
    problem = (f"{launcher} started {count} processes ({variable}={count}) but fairseq started {group}: "
               f"each would train alone on the whole corpus; add {flags}")
    if sync_stats:
        raise NormplugError(f"--bn-sync-stats would sync nothing: {problem}")
    logger.warning(problem)
