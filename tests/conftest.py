"""Shared fixtures: a tiny binarized parallel corpus, fairseq CLI runners, and data preparation's runners and
archives."""
import collections
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import settings

# One thread for the tests' own torch ops, as run_cli gives fairseq's processes: on the tiny
# models here two threads spin against each other and against other processes on a busy
# machine (test_every_architecture_builds_and_trains_one_step: 29 s with two, 6 s with one,
# on 2 shared cores).
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
# data preparation and the synthetic corpus live in scripts/, outside the package
sys.path.insert(0, str(REPO / "scripts"))

# Under CI (CI set, as CI services do) hypothesis draws the same examples on every
# run, so a red CI means a change broke something; a run elsewhere draws new ones,
# and a counterexample it finds goes into the test as an @example.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
USER_DIR = str(REPO / "normplug")
BIN = Path(sys.executable).parent

# A model small enough that a few updates take a second or two on one core.
TINY_MODEL = [
    "--encoder-layers", "1", "--decoder-layers", "1",
    "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
    "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
]


def parse_train_args(data, arch, *extra):
    """fairseq-train's parsing of ``data --arch arch --cpu *extra`` with the plugin loaded, the
    architecture function applied: the Namespace fairseq builds its task and model from."""
    from fairseq import options, utils

    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(data), "--user-dir", USER_DIR, "--arch", arch, "--cpu", *map(str, extra)])
    utils.import_user_module(args)
    return args


def build_model(data, arch, *extra):
    """(task, model, args) as fairseq-train builds them, the weights drawn from seed 0: the one
    way the tests build a fairseq model in process (each module adds its tiny sizes)."""
    from fairseq import tasks

    args = parse_train_args(data, arch, *extra)
    task = tasks.setup_task(args)
    torch.manual_seed(0)
    return task, task.build_model(args), args


def write_tiny_corpus(folder: Path, seed: int = 0, sizes=(("train", 240), ("valid", 24), ("test", 24))):
    """A toy translation task: target = source reversed with a marked lexicon.

    Lengths vary from 3 to 14 tokens so batches carry padding on both sides.
    """
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(40)]
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in sizes:
        with open(folder / f"{split}.src", "w") as src, open(folder / f"{split}.tgt", "w") as tgt:
            for _ in range(n):
                words = [rng.choice(vocab) for _ in range(rng.randint(3, 14))]
                src.write(" ".join(words) + "\n")
                tgt.write(" ".join(w.upper() for w in reversed(words)) + "\n")
    return folder


def run_cli(tool, *args, cwd=None, check=True, env=None, timeout=600, input=None):
    """Run a fairseq console script of this venv; return the CompletedProcess."""
    cmd = [str(BIN / tool), *map(str, args)]
    full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **(env or {}))
    proc = subprocess.run(cmd, cwd=cwd, env=full_env, input=input, capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}"
            f"\n--- stderr\n{proc.stderr[-4000:]}"
        )
    return proc


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """Binarized tiny corpus (joined dictionary), built once per test session by
    fairseq-preprocess's main in this process (a subprocess would be mostly start-up)."""
    import logging

    from fairseq import options
    from fairseq_cli import preprocess

    root = tmp_path_factory.mktemp("tiny")
    raw = write_tiny_corpus(root / "raw")
    dest = root / "bin"
    args = options.get_preprocessing_parser().parse_args(list(map(str, [
        "--source-lang", "src", "--target-lang", "tgt",
        "--trainpref", raw / "train", "--validpref", raw / "valid", "--testpref", raw / "test",
        "--destdir", dest, "--joined-dictionary", "--workers", "1",
    ])))
    log = logging.getLogger("fairseq_cli.preprocess")
    handlers = list(log.handlers)
    preprocess.main(args)
    for handler in set(log.handlers) - set(handlers):  # main adds a log file handler
        log.removeHandler(handler)
        handler.close()
    return dest


def write_lm_corpus(folder: Path, seed: int = 0, sizes=(("train", 300), ("valid", 30), ("test", 30))):
    """A toy language: each line counts up through w0..w29 (mod 30) from a random word in
    steps of 1, 2 or 3, so two words determine the next. Lines of 3 to 12 words, so that
    ``--sample-break-mode eos`` batches carry padding."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in sizes:
        with open(folder / f"{split}.txt", "w") as out:
            for _ in range(n):
                start, step = rng.randrange(30), rng.choice((1, 2, 3))
                out.write(" ".join(f"w{(start + step * i) % 30}" for i in range(rng.randint(3, 12))) + "\n")
    return folder


@pytest.fixture(scope="session")
def lm_data(tmp_path_factory):
    """Binarized toy language-model corpus, built once per test session by fairseq-preprocess
    --only-source, run in this process (a fresh process costs seconds of start-up here)."""
    from fairseq import options
    from fairseq_cli import preprocess

    root = tmp_path_factory.mktemp("lm")
    raw = write_lm_corpus(root / "raw")
    dest = root / "bin"
    preprocess.main(options.get_preprocessing_parser().parse_args([
        "--only-source", "--trainpref", str(raw / "train.txt"), "--validpref", str(raw / "valid.txt"),
        "--testpref", str(raw / "test.txt"), "--destdir", str(dest), "--workers", "1"]))
    return dest


def train_args(data, save_dir, arch, *extra, updates=3):
    """Arguments of a short CPU fairseq-train run of a tiny model."""
    return [
        data, "--user-dir", USER_DIR, "--arch", arch, *TINY_MODEL,
        "--share-all-embeddings", "--dropout", "0.1",
        "--optimizer", "adam", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt",
        "--warmup-updates", "2", "--criterion", "label_smoothed_cross_entropy",
        "--label-smoothing", "0.1", "--max-tokens", "400", "--max-update", str(updates),
        "--cpu", "--seed", "1", "--save-dir", save_dir, "--no-progress-bar",
        "--log-interval", "1", "--log-format", "simple", "--num-workers", "0",
        # no prefetch thread: fairseq's is a daemon thread, and one caught inside a torch op
        # when the run ends aborts the interpreter (README, Limitations)
        "--data-buffer-size", "0",
        *extra,
    ]


# --------------------------------------------------------------------------- processes
# Helpers for tests that run several fairseq processes (distributed training,
# resume after SIGKILL): every process gets its own process group, and whatever
# happens, no process outlives its test.
HOOKED_TRAIN = str(REPO / "tests" / "hooked_train.py")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_process(cmd, env=None, cwd=None, stdout=None, stderr=None):
    """Popen in a new session (its own process group), OMP_NUM_THREADS=1 as in run_cli."""
    full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **(env or {}))
    return subprocess.Popen(
        [str(c) for c in cmd], env=full_env, cwd=cwd, text=True, start_new_session=True,
        stdout=subprocess.PIPE if stdout is None else stdout,
        stderr=subprocess.PIPE if stderr is None else stderr,
    )


def kill_group(proc, sig=None):
    """Send ``sig`` (SIGKILL) to the process group of ``proc`` and reap it."""
    import signal

    try:
        os.killpg(proc.pid, sig if sig is not None else signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL is not ignorable
        pass


def env_launch(rank, world, port):
    """(fairseq flags, environment) of worker ``rank`` of an env:// group on 127.0.0.1: the
    variables torchrun sets, and the rank given to fairseq explicitly."""
    return (["--distributed-init-method", "env://", "--distributed-rank", str(rank)],
            dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank)))


def run_workers(rank_args, tool="fairseq-train", env=None, timeout=180, launch=env_launch,
                ddp_backend="legacy_ddp"):
    """Run one ``tool`` process per entry of ``rank_args`` as a gloo group on CPU.

    ``tool`` is a console script of this venv or a Python file (run with this
    interpreter); ``launch(rank, world, port)`` gives each worker's distributed flags and
    environment (:func:`env_launch`). Returns [(returncode, stdout, stderr)] per rank; on
    timeout every process group is killed and the test fails with their output.
    """
    import tempfile
    import time

    world = len(rank_args)
    port = free_port()
    base = [sys.executable, tool] if tool.endswith(".py") else [str(BIN / tool)]
    procs, files = [], []
    timed_out = False
    try:
        for rank, args in enumerate(rank_args):
            out = tempfile.TemporaryFile("w+")
            err = tempfile.TemporaryFile("w+")
            files.append((out, err))
            flags, launch_env = launch(rank, world, port)
            procs.append(start_process(
                base + [*map(str, args), "--cpu", "--distributed-backend", "gloo",
                        "--distributed-world-size", str(world), "--distributed-no-spawn",
                        "--ddp-backend", ddp_backend, *flags],
                env=dict(env or {}, **launch_env), stdout=out, stderr=err,
            ))
        deadline = time.monotonic() + timeout
        for proc in procs:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
        if timed_out:
            for proc in procs:
                kill_group(proc)
    finally:
        for proc in procs:
            if proc.poll() is None:
                kill_group(proc)
    results = []
    for proc, (out, err) in zip(procs, files):
        out.seek(0)
        err.seek(0)
        results.append((proc.returncode, out.read(), err.read()))
        out.close()
        err.close()
    if timed_out:
        raise AssertionError(
            f"distributed run did not finish in {timeout}s (killed)\n"
            + "\n".join(f"--- rank {r} stderr\n{e[-3000:]}" for r, (_, _, e) in enumerate(results))
        )
    return results


# --------------------------------------------------------------------------- data preparation
# scripts/prepare.py run in this process or as its shell script, the step folders it leaves, and small
# archives in the upstream layouts (tests/test_prepare.py, tests/test_prepare_lm.py).
FIXTURES = REPO / "tests" / "fixtures"
needs_fairseq = pytest.mark.skipif(not (BIN / "fairseq-preprocess").exists(),
                                   reason="fairseq-preprocess not installed next to python")
Prepared = collections.namedtuple("Prepared", "returncode errors stderr")


@pytest.fixture
def prepare(capsys):
    """prepare(DATASET, *ARGS): scripts/prepare.py DATASET --workers 1 ARGS in this process; returns its exit
    status, its ERROR lines and its stderr."""
    import prepare as script

    def run(dataset, *args):
        capsys.readouterr()
        code = script.main([dataset, "--workers", "1", *map(str, args)])
        err = capsys.readouterr().err
        return Prepared(code, [x for x in err.splitlines() if x.startswith("ERROR")], err)
    return run


@pytest.fixture
def terminal_sigint():
    """SIGINT handled as in a terminal's foreground job. A runner started in the background by a shell
    without job control (``cmd &``, nohup) ignores SIGINT, and so would every child it starts: Python then
    installs no KeyboardInterrupt handler. A handled signal is reset to the default on exec, an ignored one
    is not, so the processes a test starts get ^C as a terminal delivers it."""
    import signal

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.fixture
def unpublished(monkeypatch):
    """No published size or checksum, so that small archives can stand for the real sources."""
    import fetch

    monkeypatch.setattr(fetch, "PUBLISHED", {})


def run_killed_in(step, script, *args, timeout=120):
    """Start scripts/SCRIPT in its own process group, SIGKILL the group as soon as it reports ``step STEP:
    running`` (its folder STEP.tmp exists by then), and return what it wrote to stderr."""
    import threading

    proc = start_process(["bash", REPO / "scripts" / script, "--workers", "1", *args],
                         env={"PYTHON": sys.executable}, stdout=subprocess.DEVNULL)
    timer = threading.Timer(timeout, kill_group, [proc])
    timer.start()
    seen = []
    try:
        for line in proc.stderr:
            seen.append(line)
            if f"step {step}: running" in line:
                break
    finally:
        timer.cancel()
        kill_group(proc)
        proc.stderr.close()
    assert seen and f"step {step}: running" in seen[-1], "".join(seen)
    return "".join(seen)


def lines(path):
    return Path(path).read_text(encoding="utf-8").split("\n")[:-1]


def sha(path):
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def step_outputs(work, dest=None):
    """The steps done: name -> output folder (an unfinished one is STEP.tmp; binarize writes DEST)."""
    done = {p.name: p for p in Path(work).glob("*") if p.is_dir() and p.suffix != ".tmp" and p.name != "archives"}
    if dest is not None and Path(dest).is_dir():
        done["binarize"] = Path(dest)
    return done


def markers(work, dest=None):
    return sorted(step_outputs(work, dest))


def outputs(work):
    """Every file the steps made (not the downloads): path -> bytes."""
    return {str(p.relative_to(work)): p.read_bytes() for p in sorted(Path(work).rglob("*"))
            if p.is_file() and p.parts[len(Path(work).parts)] != "archives"}


def make_tgz(path, files):
    """A gzip'd tar of {name: text or bytes}, byte for byte the same on every run."""
    import gzip
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in sorted(files):
            data = files[name].encode("utf-8") if isinstance(files[name], str) else files[name]
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 1_400_000_000, 0o644
            tar.addfile(info, io.BytesIO(data))
    Path(path).write_bytes(gzip.compress(buf.getvalue(), mtime=0))
    return Path(path)


def folder_tgz(path, root, prefix=""):
    """make_tgz of every file under ROOT, named PREFIX + its path under ROOT."""
    return make_tgz(path, {prefix + str(p.relative_to(root)): p.read_bytes() for p in Path(root).rglob("*")
                           if p.is_file()})


@pytest.fixture(scope="session")
def golden_sources(tmp_path_factory):
    """golden_sources(NAME): a folder of the upstream archives that tests/fixtures/NAME-golden/raw/ holds unpacked
    (raw/ARCHIVE/...), packed as the golden run had them."""
    def build(name):
        folder = tmp_path_factory.mktemp(name) / "raw"
        folder.mkdir()
        for archive in (FIXTURES / f"{name}-golden" / "raw").iterdir():
            folder_tgz(folder / archive.name, archive)
        return folder
    return build
