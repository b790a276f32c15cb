"""The shared real-token row finder of the batch-statistics norms and its cache."""
import torch

from normplug.norms.base import token_rows


def reference(pad_mask):
    T = pad_mask.shape[1]
    B = pad_mask.shape[0]
    real = [t * B + b for t in range(T) for b in range(B) if not pad_mask[b, t]]
    pad = [t * B + b for t in range(T) for b in range(B) if pad_mask[b, t]]
    return real, pad


def test_rows_match_the_t_major_layout_and_follow_in_place_changes():
    mask = torch.tensor([[False, False, True], [False, True, True]])
    idx, pidx, n = token_rows(mask, 3, 2, "cpu")
    real, pad = reference(mask)
    assert idx.tolist() == real and pidx.tolist() == pad and n == len(real)
    assert token_rows(mask, 3, 2, "cpu")[0] is idx  # cached for the same mask object
    mask[0, 1] = True  # changed in place: the cache must not answer
    idx2, pidx2, n2 = token_rows(mask, 3, 2, "cpu")
    real, pad = reference(mask)
    assert idx2.tolist() == real and pidx2.tolist() == pad and n2 == len(real) == 2


def test_a_new_mask_never_gets_rows_of_a_dead_one():
    for seed in range(20):  # freed masks' ids get reused by new ones
        mask = torch.rand(3, 4, generator=torch.Generator().manual_seed(seed)) < 0.4
        mask[:, 0] = False
        idx, pidx, _ = token_rows(mask, 4, 3, "cpu")
        real, pad = reference(mask)
        assert (idx.tolist() if idx is not None else list(range(12))) == real
        assert (pidx.tolist() if pidx is not None else []) == pad
        del mask, idx, pidx


def test_no_padding_gives_no_indices():
    assert token_rows(None, 4, 3, "cpu") == (None, None, 12)
    assert token_rows(torch.zeros(3, 4, dtype=torch.bool), 4, 3, "cpu") == (None, None, 12)
