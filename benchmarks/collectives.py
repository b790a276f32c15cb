"""Collectives of ``--bn-sync-stats`` per norm and training step, counted in a 2-process gloo group.

    .venv/bin/python benchmarks/collectives.py

Two forked CPU workers each run one training forward and backward of a ``batch`` and a ``power``
norm (torch implementation, ``sync_stats=True``, T×B×C = 7×3×16 with padding) and count the
collectives the dispatcher sees (a TorchDispatchMode: nothing of torch or fairseq is patched),
forward and backward apart. A model's collectives per step are these figures times its number of
such norms (the ``bn``/``rbn`` Transformers: two an encoder layer, so 12 in a 6-layer encoder).
"""
import os
import tempfile
from collections import Counter

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils._python_dispatch import TorchDispatchMode

from normplug.norms import create_norm

T, B, C = 7, 3, 16
NORMS = ("batch", "power")


class CountCollectives(TorchDispatchMode):
    """Counts the c10d operators (all_reduce, broadcast, ...) dispatched inside it."""

    def __init__(self):
        super().__init__()
        self.calls = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d":
            self.calls[func.__name__.split(".")[0]] += 1
        return func(*args, **(kwargs or {}))


def _worker(rank, port, folder):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(rank)
    counts = {}
    for name in NORMS:
        norm = create_norm(name, C, sync_stats=True, impl="torch").train()
        x = torch.randn(T, B, C, requires_grad=True)
        pad = torch.zeros(B, T, dtype=torch.bool)
        pad[0, 4:] = True
        with CountCollectives() as forward:
            y = norm(x, pad)
            d = norm.discrepancy()
            loss = y.square().sum() + d.rbn_mean + d.rbn_var  # the RBN penalty's graph too
        with CountCollectives() as backward:
            loss.backward()
        counts[name] = (sum(forward.calls.values()), sum(backward.calls.values()),
                        sorted((forward.calls + backward.calls).keys()))
    torch.save(counts, os.path.join(folder, f"rank{rank}.pt"))
    dist.destroy_process_group()


def main():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        mp.start_processes(_worker, args=(port, folder), nprocs=2, join=True, start_method="fork")
        counts = [torch.load(os.path.join(folder, f"rank{r}.pt")) for r in range(2)]
    assert counts[0] == counts[1], counts  # every worker must join every collective
    print("| norm (torch, --bn-sync-stats) | forward | backward | step | operators |")
    print("|---|---|---|---|---|")
    for name, (fwd, bwd, ops) in counts[0].items():
        print(f"| {name} | {fwd} | {bwd} | {fwd + bwd} | {', '.join(ops)} |")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
