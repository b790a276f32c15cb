"""Fused CPU kernels of the norms (``csrc/kernels.cpp``), built on first use.

Stock torch has fused CPU kernels for LayerNorm and plain BatchNorm only; the
other norms, composed of torch ops, pay extra passes over the activations. On a
CPU, float32 or float64, the norms call the passes of ``csrc/kernels.cpp``
instead: one statistics pass and one output pass forward, one reduction pass
and one gradient pass backward, padding rows skipped.

Build. The first process that needs them compiles the file with the system C++
compiler (``$CXX``, else ``c++``/``g++``; about 2 s) with ``-O3 -march=native
-fopenmp`` into ``$NORMPLUG_KERNEL_CACHE`` (default
``$XDG_CACHE_HOME/normplug`` or ``~/.cache/normplug``), under a name hashed from
the source, the flags, the compiler and this CPU's model and feature flags, so
machines sharing a home directory each get their own build. Written to a
temporary file and renamed: concurrent first uses (distributed workers) are safe.
The library is loaded after torch, so its OpenMP runtime is torch's own
(one thread pool; ``torch.set_num_threads`` applies).

Fallback. ``NORMPLUG_CPU_KERNELS=0`` switches them off; without a compiler, or
if the build fails, normplug warns once (naming the compiler error) and the
norms use their torch-op implementation, the one used on GPUs, which computes
the same maths more slowly.
"""
import contextlib
import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import torch

__all__ = ["usable", "call", "enabled", "library", "build_error"]

SOURCE = Path(__file__).with_name("csrc") / "kernels.cpp"
FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-shared", "-fPIC", "-std=c++17"]
if platform.machine().lower() in ("x86_64", "amd64"):
    # gcc keeps to 256-bit vectors on AVX-512 CPUs unless told; the kernels are
    # faster with 512 (no effect on CPUs without AVX-512)
    FLAGS.append("-mprefer-vector-width=512")
ABI = 2  # normplug_kernels_abi() of the source this wrapper is written for

_lock = threading.Lock()
_lib = None  # the loaded library, once built
_error = None  # why there is none (str), once tried
_enabled = os.environ.get("NORMPLUG_CPU_KERNELS", "1").strip().lower() not in ("0", "false", "no", "off")

_P, _I64, _I32, _F64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_double
# entry point -> argument types (without the _f32/_f64 suffix)
_SIGNATURES = {
    "simple_fwd": [_P, _P, _P, _P, _P, _I64, _I64, _F64, _I32, _F64, _F64, _I32],
    "simple_bwd": [_P, _P, _P, _P, _P, _P, _I64, _I64, _I32, _F64, _F64, _I32],
    "rms_fwd": [_P, _P, _P, _P, _I64, _I64, _F64, _I32],
    "rms_bwd": [_P, _P, _P, _P, _P, _P, _I64, _I64, _I32],
    "scale_fwd": [_P, _F64, _P, _P, _P, _I64, _I64, _F64, _I32],
    "scale_bwd": [_P, _P, _F64, _P, _P, _P, _P, _I64, _I64, _I32],
    "affine_rows": [_P, _P, _P, _P, _P, _I64, _I64, _I32],
    "bn_train_fwd": [_P, _P, _I64, _I64, _P, _P, _F64, _F64, _P, _P, _P, _P, _P, _P, _P, _I32],
    "bn_bwd": [_P, _P, _P, _I64, _I64, _I64, _P, _P, _P, _P, _P, _P, _P, _P, _I32],
    "pn_train_fwd": [_P, _P, _I64, _I64, _I64, _I64, _P, _P, _F64, _I32, _I64, _F64, _P, _P, _P, _P, _P, _I32],
    "pn_eval_fwd": [_P, _P, _I64, _I64, _I64, _P, _P, _F64, _P, _P, _P, _I32],
    "pn_bwd": [_P, _P, _P, _P, _I64, _I64, _I64, _I64, _P, _P, _F64, _P, _P, _P, _P, _I32],
}
_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
_FUNCS = {}  # (entry point, dtype) -> ctypes function


def _compiler():
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def _cpu_fingerprint() -> str:
    """Model and feature flags of this CPU (-march=native code is only valid here)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
        keep = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags", "Features"))]
        return "\n".join(sorted(set(keep)))
    except OSError:
        return platform.processor() + platform.machine()


def _cache_dir() -> Path:
    if os.environ.get("NORMPLUG_KERNEL_CACHE"):
        return Path(os.environ["NORMPLUG_KERNEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "normplug"


def _build(cxx: str) -> Path:
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256(
        "\0".join([SOURCE.read_text(), " ".join(FLAGS), version, _cpu_fingerprint()]).encode()
    ).hexdigest()[:16]
    out_dir = _cache_dir()
    target = out_dir / f"kernels-{key}.so"
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".kernels-", suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        proc = subprocess.run([cxx, *FLAGS, str(SOURCE), "-o", tmp], capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            raise RuntimeError(f"{cxx} failed to compile {SOURCE.name}: " + " | ".join(tail))
        os.replace(tmp, target)  # atomic: a concurrent build replaces it with the same bytes
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _load():
    global _lib, _error
    with _lock:
        if _lib is not None or _error is not None:
            return _lib
        try:
            cxx = _compiler()
            if cxx is None:
                raise RuntimeError("no C++ compiler found (set CXX, or install g++)")
            lib = ctypes.CDLL(str(_build(cxx)))
            if lib.normplug_kernels_abi() != ABI:
                raise RuntimeError("the built library does not match this normplug version")
            for name, argtypes in _SIGNATURES.items():
                for dtype, suffix in _SUFFIX.items():
                    fn = getattr(lib, f"{name}_{suffix}")
                    fn.argtypes, fn.restype = argtypes, None
                    _FUNCS[name, dtype] = fn
            _lib = lib
        except Exception as exc:  # noqa: BLE001 - any failure means: use the torch ops
            _error = f"{type(exc).__name__}: {exc}"
            warnings.warn(
                f"normplug: fused CPU norm kernels unavailable ({_error}); using the slower "
                "torch-op implementation. NORMPLUG_CPU_KERNELS=0 silences this.",
                RuntimeWarning,
                stacklevel=3,
            )
        return _lib


def library():
    """The loaded kernel library, building it if needed; None if unavailable or switched off."""
    if not _enabled:
        return None
    return _lib if _lib is not None else _load()


def build_error():
    """Why the kernels could not be built, or None."""
    return _error


def enabled() -> bool:
    return _enabled


@contextlib.contextmanager
def disabled():
    """Within this block the norms use their torch-op implementation (as on GPUs)."""
    global _enabled
    old, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = old


def usable(x: torch.Tensor) -> bool:
    """True if the kernels handle ``x``: a CPU floating tensor (half precision is
    computed in float32), kernels switched on and built."""
    if x.device.type != "cpu" or not x.is_floating_point() or not _enabled:
        return False
    return library() is not None


def call(name: str, dtype: torch.dtype, *args) -> None:
    """Run entry point ``name`` for ``dtype``; tensors are passed as pointers (must be
    contiguous CPU tensors of the right dtype; ``None`` is a null pointer). The
    thread count is appended (torch's intra-op thread count)."""
    fn = _FUNCS.get((name, dtype))
    if fn is None:
        if library() is None:
            raise RuntimeError(f"normplug CPU kernels unavailable: {_error or 'switched off'}")
        fn = _FUNCS[name, dtype]
    fn(*[a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args], torch.get_num_threads())
