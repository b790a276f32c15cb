"""Where a run's processes come from: one machine (fairseq-train spawns one process a GPU), or several nodes, the
driver run once on each. On GPU nodes fairseq-train runs under torchrun (env://); on nodes without a GPU, one CPU
process a node joins a gloo group over tcp:// (how the tests run it). The batch-keeping flags change the run and
are recorded; the launch-only flags (ranks, init method, port, backend) never are."""
import dataclasses
from pathlib import Path
from typing import List, Optional

from .config import ConfigError, Recipe

MASTER_PORT = 29500  # torchrun's default


@dataclasses.dataclass(frozen=True)
class Launch:
    gpus: int = 1  # processes (GPUs) a node
    nodes: int = 1
    node_rank: int = 0
    master_addr: Optional[str] = None
    master_port: int = MASTER_PORT

    def __post_init__(self):
        if self.nodes > 1 and not self.master_addr:
            raise ConfigError(f"--nodes {self.nodes} needs --master-addr HOST (node 0's address, which every node "
                              "reaches) and --node-rank R on each node")
        if not 0 <= self.node_rank < self.nodes:
            raise ConfigError(f"--node-rank {self.node_rank}: give 0 .. {self.nodes - 1} for --nodes {self.nodes}")
        if not 0 < self.master_port < 65535:
            raise ConfigError(f"--master-port {self.master_port}: give a port in 1 .. 65534")

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus

    @property
    def writes_record(self) -> bool:
        """Only global rank 0 (node 0) saves checkpoints, so only it keeps a run record."""
        return self.node_rank == 0

    def batch_flags(self, recipe: Recipe) -> List[str]:
        """fairseq-train arguments that spread a recipe over the world with its effective batch (max tokens x
        update-freq x processes) kept: update-freq divided by the world size, or, where it does not divide,
        update-freq 1 and max-tokens scaled; a batch that cannot be kept is refused."""
        world, freq = self.world_size, str(recipe.train_value("update-freq") or 1)
        if world == 1:
            return []
        what = f"{self.nodes} nodes x {self.gpus} GPUs" if self.nodes > 1 else f"--gpus {self.gpus}"
        if not freq.isdigit():
            raise ConfigError(f"{what}: the update-freq {freq!r} of {recipe.path} is not one whole number")
        if int(freq) % world == 0:
            return ["--distributed-world-size", str(world), "--update-freq", str(int(freq) // world)]
        tokens = recipe.train_value("max-tokens")
        if not isinstance(tokens, int) or (tokens * int(freq)) % world:
            raise ConfigError(f"{what} = {world} processes divide neither the update-freq {freq} of {recipe.path} nor "
                              f"its max-tokens x update-freq ({tokens} x {freq}): the effective batch would change; "
                              "pick a number of processes that divides one of them")
        return ["--distributed-world-size", str(world), "--update-freq", "1",
                "--max-tokens", str(tokens * int(freq) // world)]

    def batch_note(self, recipe: Recipe) -> Optional[str]:
        """The line that says how the effective batch is kept, where max-tokens had to change."""
        flags = self.batch_flags(recipe)
        if "--max-tokens" not in flags:
            return None
        return (f"{recipe.name}: {self.world_size} processes do not divide the update-freq "
                f"{recipe.train_value('update-freq') or 1}: --update-freq 1 --max-tokens {flags[-1]} keeps the "
                f"effective batch of {recipe.train_value('max-tokens')} x {recipe.train_value('update-freq') or 1} "
                "tokens")

    def command(self, argv: List[str], gpu: bool, exe: bool = True) -> List[str]:
        """fairseq-train's ``argv`` (executable first) as this node runs it (``exe`` False: as a person types it)."""
        if self.nodes == 1:
            return argv  # fairseq-train spawns one process a GPU itself
        if gpu:
            from normplug.tools.common import fairseq_exe
            return [fairseq_exe("torchrun") if exe else "torchrun", "--nnodes", str(self.nodes), "--nproc-per-node", str(self.gpus), "--node-rank",
                    str(self.node_rank), "--master-addr", self.master_addr, "--master-port", str(self.master_port),
                    argv[0], *argv[1:]]
        # fairseq's pytorch_ddp wraps the model with device_ids, which torch refuses for a CPU module
        ddp = [] if "--ddp-backend" in argv else ["--ddp-backend", "legacy_ddp"]
        return [*argv, "--distributed-backend", "gloo", "--distributed-init-method",
                f"tcp://{self.master_addr}:{self.master_port}", "--distributed-rank", str(self.node_rank),
                "--distributed-no-spawn", *ddp]

    def srun_line(self, argv: List[str]) -> List[str]:
        """The same run as a SLURM job step: one task a node, fairseq-train spawning one process a GPU and finding
        its group through SLURM's variables at --distributed-port."""
        return ["srun", "--nodes", str(self.nodes), "--ntasks-per-node", "1", "--gpus-per-node", str(self.gpus),
                *argv, "--distributed-port", str(self.master_port)]


def agree_with_node0(launch: Launch, save_dir: Path, finished: bool, log=print) -> bool:
    """Whether the run is finished, as node 0's folder says, told to every node through a TCP store beside the
    master port: a node whose folder holds no record must not wait for a node 0 that has nothing to train. And
    fairseq resumes only where every rank finds checkpoint_last.pt (rank 0 reads it and broadcasts its state; the
    others only look for the file): a node whose own folder lacks it, where node 0 resumes, gets an empty one."""
    import datetime

    import torch.distributed as dist
    last = Path(save_dir) / "checkpoint_last.pt"
    store = dist.TCPStore(launch.master_addr, launch.master_port + 1, launch.nodes, launch.node_rank == 0,
                          timeout=datetime.timedelta(minutes=10))
    if launch.node_rank == 0:
        store.set("state", "finished" if finished else "resume" if last.exists() else "start")
        store.wait([f"seen{rank}" for rank in range(1, launch.nodes)])  # the store lives while node 0 waits
        return finished
    state = store.get("state").decode()
    store.set(f"seen{launch.node_rank}", "1")
    if state == "start" and last.exists() and last.stat().st_size == 0:
        last.unlink()  # an earlier relaunch's mark; node 0 starts afresh
    if state == "resume" and not last.exists():
        last.parent.mkdir(parents=True, exist_ok=True)
        last.write_bytes(b"")  # never read: node 0's state arrives by broadcast
        log(f"node {launch.node_rank}: node 0 resumes its checkpoint_last.pt; {last} marks it here")
    return state == "finished"
