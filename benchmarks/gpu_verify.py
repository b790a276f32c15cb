"""Correctness of the fused Triton kernels on one device: each fused norm (impl="triton") against
its torch path (impl="torch") and a float64 reference of its equations (reference64.py).

For every fused norm (DetachNorm in its three modes), dtype (float32, float16, bfloat16) and
T×B×C shape, with no padding, random lengths with an empty sentence, and all padding (plus one
non-contiguous input per dtype): the output, the input and parameter gradients of Σ y·gy and,
for BN, the input gradient of the RBN terms; for BN and PowerNorm three training steps (across
PowerNorm's warm-up), the running buffers after each (integer ones exactly) and an inference
forward, with padding rows exactly 0. Each case runs the kernels twice, which must agree
bitwise; and three steps of the module compiled with torch.compile(fullgraph=True) must equal
eager. A gap is max|got − want| / max|want|, as a fraction of the dtype's tolerance.
"""
import re
import time
from typing import List, NamedTuple

import torch

import reference64 as ref  # benchmarks/, this script's folder
from normplug.norms import create_norm

CONFIGS = [("batch", {}), ("power", {}), ("layer_simple", {}), ("detach", {"detach": "mean"}),
           ("detach", {"detach": "std"}), ("detach", {"detach": "both"}), ("adanorm", {}), ("rms", {}),
           ("scale", {})]
NORMS = list(dict.fromkeys(name for name, _ in CONFIGS))
SHAPES = [(37, 5, 70), (64, 128, 512), (256, 128, 1024), (8, 64, 4096), (1, 1, 512)]
SMOKE_SHAPES = [(9, 3, 70), (1, 1, 24)]
PADDINGS = ("none", "lengths", "all")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# relative to the largest reference value: float32 sums over up to 32k tokens; half precision is
# two roundings to its type apart (the parameters' and the result's)
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2 * 2.0 ** -10, torch.bfloat16: 2 * 2.0 ** -7}
BUFFER_TOLERANCE = 1e-5  # running statistics are float32 in every dtype
STEPS = 3  # training steps of BN and PowerNorm; PowerNorm's warm-up is 2 (t = 1, 2 warm, 3 not)
PENALTY = (3.0, 2.0)  # λ_μ, λ_σ of the RBN terms whose gradient is checked


class Verdict:
    """The worst gap of one norm over its cases, and what failed outright."""

    def __init__(self, norm):
        self.norm, self.worst, self.where, self.failures, self.cases, self.skipped = norm, 0.0, "", [], 0, 0
        self.finished = False  # every case planned for the norm ran (none skipped or interrupted)

    @property
    def correct(self):
        return self.finished and not self.failures and not self.skipped and self.worst <= 1

    def gap(self, got, want, tol, where):
        got, want = got.detach().double(), want.detach().double()
        if got.shape != want.shape:
            return self.fail(f"{where}: shape {tuple(got.shape)} != {tuple(want.shape)}")
        scale = want.abs().max().item() if want.numel() else 0.0
        diff = (got - want).abs().max().item() if want.numel() else 0.0
        ratio = (diff / scale if scale else (0.0 if diff == 0 else float("inf"))) / tol
        if not ratio <= self.worst:  # a NaN counts as the worst
            self.worst, self.where = (ratio if ratio == ratio else float("inf")), where

    def exact(self, got, want, where):
        if not torch.equal(got, want):
            self.fail(f"{where}: not exactly equal")

    def fail(self, message):
        self.failures.append(message)

    def summary(self):
        if not self.finished and not self.cases:
            return "not verified"
        text = ("" if self.finished else "unfinished; ") + f"worst={self.worst:.2g} of tolerance"
        text += f" at {self.where}" if self.where else ""
        if self.skipped:
            text += f"; {self.skipped} cases not run (deadline)"
        if self.failures:
            text += f"; {len(self.failures)} failed, first: {self.failures[0]}"
        return text

    def line(self, speed="n/a"):
        return f"VERDICT {self.norm} correct={'yes' if self.correct else 'no'} {self.summary()} speed={speed}"


def one_line(err):
    """An exception in one line: its type, first line, and the deepest frame in normplug it names."""
    text = str(err).strip()
    frames = re.findall(r'File "[^"]*/(normplug/[^"]+)", line (\d+)', text)
    where = f" (at {frames[-1][0]}:{frames[-1][1]})" if frames else ""
    return f"{type(err).__name__}: {(text.splitlines() or [''])[0][:160]}{where}"


class Case(NamedTuple):
    xs: List[torch.Tensor]  # one input per step
    gys: List[torch.Tensor]
    pad: torch.Tensor  # B×T, True at padding (per-token norms ignore it)
    label: str


def make_case(shape, dtype, padding, device, seed, steps, contiguous=True):
    """Inputs drawn on ``device`` (a host draw of the largest shapes would take most of the check)."""
    T, B, C = shape
    gen = torch.Generator(device=device).manual_seed(seed)

    def draw(*size, uniform=False):
        return (torch.rand if uniform else torch.randn)(*size, generator=gen, device=device)

    if padding == "lengths":
        lengths = 1 + (draw(B, uniform=True) * T).long().clamp(max=T - 1)
        lengths[B // 2] = 0 if B > 1 else T  # an empty sentence
    else:
        lengths = torch.full((B,), T if padding == "none" else 0, device=device)
    xs, gys = [], []
    for _ in range(steps):  # channels and tokens with their own offsets and spreads
        x = draw(T, B, C) * (0.5 + draw(C, uniform=True)) * (0.5 + draw(T, B, 1, uniform=True))
        x = (x + 0.5 * draw(C) + 0.3 * draw(T, B, 1)).to(dtype)
        if not contiguous:  # a slice of a wider, batch-major buffer: strided rows, transposed
            wide = torch.zeros(B, T, C + 3, device=device, dtype=dtype)
            wide[..., :C] = x.transpose(0, 1)
            x = wide[..., :C].transpose(0, 1)
        xs.append(x)
        gys.append(draw(T, B, C).to(dtype))
    pad = torch.arange(T, device=device)[None, :] >= lengths[:, None]
    label = f"{str(dtype)[6:]} {T}x{B}x{C} {padding}" + ("" if contiguous else " non-contiguous")
    return Case(xs, gys, pad, label)


def power_groups(C):
    """Groups of 64 to 128 channels, as the recipes' attention heads give, at most 16."""
    return max(g for g in (1, 2, 4, 8, 16) if C % g == 0 and C // g >= min(64, C))


def build_pair(name, opts, C, dtype, device, seed):
    """The torch and the Triton build of one norm, with the same random parameters and buffers."""
    options = dict(opts)
    if name == "batch":
        options["momentum"] = 0.3  # a visible running-statistics step
    if name == "power":
        options.update(groups=power_groups(C), warmup_updates=2)
    torch_norm = create_norm(name, C, impl="torch", **options)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, p in torch_norm.named_parameters():
            p.copy_((1 if pname in ("weight", "g") else 0) * p + 0.5 * torch.randn(p.shape, generator=gen))
        for bname, b in torch_norm.named_buffers():
            if b.is_floating_point():  # σ̂² far above the batch's variance: |σ̂² − σ²_B| has one sign
                b.copy_({"running_var": 4.0, "running_psi2": 1.0}.get(bname, 0.0)
                        + torch.rand(b.shape, generator=gen) * (0.2 if bname == "nu" else 1.0))
    triton_norm = create_norm(name, C, impl="triton", **options)
    triton_norm.load_state_dict(torch_norm.state_dict())
    return torch_norm.to(device, dtype), triton_norm.to(device, dtype)


def module_step(norm, x, gy, pad, call=None):
    """{output, gradients of Σ y·gy (and of the RBN terms for BN)} of one training step of
    ``norm`` (called through ``call``, its compiled form, if given)."""
    xi = x.detach().requires_grad_(True)  # a leaf with x's strides
    names, params = zip(*norm.named_parameters()) if list(norm.parameters()) else ((), ())
    y = (norm if call is None else call)(xi, pad)
    out = {"y": y.detach()}
    stats = norm.discrepancy() if getattr(norm, "supports_rbn", False) else None
    grads = torch.autograd.grad(y, [xi, *params], gy, retain_graph=stats is not None)
    out.update(dx=grads[0], **{f"d{n}": g for n, g in zip(names, grads[1:])})
    if stats is not None:
        out["dx_rbn"] = torch.autograd.grad(PENALTY[0] * stats.rbn_mean + PENALTY[1] * stats.rbn_var, [xi])[0]
    return out


def reference_step(name, opts, norm, x, gy, pad, state, step):
    """The float64 reference's step for ``norm``'s parameters (as rounded to its dtype)."""
    x64, gy64 = x.double(), gy.double()
    params = {n: p.detach().double() for n, p in norm.named_parameters()}
    if name in ("batch", "power"):
        real = ~pad.t().unsqueeze(-1)
        if name == "batch":
            return ref.batch_step(x64, real, gy64, params["weight"], params["bias"], state, norm.eps,
                                  norm.momentum, PENALTY)
        return ref.power_step(x64, real, gy64, params["weight"], params["bias"], state, step, norm.eps,
                              norm.groups, norm.warmup_updates, norm.alpha_fwd, norm.alpha_bkw)
    (pname, param), = params.items() if params else [(None, None)]
    leaves = [x64.requires_grad_(True)] + ([param.requires_grad_(True)] if param is not None else [])
    y = ref.per_token(name, opts, x64, param, norm.eps)
    grads = torch.autograd.grad(y, leaves, gy64)
    return {"y": y.detach(), "dx": grads[0], **({f"d{pname}": grads[1]} if param is not None else {})}


def reference_eval(name, norm, x, pad, state):
    real = ~pad.t().unsqueeze(-1)
    w, b = norm.weight.detach().double(), norm.bias.detach().double()
    if name == "batch":
        return ref.batch_eval(x.double(), real, w, b, state, norm.eps)
    return ref.power_eval(x.double(), real, w, b, state, norm.eps, norm.groups)


def check_case(verdict, name, opts, case, dtype, device, seed):
    tol = TOLERANCE[dtype]
    torch_norm, triton_norm = build_pair(name, opts, case.xs[0].shape[-1], dtype, device, seed)
    twin = build_pair(name, opts, case.xs[0].shape[-1], dtype, device, seed)[1]
    batch_stat = name in ("batch", "power")
    state = {n: b.detach().double() if b.is_floating_point() else int(b)
             for n, b in torch_norm.named_buffers()}
    for step, (x, gy) in enumerate(zip(case.xs, case.gys), start=1):
        where = f"{case.label}" + (f" step {step}" if batch_stat else "")
        for norm in (torch_norm, triton_norm, twin):
            if name == "power":
                norm.set_num_updates(step - 1)
        want, got = module_step(torch_norm, x, gy, case.pad), module_step(triton_norm, x, gy, case.pad)
        again = module_step(twin, x, gy, case.pad)
        exact = reference_step(name, opts, torch_norm, x, gy, case.pad, state, step)
        for key, value in got.items():
            verdict.gap(value, want[key], tol, f"{where}: {key} vs torch")
            verdict.gap(value, exact[key], tol, f"{where}: {key} vs float64")
            verdict.gap(want[key], exact[key], tol, f"{where}: {key} of the torch path vs float64")
            verdict.exact(again[key], value, f"{where}: {key} of a second run")
            if batch_stat and key not in ("dweight", "dbias"):
                at_pad = value[case.pad.t()]
                verdict.exact(at_pad, torch.zeros_like(at_pad), f"{where}: {key} at padding")
        buffers = zip(triton_norm.named_buffers(), torch_norm.named_buffers(), twin.named_buffers())
        for (bname, b), (_, b_torch), (_, b_twin) in buffers:
            verdict.exact(b_twin, b, f"{where}: {bname} of a second run")
            if b.is_floating_point():
                verdict.gap(b, b_torch, BUFFER_TOLERANCE, f"{where}: {bname} vs torch")
                if bname in state:
                    verdict.gap(b, state[bname], BUFFER_TOLERANCE, f"{where}: {bname} vs float64")
            else:
                verdict.exact(b, b_torch, f"{where}: {bname} vs torch")
                if bname == "num_batches_tracked":
                    verdict.exact(b, torch.tensor(state[bname], device=b.device), f"{where}: {bname} vs steps")
    if batch_stat:  # inference with the population statistics
        with torch.no_grad():
            x = case.xs[-1]
            got = triton_norm.eval()(x, case.pad)
            verdict.gap(got, torch_norm.eval()(x, case.pad), tol, f"{case.label} eval: y vs torch")
            verdict.gap(got, reference_eval(name, triton_norm, x, case.pad, state), tol,
                        f"{case.label} eval: y vs float64")
    verdict.cases += 1


def check_compiled(verdict, name, opts, case, dtype, device, backend):
    """Three steps of torch.compile(fullgraph=True) of the Triton module against eager."""
    eager, compiled = (build_pair(name, opts, case.xs[0].shape[-1], dtype, device, 7)[1] for _ in range(2))
    torch._dynamo.reset()
    call = torch.compile(compiled, fullgraph=True, dynamic=False, backend=backend)
    try:
        for step, (x, gy) in enumerate(zip(case.xs, case.gys), start=1):
            for norm in (eager, compiled):
                if name == "power":
                    norm.set_num_updates(step - 1)
            want, got = module_step(eager, x, gy, case.pad), module_step(compiled, x, gy, case.pad, call)
            for key, value in got.items():
                verdict.gap(value, want[key], TOLERANCE[dtype], f"compiled {case.label} step {step}: {key}")
            for (bname, a), (_, b) in zip(compiled.named_buffers(), eager.named_buffers()):
                verdict.gap(a, b, BUFFER_TOLERANCE, f"compiled {case.label} step {step}: {bname}")
    except Exception as err:  # noqa: BLE001 (a failed trace is this check's finding, reported in one line)
        verdict.fail(f"torch.compile({backend}, fullgraph): {one_line(err)}")


def verify(device, smoke=False, deadline=float("inf"), norms=None, dtypes=DTYPES, emit=print, verdicts=None):
    """Fill and return ``verdicts``, {norm: Verdict}, as the cases run (an interrupted run keeps
    what it checked); cases left when ``deadline`` (time.monotonic()) passes count as not run."""
    shapes = SMOKE_SHAPES if smoke else SHAPES
    backend = "aot_eager" if str(device) == "cpu" else "inductor"
    verdicts = {} if verdicts is None else verdicts
    for name in norms or NORMS:
        verdict = verdicts[name] = Verdict(name)
        start = time.monotonic()
        for cname, opts in (c for c in CONFIGS if c[0] == name):
            mode = f"detach={opts['detach']} " if opts else ""
            plan = [(dtype, shape, padding, True) for dtype in dtypes for shape in shapes for padding in PADDINGS]
            plan += [(dtype, shapes[0], "lengths", False) for dtype in dtypes]  # non-contiguous
            for seed, (dtype, shape, padding, contiguous) in enumerate(plan):
                if time.monotonic() > deadline:
                    verdict.skipped += 1
                    continue
                steps = STEPS if name in ("batch", "power") else 1
                case = make_case(shape, dtype, padding, device, seed, steps, contiguous)
                case = case._replace(label=mode + case.label)
                try:
                    check_case(verdict, cname, opts, case, dtype, device, seed)
                except Exception as err:  # noqa: BLE001 (a crash is a finding; the other cases still run)
                    verdict.fail(f"{case.label}: {one_line(err)}")
            if time.monotonic() > deadline:
                verdict.skipped += 1
                continue
            case = make_case(shapes[0], torch.float16, "lengths", device, 99, STEPS)
            case = case._replace(label=mode + case.label)
            check_compiled(verdict, cname, opts, case, torch.float16, device, backend)
        verdict.finished = True
        emit(f"verify {name}: {verdict.cases} cases in {time.monotonic() - start:.0f} s, "
             f"correct={'yes' if verdict.correct else 'no'}, {verdict.summary()}")
    return verdicts
