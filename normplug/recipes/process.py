"""Child processes of the driver and the files it writes."""
import contextlib
import os
import subprocess
from pathlib import Path
from typing import Dict, Optional, Tuple

from normplug.tools.common import atomic_path

from .commands import PLUGIN_DIR


def child_env(threads: Optional[int] = None) -> Dict[str, str]:
    """The environment of every child: this process's normplug first on the path (for
    ``python -m normplug.tools.*``); ``threads`` caps the BLAS/OpenMP threads."""
    env = dict(os.environ)
    env.setdefault("PYTHONWARNINGS", "ignore")
    env["PYTHONPATH"] = os.pathsep.join([str(PLUGIN_DIR.parent)] + [p for p in [env.get("PYTHONPATH")] if p])
    if threads:
        env.update({v: str(threads) for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")})
    return env


def run_logged(argv, log_path=None, echo=None, env=None) -> Tuple[int, str]:
    """Run a command, its output (stdout and stderr) to ``log_path`` and, line by line, to
    ``echo``. Returns (exit status, output)."""
    lines = []
    with contextlib.ExitStack() as stack:
        log = stack.enter_context(open(log_path, "w", encoding="utf-8")) if log_path else None
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env or child_env(), bufsize=1)
        for line in proc.stdout:
            lines.append(line)
            if log:
                log.write(line)
                log.flush()
            if echo:
                echo(line)
        rc = proc.wait()
    return rc, "".join(lines)


def write_atomic(path: Path, text: str):
    """Write a whole file or nothing: a reader never sees a half-written one."""
    with atomic_path(str(path)) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")
