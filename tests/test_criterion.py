"""label_smoothed_cross_entropy_rbn: at zero weights it is fairseq's label_smoothed_cross_entropy,
bit for bit (loss, every gradient), and still logs TID, so that BN and PowerNorm baselines
record their training-inference discrepancy; with weights, its penalty, logged terms, TIDs
and the penalty's gradient match a float64 reference written from Wang, Wu & Huang 2022."""
import copy
from typing import NamedTuple

import pytest
import torch

from conftest import TINY_MODEL, build_model, parse_train_args

import normplug  # noqa: F401  (registers the plugin)

TINY_TRANSLATION = [*TINY_MODEL, "--share-all-embeddings", "--dropout", "0.0", "--label-smoothing", "0.1"]


def build(data, arch, *criterion):
    """(task, model, args): the tiny model with the options of ``criterion``."""
    return build_model(data, arch, *TINY_TRANSLATION, *criterion)


def parse(data, arch, *criterion):
    return parse_train_args(data, arch, *TINY_TRANSLATION, *criterion)


def sample_of(task):
    """One real batch of the tiny corpus (padding on both sides)."""
    task.load_dataset("valid")
    itr = task.get_batch_iterator(dataset=task.dataset("valid"), max_tokens=400, seed=1)
    return next(iter(itr.next_epoch_itr(shuffle=False)))


def loss_and_grads(task, args, model, sample):
    criterion = task.build_criterion(args)
    model = copy.deepcopy(model)  # same weights and buffers for every criterion
    model.train()
    loss, sample_size, logs = criterion(model, sample)
    loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    return loss.detach(), grads, logs


def plain_and_rbn(tiny_data, arch, mean_weight, var_weight):
    """(loss, grads) of label_smoothed_cross_entropy and (loss, grads, logs) of the RBN
    criterion with the given weights, for the same model and sample."""
    task, model, plain_args = build(tiny_data, arch, "--criterion", "label_smoothed_cross_entropy")
    rbn_args = parse(tiny_data, arch, "--criterion", "label_smoothed_cross_entropy_rbn",
                     "--rbn-mean-weight", str(mean_weight), "--rbn-var-weight", str(var_weight))
    sample = sample_of(task)
    return loss_and_grads(task, plain_args, model, sample)[:2], loss_and_grads(task, rbn_args, model, sample)


@pytest.mark.parametrize("arch", ["transformer_iwslt_de_en_bn", "transformer_iwslt_de_en_pn_prenorm"])
def test_zero_weights_are_plain_label_smoothing(tiny_data, arch):
    (loss, grads), (loss0, grads0, logs0) = plain_and_rbn(tiny_data, arch, 0, 0)
    assert torch.equal(loss, loss0)
    assert grads.keys() == grads0.keys()
    for name, g in grads.items():
        assert (g is None) == (grads0[name] is None), name
        assert g is None or torch.equal(g, grads0[name]), name
    # ... and the run logs TID of every batch-statistics layer, with no penalty
    assert logs0["rbn_penalty"] == 0 and logs0["rbn_forwards"] == 1
    assert [k for k in logs0 if k.startswith("tid_var/")]
    assert torch.isfinite(torch.as_tensor(logs0["tid_var"])) and logs0["tid_var"] > 0


# --------------------------------------------------------------------------- the penalty and TIDs
# Wang, Wu & Huang 2022, written out in float64 from each layer's input and its stream's
# padding mask (taken from the sample, not from what the model passes its norms):
#   BN layer:  μ_B = Σ m·x / n,  σ²_B = Σ m·(x − μ_B)² / n  (biased, real tokens only),
#              μ̂ ← (1 − ρ)μ̂ + ρ μ_B,  σ̂² ← (1 − ρ)σ̂² + ρ σ²_B  (ρ = --bn-momentum),
#   L_RBN = λ_μ Σ_layers Σ_c (μ̂ − μ_B)² + λ_σ Σ_layers Σ_c |σ̂² − σ²_B|  over BN layers only,
#   with μ̂, σ̂² (after this step's update) constants;
#   TID: mean_c |μ̂ − μ_B| / σ_B and mean_c |σ̂ / σ_B − 1|, σ without ε.
# PowerNorm layers (Shen et al. 2020, released rule after warm-up): σ²_B = Σ m·z² / n of the
# group-scaled input z, ψ² ← α_f ψ² + (1 − α_f) σ²_B; only the variance TID applies.
MOMENTUM, ALPHA_FWD, HEADS = 0.2, 0.9, 2
LAMBDA_MEAN, LAMBDA_VAR = 0.7, 0.3

# (architecture, extra flags, {logged site: (module path, norm)}): BN and PowerNorm layers
# in both stacks, two encoder layers, a non-default momentum
MIXED = {
    "pre": ("transformer_iwslt_de_en_bn_prenorm",
            ["--encoder-final-norm", "power", "--decoder-cross-attn-norm", "batch",
             "--decoder-ffn-norm", "power"],
            {"enc0.self_attn": ("encoder.layers.0.self_attn_layer_norm", "batch"),
             "enc0.ffn": ("encoder.layers.0.final_layer_norm", "batch"),
             "enc1.self_attn": ("encoder.layers.1.self_attn_layer_norm", "batch"),
             "enc1.ffn": ("encoder.layers.1.final_layer_norm", "batch"),
             "enc.final": ("encoder.final_norm", "power"),
             "dec0.cross_attn": ("decoder.layers.0.encoder_attn_layer_norm", "batch"),
             "dec0.ffn": ("decoder.layers.0.final_layer_norm", "power")}),
    "post": ("transformer_iwslt_de_en_bn",
             ["--encoder-ffn-norm", "power", "--decoder-self-attn-norm", "power",
              "--decoder-ffn-norm", "batch"],
             {"enc0.self_attn": ("encoder.layers.0.self_attn_layer_norm", "batch"),
              "enc0.ffn": ("encoder.layers.0.final_layer_norm", "power"),
              "enc1.self_attn": ("encoder.layers.1.self_attn_layer_norm", "batch"),
              "enc1.ffn": ("encoder.layers.1.final_layer_norm", "power"),
              "dec0.self_attn": ("decoder.layers.0.self_attn_layer_norm", "power"),
              "dec0.ffn": ("decoder.layers.0.final_layer_norm", "batch")}),
}


def ref_group_scale(h, groups):
    """Each token's channel groups over sqrt(mean of squares + 1e-5) (h: n×C)."""
    n, c = h.shape
    g = h.reshape(n, groups, c // groups)
    return (g / torch.sqrt((g * g).mean(-1, keepdim=True) + 1e-5)).reshape(n, c)


def close(got, want, what, rtol, atol):
    torch.testing.assert_close(got.double(), want.double(), rtol=rtol, atol=atol,
                               msg=lambda m: f"{what}: {m}")


def reference_terms(inputs, masks, before, sites):
    """Per site, in float64: the norm's kind, its RBN terms (with their graph back to the
    layer's input), its TIDs and its running statistics after the update."""
    out = {}
    for site, (path, kind) in sites.items():
        h = inputs[site].double()[~masks[site].t()]  # n×C, real tokens only
        n = h.shape[0]
        if kind == "batch":
            mu = h.sum(0) / n
            var = ((h - mu) ** 2).sum(0) / n
            mu_hat = ((1 - MOMENTUM) * before[path + ".running_mean"].double() + MOMENTUM * mu).detach()
            var_hat = ((1 - MOMENTUM) * before[path + ".running_var"].double() + MOMENTUM * var).detach()
            sigma = var.detach().sqrt()
            out[site] = dict(
                kind=kind, rbn_mean=((mu_hat - mu) ** 2).sum(), rbn_var=(var_hat - var).abs().sum(),
                tid_mean=((mu_hat - mu.detach()).abs() / sigma).mean(),
                tid_var=(var_hat.sqrt() / sigma - 1).abs().mean(),
                stats={path + ".running_mean": mu_hat, path + ".running_var": var_hat})
        else:
            z = ref_group_scale(h.detach(), HEADS)
            sigma2 = (z * z).sum(0) / n
            psi2 = ALPHA_FWD * before[path + ".running_psi2"].double() + (1 - ALPHA_FWD) * sigma2
            out[site] = dict(kind=kind, tid_var=(psi2.sqrt() / sigma2.sqrt() - 1).abs().mean(),
                             stats={path + ".running_psi2": psi2})
    return out


class PenaltyStep(NamedTuple):
    """One measured step of an RBN criterion, and what the reference needs to check it."""

    before: dict  # the model's state before the step
    base_loss: torch.Tensor  # the base criterion's loss on the same model and sample
    model: torch.nn.Module  # the copy the RBN criterion stepped
    criterion: object
    sample: dict
    inputs: dict  # logged site -> the input its norm received
    output: tuple  # the model's output
    loss: torch.Tensor
    logs: dict


def penalty_step(task, model, base_args, rbn_args, sample, other, sites):
    """The penalty check's set-up. One earlier training forward on ``other`` moves the running
    statistics off their initial values, and the measured step is after PowerNorm's warm-up
    (ψ², not σ²_B, in use); then the base criterion's loss, and the RBN criterion's step on a
    copy of the model whose norms at ``sites`` ({site: (module path, norm)}) record their inputs."""
    model.train()
    model.set_num_updates(0)
    with torch.no_grad():
        model(**other["net_input"])
    model.set_num_updates(1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    modules = dict(model.named_modules())
    assert {site: modules[path].norm_name for site, (path, _) in sites.items()} == \
        {site: kind for site, (_, kind) in sites.items()}
    base_loss, _, _ = loss_and_grads(task, base_args, model, sample)

    rbn_model = copy.deepcopy(model)
    inputs, net = {}, {}
    rbn_modules = dict(rbn_model.named_modules())
    for site, (path, _) in sites.items():
        rbn_modules[path].register_forward_pre_hook(lambda m, args, site=site: inputs.__setitem__(site, args[0]))
    rbn_model.register_forward_hook(lambda m, args, out: net.__setitem__("out", out))
    criterion = task.build_criterion(rbn_args)
    loss, _, logs = criterion(rbn_model, sample)
    return PenaltyStep(before, base_loss, rbn_model, criterion, sample, inputs, net["out"], loss, logs)


def check_against_reference(step, masks, sites):
    """The step's running statistics, loss, logged terms and per-site TIDs against the float64
    reference, from each site's input and its stream's mask ({site: B×T mask}); returns the
    reference's terms per site and its penalty (with its graph back to the inputs)."""
    ref = reference_terms(step.inputs, masks, step.before, sites)
    bn = [r for r in ref.values() if r["kind"] == "batch"]
    ref_mean = sum(r["rbn_mean"] for r in bn)
    ref_var = sum(r["rbn_var"] for r in bn)
    ref_penalty = LAMBDA_MEAN * ref_mean + LAMBDA_VAR * ref_var
    assert float(ref_penalty.detach()) > 1  # not a vanishing term

    # running statistics: the configured momentum, real tokens of the stream only
    state = step.model.state_dict()
    for r in ref.values():
        for key, want in r["stats"].items():
            close(state[key], want, key, rtol=1e-5, atol=1e-6)

    # the loss: the base loss plus the penalty; the logs keep them apart
    logs, ref_penalty_value = step.logs, ref_penalty.detach()
    assert torch.equal(logs["task_loss"], step.base_loss)
    close((step.loss.detach() - step.base_loss).squeeze(), ref_penalty_value, "loss - base loss",  # adaptive: 1×
          rtol=1e-5, atol=4 * torch.finfo(torch.float32).eps * float(step.loss.detach()))  # a float32 loss of a few hundred
    close(logs["rbn_penalty"], ref_penalty_value, "rbn_penalty", rtol=1e-5, atol=0)
    close(logs["rbn_mean"], ref_mean.detach(), "rbn_mean", rtol=1e-5, atol=0)
    close(logs["rbn_var"], ref_var.detach(), "rbn_var", rtol=1e-5, atol=0)

    # TIDs of every batch-statistics layer, PowerNorm's included (variance only)
    for site, r in ref.items():
        close(logs[f"tid_var/{site}"], r["tid_var"], f"tid_var/{site}", rtol=1e-4, atol=1e-7)
        if r["kind"] == "batch":
            close(logs[f"tid_mean/{site}"], r["tid_mean"], f"tid_mean/{site}", rtol=1e-4, atol=1e-7)
    return ref, ref_penalty


def check_penalty_gradient(step, ref_penalty):
    """The penalty's gradient reaches the parameters through μ_B and σ²_B only: the criterion's
    loss minus the task loss of the same forward, against the reference's, for every parameter."""
    task_loss, _ = step.criterion.compute_loss(step.model, step.output, step.sample)
    params = list(step.model.named_parameters())
    got = torch.autograd.grad(step.loss - task_loss, [p for _, p in params], retain_graph=True, allow_unused=True)
    want = torch.autograd.grad(ref_penalty, [p for _, p in params], allow_unused=True)
    scale = max(float(w.abs().max()) for w in want if w is not None)
    reached = 0
    for (name, p), g, w in zip(params, got, want):
        g = torch.zeros_like(p) if g is None else g
        w = torch.zeros_like(p) if w is None else w
        reached += bool(w.abs().max() > 1e-3 * scale)
        close(g, w, name, rtol=1e-4, atol=1e-6 * scale)
    assert reached > 10


@pytest.mark.parametrize("setting", sorted(MIXED))
def test_penalty_and_tid_match_the_equations(tiny_data, setting):
    arch, flags, sites = MIXED[setting]
    # α_b = 1: PowerNorm's backward without its ν term is linear in the incoming gradient,
    # so the penalty's share of a gradient is defined where it crosses a PowerNorm layer
    common = ["--encoder-layers", "2", *flags, "--bn-momentum", str(MOMENTUM), "--power-warmup", "1",
              "--power-alpha-bkw", "1"]
    task, model, plain_args = build(tiny_data, arch, *common, "--criterion", "label_smoothed_cross_entropy")
    rbn_args = parse(tiny_data, arch, *common, "--criterion", "label_smoothed_cross_entropy_rbn",
                     "--rbn-mean-weight", str(LAMBDA_MEAN), "--rbn-var-weight", str(LAMBDA_VAR))
    task.load_dataset("valid")
    sample, other = list(task.get_batch_iterator(
        dataset=task.dataset("valid"), max_tokens=160, seed=1, disable_iterator_cache=True,
    ).next_epoch_itr(shuffle=False))[:2]
    step = penalty_step(task, model, plain_args, rbn_args, sample, other, sites)

    pad = task.source_dictionary.pad()
    src_mask = sample["net_input"]["src_tokens"].eq(pad)
    tgt_mask = sample["net_input"]["prev_output_tokens"].eq(pad)
    assert src_mask.any() and tgt_mask.any()  # padding on both sides
    masks = {site: src_mask if site.startswith("enc") else tgt_mask for site in sites}
    ref, ref_penalty = check_against_reference(step, masks, sites)

    # PowerNorm has no mean statistic: no mean TID of its own, none in the average
    logs = step.logs
    bn = [r for r in ref.values() if r["kind"] == "batch"]
    assert {k for k in logs if k.startswith("tid_")} == {"tid_mean", "tid_var"} | {
        f"tid_var/{s}" for s in sites} | {f"tid_mean/{s}" for s, r in ref.items() if r["kind"] == "batch"}
    close(logs["tid_mean"], torch.stack([r["tid_mean"] for r in bn]).mean(), "tid_mean", rtol=1e-4, atol=1e-7)
    close(logs["tid_var"], torch.stack([r["tid_var"] for r in ref.values()]).mean(), "tid_var",
          rtol=1e-4, atol=1e-7)
    check_penalty_gradient(step, ref_penalty)
