"""norm_transformer: every architecture builds and trains, masks are right,
incremental decoding matches full decoding, the stock maths is kept."""
import copy

import pytest
import torch

from conftest import TINY_MODEL, build_model, parse_train_args

import normplug  # noqa: F401  (registers the plugin)
from normplug.errors import NormplugError
from normplug.models.architectures import ARCHITECTURES, KINDS, SHAPES
from normplug.models.norm_plan import SITE_ATTRIBUTES, SITES, site_name
from normplug.models.norm_transformer import NormTransformerModel
from normplug.norms import BatchStatNorm, norm_names

TINY_ARCH = TINY_MODEL + ["--dropout", "0.0", "--attention-dropout", "0.0", "--share-all-embeddings"]


def build(data, arch, *extra):
    return build_model(data, arch, *TINY_ARCH, *extra)


def make_batch(task, lengths_src, lengths_tgt, seed=0):
    """A right-padded target / left-padded source batch, as fairseq makes it."""
    g = torch.Generator().manual_seed(seed)
    d = task.source_dictionary
    pad, eos = d.pad(), d.eos()
    n_words = len(d)
    B, S, T = len(lengths_src), max(lengths_src), max(lengths_tgt)
    src = torch.full((B, S), pad)
    prev = torch.full((B, T), pad)
    for i, (ls, lt) in enumerate(zip(lengths_src, lengths_tgt)):
        src[i, S - ls:] = torch.randint(d.nspecial, n_words, (ls,), generator=g)
        src[i, -1] = eos
        prev[i, :lt] = torch.randint(d.nspecial, n_words, (lt,), generator=g)
        prev[i, 0] = eos
    return src, torch.tensor(lengths_src), prev


def test_every_architecture_builds_and_trains_one_step(tiny_data):
    assert len(ARCHITECTURES) == len(SHAPES) * 2 * len(KINDS)
    for arch in sorted(ARCHITECTURES):
        task, model, _ = build(tiny_data, arch)
        model.train()
        src, lengths, prev = make_batch(task, [5, 3, 7], [4, 6, 2])
        logits, _ = model(src, lengths, prev)
        assert torch.isfinite(logits).all(), arch
        logits.sum().backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        assert all(g is not None and torch.isfinite(g).all() for g in grads), arch


@pytest.mark.parametrize("prenorm", [False, True])
def test_layer_architecture_is_the_stock_transformer(tiny_data, prenorm):
    """Same weights, same outputs and gradients as fairseq's own model."""
    extra = ["--encoder-normalize-before", "--decoder-normalize-before"] if prenorm else []
    task, ours, _ = build(tiny_data, "norm_transformer", *extra)
    _, stock, _ = build(tiny_data, "transformer", *extra)
    # fairseq's Pre-Norm final norm is `layer_norm`; ours is `final_norm`, and
    # upgrade_state_dict maps a stock checkpoint onto it
    stock_sd = {k.replace(".final_norm.", ".layer_norm."): v for k, v in ours.state_dict().items()}
    stock.load_state_dict(stock_sd, strict=True)
    upgraded = dict(stock.state_dict())
    ours.upgrade_state_dict(upgraded)
    ours.load_state_dict(upgraded, strict=True)
    src, lengths, prev = make_batch(task, [6, 2, 9, 4], [5, 7, 3, 2])
    for mode in ("train", "eval"):
        getattr(ours, mode)()
        getattr(stock, mode)()
        a, _ = ours(src, lengths, prev)
        b, _ = stock(src, lengths, prev)
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    a.sum().backward()
    b.sum().backward()
    stock_params = dict(stock.named_parameters())
    for name, p in ours.named_parameters():
        q = stock_params.get(name.replace("final_norm", "layer_norm"))
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("prenorm", [False, True])
def test_stock_iwslt_state_dict_loads_strictly_into_the_layer_norm_architecture(tiny_data, prenorm):
    """A stock fairseq transformer_iwslt_de_en state dict, as its checkpoints hold it (Pre-Norm:
    the stacks' final norms as `layer_norm`), loads with strict=True into
    transformer_iwslt_de_en_ln[_prenorm], and the two models give the same outputs."""
    extra = ["--encoder-normalize-before", "--decoder-normalize-before"] if prenorm else []
    task, stock, _ = build(tiny_data, "transformer_iwslt_de_en", *extra)
    _, ours, _ = build(tiny_data, "transformer_iwslt_de_en_ln" + ("_prenorm" if prenorm else ""))
    stock_sd = stock.state_dict()
    assert any(".layer_norm." in k for k in stock_sd) == prenorm
    assert ours.load_state_dict(dict(stock_sd), strict=True) is not None  # upgrade, then strict
    ours_sd = ours.state_dict()
    assert len(ours_sd) == len(stock_sd)
    for key, value in stock_sd.items():
        assert torch.equal(ours_sd[key.replace(".layer_norm.", ".final_norm.")], value), key
    src, lengths, prev = make_batch(task, [6, 2, 9, 4], [5, 7, 3, 2])
    ours.eval()
    stock.eval()
    with torch.no_grad():
        torch.testing.assert_close(ours(src, lengths, prev)[0], stock(src, lengths, prev)[0], rtol=0, atol=1e-6)


def test_one_name_per_site(tiny_data):
    """Each site's flag (--{stack}-{site}-norm) places its norm at fairseq's attribute for that
    site (SITE_ATTRIBUTES), and the model logs it under the same site name."""
    prenorm = ["--encoder-normalize-before", "--decoder-normalize-before"]
    assert set(SITE_ATTRIBUTES) == {site for _, site in SITES}
    for stack, site in SITES:
        flag = f"--{stack}-{site.replace('_', '-')}-norm"
        _, model, _ = build(tiny_data, "norm_transformer", *prenorm, flag, "batch")
        module = getattr(model, stack)
        owner = module if site == "final" else module.layers[0]
        assert getattr(owner, SITE_ATTRIBUTES[site]).norm_name == "batch", flag
        logged = f"{stack[:3]}.final" if site == "final" else f"{stack[:3]}0.{site}"
        assert list(model.batch_stat_norms()) == [logged], flag
    assert site_name("encoder.layers.3.final_layer_norm") == "enc3.ffn"
    assert site_name("decoder.layers.1.encoder_attn_layer_norm") == "dec1.cross_attn"
    assert site_name("decoder.final_norm") == "dec.final"


def _per_token_and_population_norms():
    return [n for n in norm_names() if n not in ("batch", "power")] + ["batch", "power"]


@pytest.mark.parametrize("norm", _per_token_and_population_norms())
@pytest.mark.parametrize("prenorm", [False, True])
def test_incremental_decoding_equals_full_decoding(tiny_data, norm, prenorm):
    extra = ["--encoder-norm", norm, "--decoder-norm", norm]
    if prenorm:
        extra += ["--encoder-normalize-before", "--decoder-normalize-before"]
    task, model, _ = build(tiny_data, "norm_transformer", *extra)
    # move the population statistics away from their initial values
    model.train()
    src, lengths, prev = make_batch(task, [6, 4, 8], [7, 5, 6], seed=1)
    for _ in range(3):
        model(src, lengths, prev)
    model.eval()
    with torch.no_grad():
        enc = model.encoder(src, lengths)
        full, _ = model.decoder(prev[:, :5], encoder_out=enc)  # no padding in the first 5
        state = {}
        steps = [model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)[0]
                 for t in range(5)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm", _per_token_and_population_norms())
def test_padding_invariance_of_the_whole_model(tiny_data, norm):
    """Encoder output at real tokens and the running statistics do not change
    when the batch gains padding (train mode) or a longer sentence (eval)."""
    task, model, _ = build(tiny_data, "norm_transformer", "--encoder-norm", norm, "--decoder-norm", norm)
    src, lengths, prev = make_batch(task, [5, 3, 6], [4, 6, 3], seed=2)
    pad = task.source_dictionary.pad()

    model.train()
    twin = copy.deepcopy(model)
    out = model.encoder(src, lengths)["encoder_out"][0]
    padded = torch.cat([torch.full((3, 4), pad), src], dim=1)  # sources are left-padded
    out_padded = twin.encoder(padded, lengths)["encoder_out"][0]
    torch.testing.assert_close(out_padded[4:], out, rtol=1e-5, atol=1e-5)
    for (name, a), (_, b) in zip(model.named_buffers(), twin.named_buffers()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=name)

    model.eval()
    with torch.no_grad():
        out = model.encoder(src, lengths)["encoder_out"][0]
        longer, longer_lengths, _ = make_batch(task, [9], [2], seed=3)
        batch = torch.cat([torch.cat([torch.full((3, 3), pad), src], dim=1), longer], dim=0)
        out_longer = model.encoder(batch, torch.cat([lengths, longer_lengths]))["encoder_out"][0]
    torch.testing.assert_close(out_longer[3:, :3], out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("prenorm", [False, True])
def test_every_site_normalises_over_the_real_tokens_of_its_stream(tiny_data, prenorm):
    """`batch` at every site: more padding on either side (left of the sources, right of the
    targets) changes no output at a real target position and no site's running statistics, so
    each site's statistics cover exactly the real tokens of its stream: the source mask in the
    encoder, the target mask at every decoder site (cross-attention and final norm included)."""
    extra = ["--encoder-normalize-before", "--decoder-normalize-before"] if prenorm else []
    task, model, _ = build(tiny_data, "norm_transformer", "--encoder-norm", "batch", "--decoder-norm", "batch",
                           *extra)
    src, lengths, prev = make_batch(task, [5, 3, 6], [4, 7, 3], seed=4)
    pad = task.source_dictionary.pad()
    assert src.eq(pad).any() and prev.eq(pad).any() and src.shape[1] != prev.shape[1]
    sites = {n for n, m in model.named_modules() if isinstance(m, BatchStatNorm)}
    assert len(sites) == (7 if prenorm else 5)  # every site of both stacks
    model.train()
    twin = copy.deepcopy(model)
    logits, _ = model(src, lengths, prev)
    more_src = torch.cat([torch.full((3, 4), pad), src], dim=1)
    more_prev = torch.cat([prev, torch.full((3, 2), pad)], dim=1)
    logits_more, _ = twin(more_src, lengths, more_prev)
    real = prev.ne(pad)
    torch.testing.assert_close(logits_more[:, :prev.shape[1]][real], logits[real], rtol=1e-5, atol=1e-5)
    ours, theirs = dict(model.named_buffers()), dict(twin.named_buffers())
    for name in sorted(ours):
        if name.rsplit(".", 1)[0] in sites:
            torch.testing.assert_close(theirs[name], ours[name], rtol=1e-5, atol=1e-6,
                                       msg=lambda m, name=name: f"{name}: {m}")


def test_eval_never_bypasses_plugin_norms(tiny_data, tmp_path):
    """After a save/load round trip, eval forward still goes through every norm."""
    task, model, args = build(tiny_data, "transformer_iwslt_de_en_rms", *TINY_ARCH)
    path = tmp_path / "m.pt"
    torch.save({"model": model.state_dict()}, path)
    model2 = task.build_model(args)
    model2.load_state_dict(torch.load(path)["model"])
    model2.eval()
    calls = []
    norms = [m for m in model2.modules() if getattr(m, "norm_name", None) == "rms"]
    assert len(norms) == 5  # enc attn+ffn, dec self+cross+ffn
    for m in norms:
        m.register_forward_hook(lambda *a: calls.append(1))
    src, lengths, prev = make_batch(task, [4, 6], [3, 5])
    with torch.no_grad():
        model2(src, lengths, prev)
    assert len(calls) == len(norms)


def test_state_dict_round_trip_keeps_norm_buffers(tiny_data):
    task, model, args = build(tiny_data, "transformer_iwslt_de_en_pn")
    model.train()
    src, lengths, prev = make_batch(task, [4, 6], [3, 5])
    model.set_num_updates(5)
    model(src, lengths, prev)[0].sum().backward()
    twin = task.build_model(args)
    twin.load_state_dict(model.state_dict())
    buffers = dict(twin.named_buffers())
    assert any("final_layer_norm" in k for k in buffers)
    for name, value in model.named_buffers():
        assert torch.equal(buffers[name], value), name


def test_batch_test_stats_refused_in_incremental_decoder(tiny_data):
    task, model, _ = build(
        tiny_data, "norm_transformer", "--decoder-norm", "batch", "--bn-test-stats", "batch"
    )
    model.eval()
    src, lengths, prev = make_batch(task, [4, 6], [3, 5])
    with torch.no_grad():
        enc = model.encoder(src, lengths)  # encoder sites may use batch statistics
        model.decoder(prev, encoder_out=enc)  # full-sequence decoding works too
        with pytest.raises(Exception, match="incremental decoding"):
            model.decoder(prev[:, :1], encoder_out=enc, incremental_state={})
    with pytest.raises(NormplugError, match="bn-test-stats population"):
        model.prepare_for_inference_(None)  # what fairseq-generate calls first


def test_bad_flag_values_are_clear_errors(tiny_data, capsys):
    with pytest.raises(SystemExit):
        build(tiny_data, "norm_transformer", "--encoder-norm", "batchnorm")
    err = capsys.readouterr().err
    assert "batchnorm" in err and "layer_simple" in err  # names the bad value and the choices
    with pytest.raises(SystemExit):
        build(tiny_data, "norm_transformer", "--encoder-crossattn-norm", "batch")
    assert "--encoder-crossattn-norm" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build(tiny_data, "norm_transformer", "--bn-momentum", "-0.1")
    assert "-0.1" in capsys.readouterr().err
    with pytest.raises(NormplugError, match=r"groups.*3.*16|16.*3"):
        build(tiny_data, "norm_transformer", "--encoder-norm", "power", "--power-groups", "3")
    with pytest.raises(SystemExit):  # the old name of the encoder's self-attention site
        build(tiny_data, "norm_transformer", "--encoder-attn-norm", "batch")
    assert "unrecognized arguments: --encoder-attn-norm" in capsys.readouterr().err


def test_site_overrides_and_published_placements(tiny_data):
    _, model, _ = build(tiny_data, "transformer_iwslt_de_en_bn")
    kinds = {site_name(n): m.norm_name for n, m in model.named_modules() if hasattr(m, "norm_name")}
    assert kinds == {"enc0.self_attn": "batch", "enc0.ffn": "batch", "dec0.self_attn": "layer",
                     "dec0.cross_attn": "layer", "dec0.ffn": "layer"}
    _, model, _ = build(tiny_data, "transformer_iwslt_de_en_adanorm_prenorm",
                        "--encoder-norm", "layer", "--decoder-norm", "layer",
                        "--encoder-final-norm", "adanorm", "--decoder-final-norm", "adanorm")
    kinds = {site_name(n): m.norm_name for n, m in model.named_modules() if hasattr(m, "norm_name")}
    assert kinds["enc.final"] == kinds["dec.final"] == "adanorm"
    assert {v for k, v in kinds.items() if "final" not in k} == {"layer"}
    assert isinstance(model, NormTransformerModel)


def test_power_norm_placement_and_final_warmup(tiny_data):
    """pn: PowerNorm at the encoder's sublayers (warm-up = --warmup-updates) and, in Pre-Norm,
    at the encoder's final norm with its own warm-up (1000 in Shen et al.'s release)."""
    _, model, _ = build(tiny_data, "transformer_iwslt_de_en_pn_prenorm", "--warmup-updates", "8000")
    norms = {site_name(n): m for n, m in model.named_modules() if hasattr(m, "norm_name")}
    assert {k: m.norm_name for k, m in norms.items() if m.norm_name != "layer"} == {
        "enc0.self_attn": "power", "enc0.ffn": "power", "enc.final": "power"}
    assert norms["enc0.self_attn"].warmup_updates == 8000 and norms["enc.final"].warmup_updates == 1000
    assert norms["enc0.self_attn"].groups == 2  # attention heads of the tiny model
    _, model, _ = build(tiny_data, "transformer_iwslt_de_en_pn_prenorm", "--power-warmup", "7",
                        "--power-final-warmup", "3")
    assert model.encoder.layers[0].final_layer_norm.warmup_updates == 7
    assert model.encoder.final_norm.warmup_updates == 3
    _, model, _ = build(tiny_data, "transformer_iwslt_de_en_pn")  # Post-Norm: no final norm
    assert model.encoder.final_norm is None


def test_initialisation_flags(tiny_data):
    """kaiming: nn.Linear's default weights, zero biases, on every attention projection;
    xavier FFN: Xavier-uniform weights, zero biases; defaults keep fairseq 0.12's init."""
    _, stock, _ = build(tiny_data, "transformer_iwslt_de_en_ln")
    _, model, _ = build(tiny_data, "transformer_iwslt_de_en_ln", "--attn-init", "kaiming",
                        "--decoder-ffn-init", "xavier")
    for m in (stock, model):
        assert all(torch.isfinite(p).all() for p in m.parameters())
    dim = 16
    for attn in (model.encoder.layers[0].self_attn, model.decoder.layers[0].self_attn,
                 model.decoder.layers[0].encoder_attn):
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj):
            assert proj.weight.abs().max() <= 1 / dim ** 0.5 and torch.equal(proj.bias, torch.zeros_like(proj.bias))
    assert stock.encoder.layers[0].self_attn.q_proj.bias.abs().sum() > 0  # fairseq leaves q/k/v biases uniform
    dec = model.decoder.layers[0]
    assert torch.equal(dec.fc1.bias, torch.zeros_like(dec.fc1.bias)) and dec.fc1.weight.abs().max() > 1 / dim ** 0.5
    enc = model.encoder.layers[0]  # encoder FFN untouched: nn.Linear's default, uniform bias
    assert enc.fc1.bias.abs().sum() > 0 and enc.fc1.weight.abs().max() <= 1 / dim ** 0.5


@pytest.mark.slow
def test_compile_norms_keeps_state_names_and_matches_eager(tiny_data):
    arch = ["--encoder-self-attn-norm", "batch", "--encoder-ffn-norm", "power", "--decoder-ffn-norm", "rms"]
    task, eager, _ = build(tiny_data, "norm_transformer", *arch)
    _, compiled, _ = build(tiny_data, "norm_transformer", *arch, "--compile-norms")
    assert list(compiled.state_dict()) == list(eager.state_dict())
    compiled.load_state_dict(eager.state_dict())
    for model in (eager, compiled):
        model.train()
    for step, (src_len, tgt_len) in enumerate([([5, 3, 7], [4, 6, 2]), ([4, 4], [3, 5])]):
        src, lengths, prev = make_batch(task, src_len, tgt_len, seed=step)
        out = []
        for model in (eager, compiled):
            model.zero_grad()
            logits, _ = model(src, lengths, prev)
            logits.square().mean().backward()
            out.append([logits.detach()] + [p.grad for p in model.parameters()])
        for a, b in zip(*out):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(compiled.state_dict(), eager.state_dict(), rtol=1e-4, atol=1e-5)


def _full_size_args(data, arch, *extra):
    """fairseq's argument parsing and architecture function alone, at full size (no model)."""
    return parse_train_args(data, arch, *extra)


@pytest.mark.parametrize("kind", ["ln", "pn"])
def test_big_prenorm_architecture_is_fairseqs_t2t_big_shape(tiny_data, kind):
    """transformer_vaswani_wmt_en_de_big_<kind>_prenorm with attention/activation dropout 0.1
    is fairseq's transformer_wmt_en_de_big_t2t (Shen et al.'s WMT14 model), norms aside."""
    ours = _full_size_args(tiny_data, f"transformer_vaswani_wmt_en_de_big_{kind}_prenorm",
                           "--attention-dropout", "0.1", "--activation-dropout", "0.1")
    stock = _full_size_args(tiny_data, "transformer_wmt_en_de_big_t2t")
    for key in ("encoder_embed_dim", "encoder_ffn_embed_dim", "encoder_attention_heads", "encoder_layers",
                "decoder_embed_dim", "decoder_ffn_embed_dim", "decoder_attention_heads", "decoder_layers",
                "dropout", "attention_dropout", "activation_dropout",
                "encoder_normalize_before", "decoder_normalize_before"):
        assert getattr(ours, key) == getattr(stock, key), key
    assert ours.encoder_embed_dim == 1024 and ours.encoder_normalize_before is True
    # the big Post-Norm twin keeps fairseq's big defaults (no final norms, no attention dropout)
    post = _full_size_args(tiny_data, f"transformer_vaswani_wmt_en_de_big_{kind}")
    big = _full_size_args(tiny_data, "transformer_vaswani_wmt_en_de_big")
    assert (post.encoder_normalize_before, post.attention_dropout, post.dropout) == \
        (big.encoder_normalize_before, big.attention_dropout, big.dropout) == (False, 0.0, 0.3)
