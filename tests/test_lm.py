"""norm_transformer_lm and its criteria, in process: every architecture builds and trains,
the placements, the LayerNorm Pre-Norm model is fairseq's transformer_lm, causality (eval:
a full forward equals token-by-token decoding; training pools the batch, future included,
as documented), padding, the RBN penalty against the float64 reference of
test_criterion.py, zero weights = the base criteria, and the one-line errors."""
import copy

import pytest
import torch

from conftest import build_model, parse_train_args
from test_criterion import (LAMBDA_MEAN, LAMBDA_VAR, MOMENTUM, check_against_reference, check_penalty_gradient,
                            loss_and_grads, penalty_step)

import normplug  # noqa: F401  (registers the plugin)
from normplug.errors import NormplugError
from normplug.models.architectures import KINDS
from normplug.models.architectures_lm import LM_ARCHITECTURES, LM_SHAPES
from normplug.models.norm_plan import site_name

# 2 heads: test_criterion's reference group-scales PowerNorm inputs in 2 groups
TINY_LM = ["--decoder-layers", "2", "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "32",
           "--decoder-attention-heads", "2", "--dropout", "0", "--tokens-per-sample", "16",
           "--sample-break-mode", "eos"]
TINY_CUTOFFS = ["--adaptive-input-cutoff", "10,20", "--adaptive-softmax-cutoff", "10,20"]  # 34 words


def tiny_lm(arch):
    """The tiny size of a language model (WT103's cutoffs scaled down)."""
    return ["--task", "language_modeling", *TINY_LM, *(TINY_CUTOFFS if "wt103" in arch else [])]


def parse(data, arch, *extra):
    return parse_train_args(data, arch, *tiny_lm(arch), *extra)


def build(data, arch, *extra):
    return build_model(data, arch, *tiny_lm(arch), *extra)


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
    sublayers = {f"dec{i}.{s}" for i in range(2) for s in ("self_attn", "ffn")}
    for kind, (every_site, batch_norm) in KINDS.items():
        _, model, _ = build(lm_data, f"transformer_lm_ptb_{kind}")
        assert norm_kinds(model) == dict.fromkeys(sublayers, batch_norm or every_site), kind
    _, model, _ = build(lm_data, "transformer_lm_wt103_pn", "--decoder-normalize-before", "--warmup-updates", "7")
    norms = {site_name(n): m for n, m in model.named_modules() if hasattr(m, "norm_name")}
    assert {k: m.norm_name for k, m in norms.items()} == {**dict.fromkeys(sublayers, "power"), "dec.final": "layer"}
    assert norms["dec0.self_attn"].groups == 2 and norms["dec1.ffn"].warmup_updates == 7
    _, model, _ = build(lm_data, "norm_transformer_lm", "--decoder-normalize-before", "--decoder-norm", "rms",
                        "--decoder-ffn-norm", "scale", "--decoder-final-norm", "adanorm")
    assert norm_kinds(model) == {"dec0.self_attn": "rms", "dec1.self_attn": "rms", "dec0.ffn": "scale", "dec1.ffn": "scale",
                                 "dec.final": "adanorm"}


def test_reference_sizes():
    """Full-size shapes of the reference scripts (run_ptb.sh, run_wt103.sh); Post-Norm unless asked."""
    def full(arch, *extra):
        return parse_train_args("data", arch, "--task", "language_modeling", *extra)

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
        with pytest.raises(NormplugError, match="incremental decoding"):
            log_probs(model, tokens[:, :1], incremental_state={})
    with pytest.raises(NormplugError, match="bn-test-stats population"):
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
CRITERIA = {"cross_entropy_rbn": ("transformer_lm_ptb_rbn", "cross_entropy"),
            "adaptive_loss_rbn": ("transformer_lm_wt103_rbn", "adaptive_loss")}


@pytest.mark.parametrize("criterion", sorted(CRITERIA))
def test_zero_weights_are_the_base_criterion(lm_data, criterion):
    arch, base = CRITERIA[criterion]
    ddp = ["--ddp-backend", "legacy_ddp"]  # fairseq's adaptive_loss refuses the default DDP wrapper
    task, model, base_args = build(lm_data, arch, "--criterion", base, *ddp)
    rbn_args = parse(lm_data, arch, "--criterion", criterion, *ddp, "--rbn-mean-weight", "0", "--rbn-var-weight", "0")
    sample = eos_sample(task)
    loss, grads, _ = loss_and_grads(task, base_args, model, sample)
    loss0, grads0, logs0 = loss_and_grads(task, rbn_args, model, sample)
    assert torch.equal(loss, loss0)
    assert grads.keys() == grads0.keys()
    for name, g in grads.items():
        assert (g is None) == (grads0[name] is None), name
        assert g is None or torch.equal(g, grads0[name]), name
    assert logs0["rbn_penalty"] == 0 and logs0["rbn_forwards"] == 1
    assert {k for k in logs0 if k.startswith("tid_var/")} == {f"tid_var/dec{i}.{s}" for i in range(2)
                                                              for s in ("self_attn", "ffn")}


# (criterion, extra flags, {logged site: (module path, norm)}): BN at every sublayer site of a
# Post-Norm PTB model; BN, PowerNorm and a BN final norm in a Pre-Norm WT103 model
PENALTY = {
    "cross_entropy_rbn": ([], {f"dec{i}.{s}": (f"decoder.layers.{i}.{path}", "batch") for i in range(2)
                               for s, path in (("self_attn", "self_attn_layer_norm"), ("ffn", "final_layer_norm"))}),
    "adaptive_loss_rbn": (["--decoder-ffn-norm", "power", "--decoder-normalize-before", "--decoder-final-norm", "batch"],
                          {"dec0.self_attn": ("decoder.layers.0.self_attn_layer_norm", "batch"),
                           "dec0.ffn": ("decoder.layers.0.final_layer_norm", "power"),
                           "dec1.self_attn": ("decoder.layers.1.self_attn_layer_norm", "batch"),
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
    step = penalty_step(task, model, base_args, rbn_args, sample, other, sites)
    tokens = sample["net_input"]["src_tokens"]
    mask = tokens.eq(task.dictionary.pad())  # from the batch, not from what the model passes its norms
    assert mask.any()
    _, ref_penalty = check_against_reference(step, dict.fromkeys(sites, mask), sites)
    if hasattr(step.criterion, "compute_loss"):  # adaptive_loss has no loss of a given output
        check_penalty_gradient(step, ref_penalty)


# --------------------------------------------------------------------------- errors
def test_errors_are_one_clear_line(lm_data, capsys):
    def refused(*argv):
        """fairseq's argparse errors: usage and message on stderr, exit status 2; normplug's: a
        NormplugError of one line."""
        try:
            build(lm_data, *argv)
        except NormplugError as err:
            assert str(err) and "\n" not in str(err)
            return str(err)
        except SystemExit as stop:
            assert stop.code == 2
            return capsys.readouterr().err
        pytest.fail(f"not refused: {argv}")

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
    err = refused("transformer_lm_wt103_bn", "--criterion", "cross_entropy_rbn")
    assert "--criterion cross_entropy_rbn needs a full softmax" in err and "--criterion adaptive_loss_rbn" in err


def test_cross_entropy_rbn_refuses_an_adaptive_softmax_before_autograd(lm_data):
    """A model normplug did not build (fairseq's own transformer_lm, adaptive softmax) reaches
    the criterion unchecked: its first forward refuses it before running the model."""
    flags = [*TINY_CUTOFFS, "--decoder-input-dim", "16", "--decoder-output-dim", "16"]
    task, model, _ = build(lm_data, "transformer_lm", *flags)
    assert model.decoder.adaptive_softmax is not None
    criterion = task.build_criterion(parse(lm_data, "transformer_lm", *flags, "--criterion", "cross_entropy_rbn"))
    calls = []
    model.register_forward_pre_hook(lambda *a: calls.append(1))
    with pytest.raises(NormplugError, match="needs a full softmax.*--criterion adaptive_loss_rbn"):
        criterion(model, eos_sample(task))
    assert calls == []
