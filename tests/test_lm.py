"""norm_transformer_lm and its criteria, in process: every architecture builds and trains,
the placements, the LayerNorm Pre-Norm model is fairseq's transformer_lm, causality (eval:
a full forward equals token-by-token decoding; training pools the batch, future included,
as documented), padding, the RBN penalty against the float64 reference of
test_criterion.py, zero weights = the base criteria, and the one-line errors."""
import copy

import pytest
import torch

from conftest import USER_DIR
from test_criterion import LAMBDA_MEAN, LAMBDA_VAR, MOMENTUM, close, reference_terms

from fairseq import options, tasks, utils

import normplug  # noqa: F401  (registers the plugin)
from normplug.models.architectures import KINDS
from normplug.models.architectures_lm import LM_ARCHITECTURES, LM_SHAPES
from normplug.models.norm_model import site_name
from normplug.norms import NormConfigError

# 2 heads: test_criterion's reference group-scales PowerNorm inputs in 2 groups
TINY_LM = ["--decoder-layers", "2", "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "32",
           "--decoder-attention-heads", "2", "--dropout", "0", "--tokens-per-sample", "16",
           "--sample-break-mode", "eos"]
TINY_CUTOFFS = ["--adaptive-input-cutoff", "10,20", "--adaptive-softmax-cutoff", "10,20"]  # 34 words


def parse(data, arch, *extra):
    """fairseq's parsing and architecture function, at the tiny size (WT103's cutoffs scaled down)."""
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        str(data), "--task", "language_modeling", "--user-dir", USER_DIR, "--arch", arch, "--cpu", *TINY_LM,
        *(TINY_CUTOFFS if "wt103" in arch else []), *extra])
    utils.import_user_module(args)
    return args


def build(data, arch, *extra):
    args = parse(data, arch, *extra)
    task = tasks.setup_task(args)
    torch.manual_seed(0)
    return task, task.build_model(args), args


def random_tokens(task, batch, length, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(task.dictionary.nspecial, len(task.dictionary), (batch, length), generator=g)


def eos_sample(task, lines=range(6), split="valid"):
    """Lines of the corpus as one batch of --sample-break-mode eos (right-padded)."""
    if split not in task.datasets:
        task.load_dataset(split)
    dataset = task.dataset(split)
    return dataset.collater([dataset[i] for i in lines])


def log_probs(model, tokens, **kwargs):
    return model.get_normalized_probs(model(tokens, **kwargs), log_probs=True)


def move_statistics(model, task, steps=3):
    """A few training forwards, so population statistics are off their initial values."""
    model.train()
    model.set_num_updates(2)  # past --power-warmup 1: PowerNorm uses its running ψ²
    with torch.no_grad():
        for step in range(steps):
            model(random_tokens(task, 4, 9, seed=10 + step))
    model.eval()


def test_every_lm_architecture_builds_and_trains_one_step(lm_data):
    assert set(LM_ARCHITECTURES) == {f"{shape}_{kind}" for shape in LM_SHAPES for kind in KINDS}
    for arch in sorted(LM_ARCHITECTURES):
        criterion = ["--criterion", "adaptive_loss", "--ddp-backend", "legacy_ddp"] if "wt103" in arch else []
        task, model, args = build(lm_data, arch, *criterion)
        sample = eos_sample(task)
        model.train()
        loss, _, _ = task.build_criterion(args)(model, sample)
        assert torch.isfinite(loss), arch
        loss.backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        assert all(g is not None and torch.isfinite(g).all() for g in grads), arch
        assert (model.decoder.adaptive_softmax is not None) == ("wt103" in arch)


def norm_kinds(model):
    return {site_name(n): m.norm_name for n, m in model.named_modules() if hasattr(m, "norm_name")}


def test_placements(lm_data):
    """bn/rbn/pn: the batch-statistics norm at every layer's self-attention and FFN sites,
    LayerNorm at the final site of a Pre-Norm stack; the other kinds everywhere."""
    sublayers = {f"dec{i}.{s}" for i in range(2) for s in ("attn", "ffn")}
    for kind, (every_site, batch_norm) in KINDS.items():
        _, model, _ = build(lm_data, f"transformer_lm_ptb_{kind}")
        assert norm_kinds(model) == dict.fromkeys(sublayers, batch_norm or every_site), kind
    _, model, _ = build(lm_data, "transformer_lm_wt103_pn", "--decoder-normalize-before", "--warmup-updates", "7")
    norms = {site_name(n): m for n, m in model.named_modules() if hasattr(m, "norm_name")}
    assert {k: m.norm_name for k, m in norms.items()} == {**dict.fromkeys(sublayers, "power"), "dec.final": "layer"}
    assert norms["dec0.attn"].groups == 2 and norms["dec1.ffn"].warmup_updates == 7
    _, model, _ = build(lm_data, "norm_transformer_lm", "--decoder-normalize-before", "--decoder-norm", "rms",
                        "--decoder-ffn-norm", "scale", "--decoder-final-norm", "adanorm")
    assert norm_kinds(model) == {"dec0.attn": "rms", "dec1.attn": "rms", "dec0.ffn": "scale", "dec1.ffn": "scale",
                                 "dec.final": "adanorm"}


def test_reference_sizes():
    """Full-size shapes of the reference scripts (run_ptb.sh, run_wt103.sh); Post-Norm unless asked."""
    def full(arch, *extra):
        return options.parse_args_and_arch(options.get_training_parser(), [
            "data", "--task", "language_modeling", "--user-dir", USER_DIR, "--arch", arch, *extra])

    shape = ("decoder_layers", "decoder_embed_dim", "decoder_ffn_embed_dim", "decoder_attention_heads",
             "dropout", "activation_dropout", "attention_dropout", "decoder_normalize_before")
    ptb = full("transformer_lm_ptb_bn")
    assert [getattr(ptb, k) for k in shape] == [3, 256, 2100, 1, 0.3, 0.3, 0.0, False]
    assert ptb.share_decoder_input_output_embed and ptb.adaptive_softmax_cutoff is None
    wt = full("transformer_lm_wt103_rbn")
    assert [getattr(wt, k) for k in shape] == [6, 256, 2100, 1, 0.1, 0.1, 0.0, False]
    assert wt.adaptive_input and wt.tie_adaptive_weights and wt.tie_adaptive_proj
    assert wt.adaptive_input_cutoff == wt.adaptive_softmax_cutoff == "20000,40000,200000"
    assert wt.adaptive_input_factor == wt.adaptive_softmax_factor == 1
    pre = full("transformer_lm_ptb_ln", "--decoder-normalize-before", "--dropout", "0.2")
    assert pre.decoder_normalize_before and pre.activation_dropout == 0.2  # the FFN's dropout follows --dropout


def test_prenorm_layer_model_is_fairseqs_transformer_lm(lm_data):
    """LayerNorm at every site, Pre-Norm (fairseq's transformer_lm forces it): same weights,
    same outputs and gradients as fairseq's model, through the adaptive input and softmax."""
    # fairseq's transformer_lm takes its dataclass's 512 for the unset input/output dims
    flags = ["--decoder-normalize-before", "--decoder-input-dim", "16", "--decoder-output-dim", "16", *TINY_CUTOFFS, "--adaptive-input", "--adaptive-input-factor", "2",
             "--adaptive-softmax-factor", "2", "--tie-adaptive-weights", "--tie-adaptive-proj"]
    flags += ["--criterion", "adaptive_loss", "--ddp-backend", "legacy_ddp"]
    task, ours, args = build(lm_data, "norm_transformer_lm", *flags)
    _, stock, _ = build(lm_data, "transformer_lm", *flags)
    stock.load_state_dict({k.replace(".final_norm.", ".layer_norm."): v for k, v in ours.state_dict().items()})
    upgraded = dict(stock.state_dict())
    ours.upgrade_state_dict(upgraded)
    ours.load_state_dict(upgraded, strict=True)
    sample = eos_sample(task)
    tokens = sample["net_input"]["src_tokens"]
    assert tokens.eq(task.dictionary.pad()).any()
    for mode in ("eval", "train"):
        getattr(ours, mode)()
        getattr(stock, mode)()
        with torch.no_grad():
            torch.testing.assert_close(log_probs(ours, tokens), log_probs(stock, tokens), rtol=0, atol=1e-6)
    criterion = task.build_criterion(args)  # fairseq's adaptive log-probabilities have no backward
    for model in (ours, stock):
        criterion(model, sample)[0].backward()
    stock_params = dict(stock.named_parameters())
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, stock_params[name.replace("final_norm", "layer_norm")].grad,
                                   rtol=1e-5, atol=1e-6)


CAUSAL = [("norm_transformer_lm", ["--decoder-norm", norm]) for norm in ("layer", "batch", "power")] + [
    ("transformer_lm_wt103_bn", [])]


@pytest.mark.parametrize("prenorm", [False, True])
@pytest.mark.parametrize("arch,flags", CAUSAL, ids=["ln", "bn", "pn", "wt103_bn"])
def test_eval_full_forward_equals_incremental_decoding(lm_data, arch, flags, prenorm):
    """In eval a position's log-probabilities do not depend on later tokens: the full forward
    gives what token-by-token decoding (incremental_state) gives."""
    extra = ["--power-warmup", "1", *flags] + (["--decoder-normalize-before"] if prenorm else [])
    task, model, _ = build(lm_data, arch, *extra)
    move_statistics(model, task)
    tokens = random_tokens(task, 3, 7)
    with torch.no_grad():
        full = log_probs(model, tokens)
        state = {}
        steps = [log_probs(model, tokens[:, :t + 1], incremental_state=state) for t in range(tokens.shape[1])]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm", ["layer", "batch", "power"])
def test_training_statistics_pool_later_tokens_eval_does_not(lm_data, norm):
    """What the model docstring states: in training, BN's batch statistics (and PowerNorm's in
    its warm-up) mix every position of the batch, so a later token changes an earlier
    position's output; per-token norms and eval do not."""
    task, model, _ = build(lm_data, "norm_transformer_lm", "--decoder-norm", norm, "--power-warmup", "100")
    tokens = random_tokens(task, 3, 7)
    later = tokens.clone()
    first_word, words = task.dictionary.nspecial, len(task.dictionary) - task.dictionary.nspecial
    later[0, -1] = first_word + (tokens[0, -1] - first_word + 1) % words  # another word
    for mode, leaks in (("train", norm != "layer"), ("eval", False)):
        getattr(model, mode)()
        twin = copy.deepcopy(model)
        with torch.no_grad():
            first, first_later = log_probs(model, tokens)[:, :-1], log_probs(twin, later)[:, :-1]
        assert (not torch.allclose(first, first_later, rtol=0, atol=1e-6)) == leaks, mode


def test_batch_test_stats_refused_in_incremental_decoding(lm_data):
    task, model, _ = build(lm_data, "transformer_lm_ptb_bn", "--bn-test-stats", "batch")
    model.eval()
    tokens = random_tokens(task, 2, 5)
    with torch.no_grad():
        log_probs(model, tokens)  # a full forward may use the test batch (validation does)
        with pytest.raises(NormConfigError, match="incremental decoding"):
            log_probs(model, tokens[:, :1], incremental_state={})
    with pytest.raises(SystemExit, match="bn-test-stats population"):
        model.prepare_for_inference_(None)  # what fairseq-eval-lm and fairseq-generate call first


@pytest.mark.parametrize("prenorm", [False, True])
@pytest.mark.parametrize("norm", ["layer", "batch", "power"])
def test_padding_invariance(lm_data, norm, prenorm):
    """Eval: each sentence's log-probabilities are the same alone and in a padded eos-mode batch.
    Training: more padding changes no real position's output and no running statistic."""
    extra = ["--decoder-norm", norm, "--power-warmup", "1"] + (["--decoder-normalize-before"] if prenorm else [])
    task, model, _ = build(lm_data, "norm_transformer_lm", *extra)
    pad = task.dictionary.pad()
    sample = eos_sample(task)
    tokens, lengths = sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"]
    assert len(set(lengths.tolist())) > 2 and tokens.eq(pad).any()

    model.train()
    twin = copy.deepcopy(model)
    out = log_probs(model, tokens)
    out_padded = log_probs(twin, torch.cat([tokens, torch.full((len(tokens), 3), pad)], dim=1))
    real = tokens.ne(pad)
    torch.testing.assert_close(out_padded[:, :tokens.shape[1]][real], out[real], rtol=1e-5, atol=1e-5)
    for (name, a), (_, b) in zip(model.named_buffers(), twin.named_buffers()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")

    model.eval()
    with torch.no_grad():
        batch = log_probs(model, tokens)
        for i, n in enumerate(lengths.tolist()):
            alone = log_probs(model, tokens[i:i + 1, :n])
            torch.testing.assert_close(batch[i:i + 1, :n], alone, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- the criteria
def losses(task, args, model, sample):
    """(loss, {parameter: grad}, logs) of the criterion of ``args`` on a copy of ``model``."""
    criterion = task.build_criterion(args)
    model = copy.deepcopy(model)  # same weights and buffers for every criterion
    model.train()
    loss, _, logs = criterion(model, sample)
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}, logs


CRITERIA = {"cross_entropy_rbn": ("transformer_lm_ptb_rbn", "cross_entropy"),
            "adaptive_loss_rbn": ("transformer_lm_wt103_rbn", "adaptive_loss")}


@pytest.mark.parametrize("criterion", sorted(CRITERIA))
def test_zero_weights_are_the_base_criterion(lm_data, criterion):
    arch, base = CRITERIA[criterion]
    ddp = ["--ddp-backend", "legacy_ddp"]  # fairseq's adaptive_loss refuses the default DDP wrapper
    task, model, base_args = build(lm_data, arch, "--criterion", base, *ddp)
    rbn_args = parse(lm_data, arch, "--criterion", criterion, *ddp, "--rbn-mean-weight", "0", "--rbn-var-weight", "0")
    sample = eos_sample(task)
    loss, grads, _ = losses(task, base_args, model, sample)
    loss0, grads0, logs0 = losses(task, rbn_args, model, sample)
    assert torch.equal(loss, loss0)
    assert grads.keys() == grads0.keys()
    for name, g in grads.items():
        assert (g is None) == (grads0[name] is None), name
        assert g is None or torch.equal(g, grads0[name]), name
    assert logs0["rbn_penalty"] == 0 and logs0["rbn_forwards"] == 1
    assert {k for k in logs0 if k.startswith("tid_var/")} == {f"tid_var/dec{i}.{s}" for i in range(2)
                                                              for s in ("attn", "ffn")}


# (criterion, extra flags, {logged site: (module path, norm)}): BN at every sublayer site of a
# Post-Norm PTB model; BN, PowerNorm and a BN final norm in a Pre-Norm WT103 model
PENALTY = {
    "cross_entropy_rbn": ([], {f"dec{i}.{s}": (f"decoder.layers.{i}.{path}", "batch") for i in range(2)
                               for s, path in (("attn", "self_attn_layer_norm"), ("ffn", "final_layer_norm"))}),
    "adaptive_loss_rbn": (["--decoder-ffn-norm", "power", "--decoder-normalize-before", "--decoder-final-norm", "batch"],
                          {"dec0.attn": ("decoder.layers.0.self_attn_layer_norm", "batch"),
                           "dec0.ffn": ("decoder.layers.0.final_layer_norm", "power"),
                           "dec1.attn": ("decoder.layers.1.self_attn_layer_norm", "batch"),
                           "dec1.ffn": ("decoder.layers.1.final_layer_norm", "power"),
                           "dec.final": ("decoder.final_norm", "batch")}),
}


@pytest.mark.parametrize("criterion", sorted(PENALTY))
def test_penalty_and_statistics_match_the_equations(lm_data, criterion):
    """On a padded eos-mode batch: the running statistics move by the batch statistics of the
    real tokens only, and loss − base loss, the logged terms and TIDs, and (cross_entropy_rbn)
    the penalty's gradient match test_criterion's float64 reference of Wang, Wu & Huang 2022."""
    arch, base = CRITERIA[criterion]
    flags, sites = PENALTY[criterion]
    # α_b = 1: PowerNorm's backward is then linear in the incoming gradient (see test_criterion)
    common = [*flags, "--bn-momentum", str(MOMENTUM), "--power-warmup", "1", "--power-alpha-bkw", "1",
              "--ddp-backend", "legacy_ddp"]
    task, model, base_args = build(lm_data, arch, *common, "--criterion", base)
    rbn_args = parse(lm_data, arch, *common, "--criterion", criterion,
                     "--rbn-mean-weight", str(LAMBDA_MEAN), "--rbn-var-weight", str(LAMBDA_VAR))
    sample, other = eos_sample(task, range(6)), eos_sample(task, range(6, 12))
    model.train()  # one earlier training step moves the running statistics off their initial values
    model.set_num_updates(0)
    with torch.no_grad():
        model(**other["net_input"])
    model.set_num_updates(1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    modules = dict(model.named_modules())
    assert {site: modules[path].norm_name for site, (path, _) in sites.items()} == \
        {site: kind for site, (_, kind) in sites.items()}
    base_loss, _, _ = losses(task, base_args, model, sample)

    rbn_model = copy.deepcopy(model)
    inputs, net = {}, {}
    for site, (path, _) in sites.items():
        dict(rbn_model.named_modules())[path].register_forward_pre_hook(
            lambda m, args, site=site: inputs.__setitem__(site, args[0]))
    rbn_model.register_forward_hook(lambda m, args, out: net.__setitem__("out", out))
    rbn_criterion = task.build_criterion(rbn_args)
    loss, _, logs = rbn_criterion(rbn_model, sample)

    tokens = sample["net_input"]["src_tokens"]
    mask = tokens.eq(task.dictionary.pad())  # from the batch, not from what the model passes its norms
    assert mask.any()
    ref = reference_terms(inputs, dict.fromkeys(sites, mask), before, sites)
    state = rbn_model.state_dict()
    for r in ref.values():
        for key, want in r["stats"].items():
            close(state[key], want, key, rtol=1e-5, atol=1e-6)

    bn = [r for r in ref.values() if r["kind"] == "batch"]
    ref_mean, ref_var = sum(r["rbn_mean"] for r in bn), sum(r["rbn_var"] for r in bn)
    ref_penalty = LAMBDA_MEAN * ref_mean + LAMBDA_VAR * ref_var
    assert float(ref_penalty.detach()) > 1  # not a vanishing term
    assert torch.equal(logs["task_loss"], base_loss)
    close((loss.detach() - base_loss).squeeze(), ref_penalty.detach(), "loss - base loss", rtol=1e-5,  # adaptive: 1×
          atol=4 * torch.finfo(torch.float32).eps * float(loss))
    close(logs["rbn_penalty"], ref_penalty.detach(), "rbn_penalty", rtol=1e-5, atol=0)
    close(logs["rbn_mean"], ref_mean.detach(), "rbn_mean", rtol=1e-5, atol=0)
    close(logs["rbn_var"], ref_var.detach(), "rbn_var", rtol=1e-5, atol=0)
    for site, r in ref.items():
        close(logs[f"tid_var/{site}"], r["tid_var"], f"tid_var/{site}", rtol=1e-4, atol=1e-7)
        if r["kind"] == "batch":
            close(logs[f"tid_mean/{site}"], r["tid_mean"], f"tid_mean/{site}", rtol=1e-4, atol=1e-7)

    if not hasattr(rbn_criterion, "compute_loss"):  # adaptive_loss has no loss of a given output
        return
    task_loss, _ = rbn_criterion.compute_loss(rbn_model, net["out"], sample)
    params = list(rbn_model.named_parameters())
    got = torch.autograd.grad(loss - task_loss, [p for _, p in params], retain_graph=True, allow_unused=True)
    want = torch.autograd.grad(ref_penalty, [p for _, p in params], allow_unused=True)
    scale = max(float(w.abs().max()) for w in want if w is not None)
    reached = 0
    for (name, p), g, w in zip(params, got, want):
        g = torch.zeros_like(p) if g is None else g
        w = torch.zeros_like(p) if w is None else w
        reached += bool(w.abs().max() > 1e-3 * scale)
        close(g, w, name, rtol=1e-4, atol=1e-6 * scale)
    assert reached > 10


# --------------------------------------------------------------------------- errors
def test_errors_are_one_clear_line(lm_data, capsys):
    def refused(*argv):
        """fairseq's argparse errors: usage and message on stderr; normplug's: one line."""
        with pytest.raises(SystemExit) as exit_info:
            build(lm_data, *argv)
        code = exit_info.value.code
        if isinstance(code, str):
            assert code.startswith("normplug: error: ") and "\n" not in code
            return code
        return capsys.readouterr().err

    err = refused("transformer_lm_ptb_batchnorm")  # an unknown kind: the choices are listed
    assert "transformer_lm_ptb_batchnorm" in err and "transformer_lm_ptb_rbn" in err
    err = refused("transformer_lm_ptb_ln", "--decoder-norm", "batchnorm")
    assert "batchnorm" in err and "layer_simple" in err
    for flag in ("--encoder-norm", "--decoder-cross-attn-norm"):  # no such site in a language model
        assert "unrecognized arguments" in refused("transformer_lm_ptb_ln", flag, "batch")
    err = refused("transformer_lm_ptb_ln", "--criterion", "cross_entropy_rbn", "--rbn-mean-weight", "60")
    assert "--rbn-mean-weight 60" in err and "no 'batch' norm" in err
    err = refused("transformer_lm_ptb_bn", "--criterion", "adaptive_loss_rbn", "--ddp-backend", "legacy_ddp")
    assert "--adaptive-softmax-cutoff" in err and "cross_entropy_rbn" in err
    err = refused("transformer_lm_wt103_bn", "--adaptive-input-cutoff", "10")
    assert "--tie-adaptive-weights needs --adaptive-input-cutoff equal to --adaptive-softmax-cutoff" in err
