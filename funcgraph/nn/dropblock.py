"""DropBlock (Ghiasi et al., 2018): dropout of contiguous square regions of feature maps.

Plain dropout barely regularises a convolutional layer, whose neighbouring activations
carry the same information; DropBlock zeroes ``block_size x block_size`` squares instead.
Block centres ("seeds") are drawn where a whole block fits, each with probability ::

    gamma = drop_prob / block_size**2 * (H * W) / ((H - block_size + 1) * (W - block_size + 1))

so that about ``drop_prob`` of the positions end up dropped; every seed's block is zeroed
(a max-pool of the seed map) and the kept activations are rescaled by ``positions / kept``
over the batch (as MetaOptNet's and torchvision's ``drop_block2d``). The mask is a pure
function of the key: keyed, batched, ``vmap``-safe. Identity in evaluation.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from .. import random
from ..checks import check_fraction, check_int
from ..errors import ShapeError
from ..model import Model
from ..random import Key
from .dropout import keyed_drop


def drop_block(drop_prob: float = 0.1, block_size: int = 5) -> Model:
    """DropBlock over ``(B, C, H, W)`` in training (needs a ``key``); identity otherwise.

    Arguments:
        drop_prob: the fraction of positions to drop, in ``[0, 1)``.
        block_size: side of a dropped square (capped at the feature map's size).
    """
    check_fraction("drop_block", "drop_prob", drop_prob)
    check_int("drop_block", "block_size", block_size)

    def drop(key: Key, x: Tensor) -> Tensor:
        if x.dim() != 4:
            raise ShapeError(f"drop_block: expected input (B, C, H, W), got {tuple(x.shape)}")
        b, c, h, w = (int(s) for s in x.shape)
        size = min(block_size, h, w)
        fit_h, fit_w = h - size + 1, w - size + 1
        gamma = drop_prob / size**2 * (h * w) / (fit_h * fit_w)
        seeds = random.bernoulli(key, gamma, (b, c, fit_h, fit_w)).to(x.device, x.dtype)
        # a seed at (i, j) drops rows i..i+size-1, columns j..j+size-1
        spread = F.pad(seeds, (size - 1, size - 1, size - 1, size - 1))
        keep = 1 - F.max_pool2d(spread, size, stride=1)  # (B, C, H, W)
        scale = keep.numel() / keep.sum().clamp_min(1)
        return x * keep * scale

    return keyed_drop("drop_block", drop_prob, drop, block_size=block_size)


__all__ = ["drop_block"]
