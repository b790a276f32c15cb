"""fairseq's hub interface on tiny trained BN checkpoints: ``TransformerModel`` and
``TransformerLanguageModel`` ``.from_pretrained(..., user_dir=<normplug>)`` load the plugin's
model in eval mode, every BN layer normalising with its population statistics, so that
``.translate``, ``.score`` and ``.sample`` give a sentence the same result alone and in a
batch, and ``.score`` gives the model's own log-probabilities. (The README's "From Python"
code runs in tests/test_text.py, on the scripts/prepare-text.sh corpus its model is trained on.)"""

import pytest
import torch

from conftest import USER_DIR, run_cli
from test_lm_cli import lm_train_args
from test_tid_tool import trained_bn_run

from normplug.models.norm_transformer import NormTransformerModel
from normplug.models.norm_transformer_lm import NormTransformerLanguageModel

pytestmark = pytest.mark.slow

SENTENCES = ["w1 w2 w3 w4", "w5 w6 w7", "w10 w11 w12 w13 w14 w15 w16"]


@pytest.fixture(scope="module")
def bn_save(tmp_path_factory, tiny_data):
    return trained_bn_run(tmp_path_factory, tiny_data)  # a real fairseq-train run, shared with test_tid_tool


@pytest.fixture(scope="module")
def translator(bn_save, tiny_data):
    from fairseq.models.transformer import TransformerModel

    return TransformerModel.from_pretrained(str(bn_save), checkpoint_file="checkpoint_best.pt",
                                            data_name_or_path=str(tiny_data), user_dir=USER_DIR)


@pytest.fixture(scope="module")
def lm_checkpoint(tmp_path_factory, lm_data):
    save = tmp_path_factory.mktemp("hub_lm")
    run_cli("fairseq-train", *lm_train_args(lm_data, save, "transformer_lm_ptb_bn", "--criterion", "cross_entropy_rbn"))
    return save


@pytest.fixture(scope="module")
def language_model(lm_checkpoint, lm_data):
    from fairseq.models.transformer_lm import TransformerLanguageModel

    return TransformerLanguageModel.from_pretrained(str(lm_checkpoint), checkpoint_file="checkpoint_last.pt",
                                                    data_name_or_path=str(lm_data), user_dir=USER_DIR)


def population_statistics_checked(model):
    """Forward hooks asserting that every BN layer's output at each real token is
    γ (x − μ̂)/sqrt(σ̂² + ε) + β of its input, with its running statistics; returns the list of
    the layers' calls."""
    calls = []

    def hook(module, args, out):
        x, pad = args[0].double(), args[1]
        want = (x - module.running_mean.double()) / torch.sqrt(module.running_var.double() + module.eps)
        real = torch.ones(x.shape[:2], dtype=torch.bool) if pad is None else ~pad.t()  # T×B
        torch.testing.assert_close(out.double()[real], (want * module.weight.double() + module.bias.double())[real],
                                   rtol=1e-5, atol=1e-5)
        calls.append(module)

    for norm in model.batch_stat_norms().values():
        norm.register_forward_hook(hook)
    return calls


def test_translate_in_eval_mode_with_population_statistics(translator):
    model = translator.models[0]
    assert isinstance(model, NormTransformerModel) and not model.training
    norms = model.batch_stat_norms()
    assert {name: norm.norm_name for name, norm in norms.items()} == {"enc0.self_attn": "batch", "enc0.ffn": "batch"}
    assert all(not norm.training and not norm.uses_batch_stats_in_eval for norm in norms.values())
    calls = population_statistics_checked(model)
    alone = [translator.translate(sentence, beam=2) for sentence in SENTENCES]
    assert len(calls) == 2 * len(SENTENCES)  # each sentence encoded once, through both BN layers
    assert all(isinstance(t, str) for t in alone)
    assert translator.translate(SENTENCES, beam=2) == alone  # other sentences change nothing


def test_score_and_sample_in_eval_mode_with_population_statistics(language_model):
    lm = language_model
    model = lm.models[0]
    assert isinstance(model, NormTransformerLanguageModel) and not model.training
    assert set(model.batch_stat_norms()) == {f"dec{i}.{site}" for i in range(2) for site in ("self_attn", "ffn")}
    calls = population_statistics_checked(model)
    scored = lm.score(SENTENCES)
    assert calls
    eos = lm.tgt_dict.eos()
    for sentence, hypo in zip(SENTENCES, scored):
        words = lm.encode(sentence)[:-1]  # fairseq scores the words, not the </s> after them
        assert torch.equal(hypo["tokens"], words)
        with torch.no_grad():  # the model's own log-probability of each word after </s> and the words before it
            out = model(torch.cat([words.new_tensor([eos]), words]).unsqueeze(0))
            lprobs = model.get_normalized_probs(out, log_probs=True)[0, :-1]
        want = lprobs.gather(-1, words.unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(hypo["positional_scores"], want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(lm.score(sentence)["positional_scores"], hypo["positional_scores"],
                                   rtol=1e-5, atol=1e-5)
    prefixes = ["w1 w2", "w7 w9 w11"]
    sampled = [lm.sample(prefix, beam=1, max_len_b=6) for prefix in prefixes]
    for prefix, text in zip(prefixes, sampled):
        assert text.split()[:len(prefix.split())] == prefix.split()
        assert all(word in lm.tgt_dict.indices for word in text.split())
    assert lm.sample(prefixes, beam=1, max_len_b=6) == sampled
