"""fairseq-hydra-train: a config or override builds the model fairseq-train builds from the
same options, and an option the plugin does not know, or a bad value, is refused.

The in-process tests take fairseq's own paths from options to model: fairseq-train's parsing
(the architecture applied to the flat Namespace, as conftest.build_model) and fairseq-hydra-train's
(config groups merged with their dataclasses by add_defaults, after the plugin is imported). The
slow tests run both console scripts on the README's config, configs/hydra/rbn.yaml: fairseq-train
also converts its Namespace to a config (convert_namespace_to_omegaconf, a hydra compose of about
a second, too slow for every architecture)."""
import re

import pytest
import torch
import yaml
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from conftest import REPO, USER_DIR, build_model, run_cli

import normplug  # noqa: F401  (registers the plugin)
from normplug.errors import NormplugError
from normplug.models.architectures import ARCHITECTURES
from normplug.models.architectures_lm import LM_ARCHITECTURES

# the architectures' own heads and FFN sizes: what they set must reach the model from hydra too
TINY = {"encoder_layers": 1, "decoder_layers": 1, "encoder_embed_dim": 16, "decoder_embed_dim": 16,
        "share_all_embeddings": True}
TINY_LM = {"decoder_layers": 2, "decoder_embed_dim": 16, "decoder_ffn_embed_dim": 32,
           "decoder_attention_heads": 2}
LM_TASK = {"_name": "language_modeling", "tokens_per_sample": 16, "sample_break_mode": "eos"}
TINY_CUTOFFS = {"adaptive_input_cutoff": "10,20", "adaptive_softmax_cutoff": "10,20"}  # of 34 words
RBN = {"_name": "label_smoothed_cross_entropy_rbn", "label_smoothing": 0.1}
NAME_FLAGS = {"task": "--task", "model": "--arch", "criterion": "--criterion", "optimizer": "--optimizer",
              "lr_scheduler": "--lr-scheduler"}


def cli_flags(groups):
    """fairseq-train's command line for config groups: ``_name`` is --arch, --criterion, ...;
    ``task.data`` the positional argument; ``key: value`` --key value; true a bare flag."""
    flags = []
    for group, options in groups.items():
        for key, value in options.items():
            if key == "data":
                flags.insert(0, str(value))
            elif key == "_name":
                flags += [NAME_FLAGS[group], value]
            elif value is True:
                flags.append("--" + key.replace("_", "-"))
            elif value is not False:
                value = value[0] if isinstance(value, list) else value  # optimization.lr: [0.0015]
                flags += ["--" + key.replace("_", "-"), str(value)]
    return flags


def cli_model(groups):
    """The model fairseq-train's parsing of these options gives."""
    data, *flags = cli_flags(groups)
    return build_model(data, groups["model"]["_name"], *flags)[1]


def hydra_config(groups):
    """The config fairseq-hydra-train builds the model from (fairseq_cli/hydra_train.py's
    _hydra_main, then train.py's main): groups over fairseq's schema, merged with their dataclasses."""
    from fairseq.dataclass.configs import FairseqConfig
    from fairseq.dataclass.initialize import add_defaults

    cfg = OmegaConf.merge(OmegaConf.structured(FairseqConfig),
                          {"common": {"user_dir": USER_DIR, "cpu": True}, **groups})
    add_defaults(cfg)
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
    OmegaConf.set_struct(cfg, True)
    add_defaults(cfg)
    return cfg


def hydra_model(groups):
    from fairseq import tasks

    cfg = hydra_config(groups)
    task = tasks.setup_task(cfg.task)
    torch.manual_seed(0)  # as conftest.build_model
    return task.build_model(cfg.model)


def described(model):
    """Every module by name: its class and plain attributes (dims, dropout, eps, momentum,
    warm-up, groups, impl...), and every parameter and buffer."""
    modules = {name: (type(m).__name__, {k: v for k, v in vars(m).items() if not k.startswith("_")
                                         and isinstance(v, (bool, int, float, str, type(None)))})
               for name, m in model.named_modules()}
    return modules, model.state_dict()


def assert_same_model(a, b):
    (modules_a, state_a), (modules_b, state_b) = described(a), described(b)
    assert modules_a == modules_b
    assert state_a.keys() == state_b.keys()
    for key in state_a:
        if not key.endswith("_float_tensor"):  # fairseq's dtype marker: one uninitialised float
            assert torch.equal(state_a[key], state_b[key]), key


def translation(data, model, criterion=None, warmup=4):
    return {"task": {"_name": "translation", "data": str(data)}, "model": model,
            "criterion": criterion or {"_name": "label_smoothed_cross_entropy", "label_smoothing": 0.1},
            "lr_scheduler": {"_name": "inverse_sqrt", "warmup_updates": warmup}}


def language_model(data, model, criterion=None, warmup=4):
    arch = model["_name"]
    sizes = {**TINY_LM, **(TINY_CUTOFFS if "wt103" in arch else {})}
    return {"task": {**LM_TASK, "data": str(data)}, "model": {**sizes, **model},
            "criterion": criterion or {"_name": "adaptive_loss" if "wt103" in arch else "cross_entropy"},
            "lr_scheduler": {"_name": "inverse_sqrt", "warmup_updates": warmup}}


@pytest.mark.parametrize("model", [
    {"_name": "transformer_iwslt_de_en_rbn", "decoder_norm": "rms"},  # the run
    pytest.param({"_name": "transformer_wmt_en_de_pn_prenorm", "power_alpha_fwd": 0.8},  # lr warm-up
                 marks=pytest.mark.slow),
    pytest.param({"_name": "norm_transformer", "encoder_norm": "adanorm", "adanorm_k": 0.2, "norm_eps": 1e-4,
                  "decoder_final_norm": "detach", "detach_mode": "mean", "decoder_normalize_before": True},
                 marks=pytest.mark.slow),
], ids=lambda m: m["_name"])
def test_a_hydra_config_builds_the_model_of_the_command_line(tiny_data, model):
    rbn = {**RBN, "rbn_mean_weight": 60, "rbn_var_weight": 0} if model["_name"].endswith("_rbn") else None
    groups = translation(tiny_data, {**TINY, **model}, rbn, warmup=7)
    ours = hydra_model(groups)
    assert_same_model(ours, cli_model(groups))
    norms = {n: m for n, m in ours.named_modules() if hasattr(m, "norm_name")}
    if model["_name"].endswith("_rbn"):
        assert {n: m.norm_name for n, m in norms.items() if m.norm_name != "rms"} == {
            "encoder.layers.0.self_attn_layer_norm": "batch", "encoder.layers.0.final_layer_norm": "batch"}
    if "_pn_" in model["_name"]:  # PowerNorm's default warm-up is the learning rate's
        assert {m.warmup_updates for m in norms.values() if m.norm_name == "power"} == {7, 1000}


@pytest.mark.slow
def test_a_hydra_language_model_is_the_command_line_one(lm_data):
    groups = language_model(lm_data, {"_name": "transformer_lm_ptb_pn", "decoder_final_norm": "scale",
                                      "decoder_normalize_before": True}, warmup=5)
    ours = hydra_model(groups)
    assert_same_model(ours, cli_model(groups))
    assert ours.decoder.layers[1].final_layer_norm.warmup_updates == 5
    assert ours.decoder.max_positions() == 16  # the task's tokens_per_sample



@pytest.mark.parametrize("model, criterion, message", [
    ({"decoder_nrom": "rms"}, None, "Key 'decoder_nrom' not in 'NormTransformerConfig'"),
    ({"decoder_norm": "rmsnorm"}, None, "model option decoder_norm (--decoder-norm) must be one of adanorm, "
                                        "batch, detach, identity, layer, layer_simple, power, rms, scale, "
                                        "got 'rmsnorm'"),
    ({"bn_momentum": -0.1}, None, "model option bn_momentum (--bn-momentum) must be in (0, 1], got -0.1"),
    pytest.param({"norm_impl": "bogus"}, None, "norm_impl (--norm-impl) must be one of auto, torch, triton, "
                                               "got 'bogus'", marks=pytest.mark.slow),
    pytest.param({"encoder_layers": "one"}, None, "'one' of type 'str' could not be converted to Integer",
                 marks=pytest.mark.slow),
    pytest.param({"_name": "transformer_lm_ptb_bn", "encoder_norm": "batch"}, None,  # an LM has no encoder
                 "Key 'encoder_norm' not in 'NormTransformerLMConfig'", marks=pytest.mark.slow),
    pytest.param({}, {**RBN, "rbn_mean_wieght": 60}, "Key 'rbn_mean_wieght' not in", marks=pytest.mark.slow),
    # the criterion's check of the model when it is built, as from the command line
    pytest.param({"_name": "transformer_iwslt_de_en_ln"}, {**RBN, "rbn_mean_weight": 60}, "no 'batch' norm",
                 marks=pytest.mark.slow),
], ids=["misspelt", "norm-name", "range", "impl", "type", "lm-encoder", "criterion-key", "rbn-without-bn"])
def test_a_bad_option_is_refused_in_one_line(tiny_data, lm_data, model, criterion, message):
    model = {"_name": "transformer_iwslt_de_en_rbn", **model}
    lm = model["_name"].startswith("transformer_lm")
    groups = language_model(lm_data, model) if lm else translation(tiny_data, {**TINY, **model}, criterion)
    with pytest.raises((NormplugError, ConfigKeyError, ValidationError)) as err:
        hydra_model(groups)
    assert message in str(err.value).splitlines()[0]


def test_a_model_built_in_process_from_a_namespace_keeps_the_run_settings(tiny_data):
    """task.build_model(args) with fairseq-train's flat Namespace, the bare model name included:
    PowerNorm's default warm-up (the lr's) and the criterion's check of the model."""
    _, model, _ = build_model(tiny_data, "norm_transformer", *cli_flags({"model": TINY}),
                              "--encoder-norm", "power", "--warmup-updates", "9")
    assert model.encoder.layers[0].final_layer_norm.warmup_updates == 9
    with pytest.raises(NormplugError, match="no 'batch' norm"):
        build_model(tiny_data, "norm_transformer", *cli_flags({"model": TINY}),
                    "--criterion", "label_smoothed_cross_entropy_rbn", "--rbn-mean-weight", "60")


@pytest.mark.slow
def test_every_architecture_is_the_same_from_either_entry_point(tiny_data, lm_data):
    for arch in sorted(ARCHITECTURES):
        groups = translation(tiny_data, {**TINY, "_name": arch})
        assert_same_model(hydra_model(groups), cli_model(groups))
    for arch in sorted(LM_ARCHITECTURES) + ["norm_transformer_lm"]:
        groups = language_model(lm_data, {"_name": arch})
        assert_same_model(hydra_model(groups), cli_model(groups))


# ---------------------------------------------------------------- the console scripts
HYDRA_CONFIG = REPO / "configs" / "hydra" / "rbn.yaml"


def _tiny_run(data, save):
    """Overrides of configs/hydra/rbn.yaml for two updates of a tiny model on the test corpus; a key
    the file does not list takes hydra's + (the plugin's schema is known only once fairseq imports it)."""
    return {"common.user_dir": USER_DIR, "common.cpu": True, "common.log_interval": 1, "task.data": data,
            **{f"model.{k}": v for k, v in TINY.items()}, "+model.decoder_norm": "rms",
            "optimization.max_update": 2, "dataset.max_tokens": 400, "dataset.data_buffer_size": 0,
            "checkpoint.save_dir": save, "checkpoint.no_save": True, "common.no_progress_bar": True}


def _model_and_first_step(log):
    lines = log.splitlines()
    start = next(i for i, line in enumerate(lines) if line.endswith("NormTransformerModel("))
    model = lines[start + 1:lines.index(")", start)]
    first = next(line for line in lines if "train_inner" in line)
    values = dict(re.findall(r"(\w+)=([0-9.]+)", first))
    return model, {"loss": float(values["loss"]), "rbn_penalty": float(values["rbn_penalty"])}


@pytest.mark.slow
def test_fairseq_hydra_train_trains_what_fairseq_train_trains(tiny_data, tmp_path):
    overrides = _tiny_run(tiny_data, tmp_path / "hydra")
    hydra = run_cli("fairseq-hydra-train", "--config-dir", HYDRA_CONFIG.parent, "--config-name",
                    HYDRA_CONFIG.stem, *[f"{k}={v}" for k, v in overrides.items()], cwd=tmp_path)
    groups = yaml.safe_load(HYDRA_CONFIG.read_text())
    del groups["hydra"]
    for key, value in {**overrides, "checkpoint.save_dir": tmp_path / "cli"}.items():
        group, option = key.lstrip("+").split(".")
        groups[group][option] = value
    cli = run_cli("fairseq-train", *cli_flags(groups), cwd=tmp_path)
    model, first_step = _model_and_first_step(hydra.stdout + hydra.stderr)
    assert (model, first_step) == _model_and_first_step(cli.stdout + cli.stderr)
    assert sum("MaskedBatchNorm" in line for line in model) == 2
    assert sum("RMSNorm" in line for line in model) == 3
    assert first_step["rbn_penalty"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("override, error", [
    ("+model.decoder_nrom=rms", ["omegaconf.errors.ConfigKeyError: Key 'decoder_nrom' not in 'NormTransformerConfig'",
                                 "    full_key: decoder_nrom", "    object_type=NormTransformerConfig"]),
    ("+model.decoder_norm=rmsnorm", ["normplug.errors.NormplugError: model option decoder_norm (--decoder-norm) must "
                                     "be one of adanorm, batch, detach, identity, layer, layer_simple, power, rms, "
                                     "scale, got 'rmsnorm'"])])
def test_fairseq_hydra_train_refuses_a_misspelt_key_or_a_bad_value(tiny_data, tmp_path, override, error):
    """What README.md says of hydra's message: the traceback's last statement is the error, above hydra's
    closing line; nothing trained."""
    overrides = [f"{k}={v}" for k, v in _tiny_run(tiny_data, tmp_path).items() if k != "+model.decoder_norm"]
    proc = run_cli("fairseq-hydra-train", "--config-dir", HYDRA_CONFIG.parent, "--config-name",
                   HYDRA_CONFIG.stem, *overrides, override, cwd=tmp_path, check=False)
    assert proc.returncode == 1 and proc.stderr.splitlines()[-len(error) - 2:] == [
        *error, "", "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace."], proc.stderr[-2000:]
    assert "train_inner" not in proc.stdout + proc.stderr
