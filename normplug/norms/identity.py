"""The "no norm" baseline of Xu et al. (2019), Table 1."""
import torch.nn as nn

from .registry import register_norm


@register_norm("identity")
class Identity(nn.Module):
    """No normalization at all: the 'w/o Norm' row of Xu et al., NeurIPS 2019."""

    def __init__(self, dim):
        super().__init__()

    def forward(self, x, pad_mask=None):
        return x
