"""The GPU check's verify part (benchmarks/gpu_verify.py) on the CPU, under Triton's
interpreter, at its smoke sizes for one norm: it passes the kernels as they are and fails a
kernel that is off by 1e-4. Slow tier: the first torch.compile in a process takes seconds."""
import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels run on CPU tensors

import pytest
import torch

pytest.importorskip("triton")
pytestmark = pytest.mark.slow
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import gpu_verify  # noqa: E402
from normplug.norms import per_token  # noqa: E402


def verify_rms():
    verdicts = gpu_verify.verify("cpu", smoke=True, norms=["rms"], dtypes=[torch.float32], emit=lambda line: None)
    return verdicts["rms"]


def test_verify_passes_the_kernels():
    verdict = verify_rms()
    assert verdict.correct, verdict.line()
    assert verdict.cases == 7 and verdict.line().startswith("VERDICT rms correct=yes worst=")


def test_verify_fails_a_wrong_kernel(monkeypatch):
    fused = per_token.fused
    monkeypatch.setattr(per_token, "fused", lambda x, *args, **opts: fused(x, *args, **opts) * (1 + 1e-4))
    verdict = verify_rms()
    assert not verdict.correct and verdict.worst > 1
    assert verdict.line().startswith("VERDICT rms correct=no")
