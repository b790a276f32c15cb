"""The fused norms' launches compiled for sm_80 and sm_90 GPUs instead of run, through the
public modules (``create_norm(..., impl="triton")``; benchmarks/kernel_plan.py points Triton at
the target, no GPU needed): no launch spills registers, every launch that streams N×C keeps at
least 16 warps resident a multiprocessor and fits one wave, at the GPU check's sizes in
fp16/bf16/fp32 and at the widest channel counts the norms accept. The host code plans each
launch from the registers of the kernel compiled for that GPU, as on the GPU itself.

Triton keeps what it compiles (~/.triton/cache), so a second run takes seconds; the first
compiles every kernel (slow tier).
"""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from normplug.norms.impl import MAX_GROUP_CHANNELS, MAX_ROW_CHANNELS

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]
SIZES = [(4096, 512), (8192, 1024), (32768, 1024), (8192, 4096)]  # the GPU check's N×C
DTYPES = ["float16", "bfloat16", "float32"]
MIN_RESIDENT_WARPS = 16


def power_groups(C):
    """PowerNorm's groups at C as the GPU check sets them (64 to 128 channels a group, at most 16)."""
    return max(g for g in (1, 2, 4, 8, 16) if C % g == 0 and C // g >= min(64, C))


def case(name, N, C, dtype, training=True, sync=False, **options):
    if name == "power" and "groups" not in options:
        options["groups"] = power_groups(C)
    return [name, options, N, C, dtype, training, sync]


def compile_launches(arch, cases):
    """One record a launch (benchmarks/kernel_plan.records) of each case, from a process without
    TRITON_INTERPRET (the interpreter's kernels cannot be compiled)."""
    # the norms without the plugin package's __init__, which imports fairseq (seconds)
    code = ("import json, sys, types; package = types.ModuleType('normplug'); package.__path__ = ['normplug']; "
            "sys.modules['normplug'] = package; sys.path.insert(0, 'benchmarks'); import kernel_plan; "
            "print(json.dumps(kernel_plan.records(int(sys.argv[1]), json.loads(sys.stdin.read()))))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-c", code, str(arch)], input=json.dumps(cases), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


LAUNCHES = {"batch": 4, "power": 5}  # of a training step (2 for a per-token norm)


def check(records, cases):
    """Every launch of every case recorded; no error, no spill; every streaming launch with
    MIN_RESIDENT_WARPS resident and at most one wave of programs (a program more than the GPU
    holds runs after all the others)."""
    for name, options, N, C, dtype, training, sync in cases:
        count = sum(r["norm"] == name and r["options"] == options and (r["N"], r["C"], r["dtype"]) == (N, C, dtype)
                    and (r["training"], r["sync"]) == (training, sync) for r in records)
        expected = LAUNCHES.get(name, 2)
        if name in LAUNCHES and not training and options.get("test_stats") != "batch":
            expected -= 1  # the running statistics: no statistics pass over the tokens
        assert count == expected, (name, options, N, C, training, count)
    for r in records:
        where = f"{r['norm']} {r['options']} {r['N']}×{r['C']} {r['dtype']} sm_{r['arch']}: {r.get('kernel')}"
        assert "error" not in r, f"{where}: {r.get('error')}"
        assert r["spill_bytes"] == 0, f"{where} spills {r['spill_bytes']} bytes a thread ({r['registers']} registers)"
        if r["streams"]:
            assert r["resident_warps"] >= MIN_RESIDENT_WARPS, f"{where}: {r}"
            if r["norm"] in ("batch", "power"):
                multiprocessors = {90: 132, 80: 108}[r["arch"]]
                per_sm = resident_fit(r["registers"], r["warps"])
                assert r["resident_warps"] <= per_sm * r["warps"], f"{where}: {r}"
                assert r["programs"] <= max(per_sm * multiprocessors, r["grid"][0]), f"{where}: {r}"


@pytest.mark.slow
def test_batch_and_power_at_8192x1024_for_sm90():
    cases = [case("batch", 8192, 1024, "float16"), case("power", 8192, 1024, "float16")]
    records = compile_launches(90, cases)
    check(records, cases)
    streaming = [r for r in records if r["streams"]]
    assert [r["kernel"] for r in streaming] == [
        "_bn_stats_kernel", "_bn_apply_kernel", "_bn_grad_sums_kernel", "_bn_grad_input_kernel",
        "_power_stats_kernel", "_power_apply_kernel", "_power_grad_kernel"]
    # one wave that fills the GPU: the programs an H100 multiprocessor holds at the compiled
    # registers (CUDA's occupancy rule, written out here), times its 132 multiprocessors
    for r in streaming:
        fit = resident_fit(r["registers"], r["warps"])
        assert r["resident_warps"] == fit * r["warps"], r
        assert 0.9 * fit * 132 <= r["programs"] <= fit * 132, r


def resident_fit(registers, warps):
    """Programs of WARPS warps at REGISTERS registers a thread that an sm_80/sm_90 multiprocessor keeps resident
    (65,536 registers allocated 256 at a time to a warp, 64 warps, 32 programs; shared memory not binding here)."""
    per_warp = math.ceil(registers * 32 / 256) * 256
    return min(32, 64 // warps, 65536 // (per_warp * warps))


# the widest channel counts accepted: any for BatchNorm (16,384 here), MAX_GROUP_CHANNELS a
# PowerNorm group (one group; four groups of 16,384), MAX_ROW_CHANNELS a token
WIDEST = [case("batch", 1024, 16384, "float16"), case("power", 1024, MAX_GROUP_CHANNELS, "float16", groups=1),
          case("power", 1024, 4 * MAX_GROUP_CHANNELS, "float32", groups=4)]
WIDEST += [case(name, 1024, MAX_ROW_CHANNELS, dtype) for dtype in ("float16", "float32")
           for name in ("layer_simple", "adanorm", "rms", "scale")]
VARIANTS = [case("batch", 8192, 1000, "float16"), case("power", 8192, 1000, "float16", groups=8),
            case("rms", 8192, 1000, "float16"),  # channels not a multiple of 16: other kernels
            case("batch", 4096, 512, "float16", affine=False), case("batch", 4096, 512, "float16", training=False),
            case("batch", 4096, 512, "bfloat16", training=False, test_stats="batch"),
            case("batch", 4096, 512, "float32", sync=True), case("power", 4096, 512, "float16", affine=False),
            case("power", 4096, 512, "bfloat16", training=False), case("power", 4096, 512, "float32", sync=True),
            case("detach", 4096, 512, "float16", detach="mean"), case("detach", 4096, 512, "float16", detach="std"),
            case("detach", 4096, 512, "float16", detach="both")]


@pytest.mark.slow
@pytest.mark.parametrize("arch", [90, 80])
def test_every_launch_compiles_without_spills(arch):
    """The GPU check's sizes in every dtype, the widest channel counts accepted and the options
    that change a kernel."""
    cases = [case(name, N, C, dtype) for dtype in DTYPES for N, C in SIZES
             for name in ("batch", "power", "layer_simple", "adanorm", "rms", "scale")]
    cases += WIDEST + VARIANTS
    check(compile_launches(arch, cases), cases)
