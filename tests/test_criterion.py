"""label_smoothed_cross_entropy_rbn at zero weights is fairseq's label_smoothed_cross_entropy,
bit for bit (loss, every gradient), and still logs TID: the BN and PowerNorm baselines
train with it so that every run records its training-inference discrepancy."""
import copy

import pytest
import torch

from conftest import TINY_MODEL, USER_DIR

from fairseq import options, tasks, utils

import normplug  # noqa: F401  (registers the plugin)


def build(data, arch, *criterion):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        str(data), "--user-dir", USER_DIR, "--arch", arch, "--cpu", *TINY_MODEL,
        "--share-all-embeddings", "--dropout", "0.0", "--label-smoothing", "0.1", *criterion])
    utils.import_user_module(args)
    task = tasks.setup_task(args)
    return task, args


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
    task, plain_args = build(tiny_data, arch, "--criterion", "label_smoothed_cross_entropy")
    _, rbn_args = build(tiny_data, arch, "--criterion", "label_smoothed_cross_entropy_rbn",
                        "--rbn-mean-weight", str(mean_weight), "--rbn-var-weight", str(var_weight))
    torch.manual_seed(0)
    model = task.build_model(plain_args)
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
    assert [k for k in logs0 if k.startswith("tid_mean/")]
    assert [k for k in logs0 if k.startswith("tid_var/")]
    assert torch.isfinite(torch.as_tensor(logs0["tid_var"])) and logs0["tid_var"] > 0


def test_nonzero_weights_change_loss_and_gradients(tiny_data):
    (loss, grads), (loss1, grads1, logs1) = plain_and_rbn(tiny_data, "transformer_iwslt_de_en_bn", 60, 0.01)
    assert logs1["rbn_penalty"] > 0
    assert torch.allclose(loss1 - loss, logs1["rbn_penalty"].to(loss1.dtype))
    # the penalty reaches the encoder through the batch statistics, not the decoder's output layer
    changed = [n for n, g in grads.items() if g is not None and not torch.equal(g, grads1[n])]
    assert any(n.startswith("encoder.layers.") for n in changed)
