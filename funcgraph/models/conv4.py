"""The conv4 few-shot backbone: four [conv3x3, batch norm, ReLU, down-sampling] blocks and a head.

Two variants, as in the MAML paper (Finn et al., 2017):

* ``"pool"``: 3x3 convolutions (padding 1) followed by 2x2 max-pooling; 28x28 -> 1x1.
  With ``in_channels=3, hidden=32, image_size=84`` it is the paper's mini-ImageNet model:
  32 filters, 84 -> 42 -> 21 -> 10 -> 5, a head over 32 * 5 * 5 = 800 features.
* ``"strided"`` (the default): 3x3 convolutions with stride 2 and no pooling, then the mean
  over the spatial positions; the MAML paper's Omniglot model. Cheaper than
  ``"pool"`` per image (its convolutions compute 4x fewer output positions), which
  is why it is the CPU default.

By default batch norm uses the statistics of the batch it sees (``track_running_stats=False``):
transductive batch norm, as MAML does, so the model has no state and
``funcgraph.bind(model, {})`` gives a plain ``f(params, x)``. It is funcgraph's batch norm:
the mean/var form under ``torch.func`` transforms, whose second-order gradients are correct
under ``vmap`` (native ``F.batch_norm``'s are not in torch 2.13), the native kernel outside.

Four exact rewrites make it faster on CPU, with the same function and gradients:

* Each block is :func:`funcgraph.nn.conv_batch_norm`. The first block's 3x3 patches over one
  channel are 9 values wide against 64 outputs, so its batch statistics come from the
  patches' 9x9 covariance and the normalisation folds into the convolution's weights: no
  batch norm runs over its 28x28x64 output (nor its double backward on the support set).
* ``max_pool(relu(z)) == relu(max_pool(z))`` (ReLU is monotone), so the ``"pool"`` variant
  applies ReLU after pooling, on a quarter of the values (the gradients agree too: where the
  window's maximum is <= 0 both are zero).
* Inside transforms the max-pool is :func:`funcgraph.nn.max_pool`: each window's maximum is
  found on a channels-last copy outside autograd and gathered, the same values and gradients
  as torch's NCHW max-pool in about half its time.
* Outside ``torch.func`` transforms, the input is laid out channels-last
  (:func:`funcgraph.nn.channels_last`, a view for one-channel images) and every activation
  follows: the convolution, batch-norm and max-pool kernels are faster on that layout (see
  ``docs/meta-learning.md`` for the measured step).

With ``ways=None`` there is no head and the model returns the ``(B, hidden)`` embedding used
by prototypical networks.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch import nn as torch_nn

from .. import nn
from ..checks import check_int, check_sizes
from ..control import in_transform
from ..errors import ConfigError
from ..model import Model

VARIANTS = ("strided", "pool")


def _check(fn: str, variant: str, *, image_size: int, **sizes: int) -> None:
    """The hyperparameters :func:`conv4` and :func:`conv4_module` share."""
    if variant not in VARIANTS:
        raise ConfigError(f"{fn}: variant must be one of {VARIANTS}, got {variant!r}")
    check_sizes(fn, image_size=image_size, **sizes)
    if variant == "pool" and image_size < 16:
        raise ConfigError(f"{fn}: the 'pool' variant halves the image four times, so image_size "
                          f"must be >= 16, got {image_size}")


def conv4(
    ways: int | None,
    *,
    in_channels: int = 1,
    hidden: int = 64,
    image_size: int = 28,
    variant: str = "strided",
    eps: float = 1e-5,
    running_stats: bool = False,
    dtype: torch.dtype | None = None,
) -> Model:
    """The four-block few-shot CNN.

    Arguments:
        ways: classes of the linear head; ``None`` for an embedding network (no head).
        in_channels: image channels (1 for glyphs/Omniglot, 3 for RGB sets).
        hidden: channels of every block (64 in the MAML paper).
        image_size: input height and width, used to size the head of the ``"pool"`` variant.
        variant: ``"strided"`` (stride-2 convs, spatial mean) or ``"pool"`` (max-pool).
        eps: batch-norm epsilon.
        running_stats: batch norm keeps running statistics (state
            ``block{1..4}.norm.running_mean/running_var``, momentum 0.1): training returns them
            updated and evaluation normalises with them, each example on its own. Meta-learning
            trains the stateless default; MAML++'s per-step running statistics
            (:func:`funcgraph.meta.running_stats.step_running_stats`) accumulate on this twin.
    Returns:
        A :class:`~funcgraph.Model` (stateless unless ``running_stats``) mapping
        ``(B, in_channels, H, W)`` to ``(B, ways)`` logits (or ``(B, hidden)`` features).
        Params are named ``block{1..4}.conv.weight/bias``, ``block{1..4}.norm.weight/bias``,
        ``head.weight/bias``.

    Example::

        model = conv4(5)
        params, state = model.init(funcgraph.random.key(0))
        logits = funcgraph.bind(model, state)(params, images)   # (B, 5)
    """
    _check("conv4", variant, in_channels=in_channels, hidden=hidden, image_size=image_size)
    if not isinstance(running_stats, bool):
        raise ConfigError(f"conv4: running_stats must be a bool, got {running_stats!r}")
    if ways is not None:
        check_int("conv4", "ways (classes of the head, or None for no head)", ways)
    stride = 2 if variant == "strided" else 1
    blocks: dict[str, Model] = {}
    size = image_size
    for i in range(4):
        blocks[f"block{i + 1}"] = nn.conv_batch_norm(
            in_channels if i == 0 else hidden, hidden, 3, stride=stride, padding=1, eps=eps,
            track_running_stats=running_stats, dtype=dtype)
        size = (size + 1) // 2 if variant == "strided" else size // 2
    features = hidden if variant == "strided" else hidden * size * size
    children: dict[str, Model] = dict(blocks)
    if ways is not None:
        children["head"] = nn.linear(features, ways, dtype=dtype)

    def forward(run: nn.Children, x: Tensor) -> Tensor:
        if x.dim() == 4 and not in_transform():
            x = nn.channels_last(x)
        for name in blocks:
            x = run(name, x)
            if variant == "pool":
                x = nn.max_pool(x, 2)
            x = torch.relu(x)
        # (B, hidden, h, w) -> (B, features)
        x = x.mean(dim=(2, 3)) if variant == "strided" else x.flatten(1)
        return run("head", x) if ways is not None else x

    meta: dict[str, Any] = {"ways": ways, "in_channels": in_channels, "hidden": hidden,
                            "image_size": image_size, "variant": variant, "eps": eps,
                            "running_stats": running_stats}
    return nn.composite("conv4", children, forward, **meta)


class _TorchBlock(torch_nn.Module):
    """A block's container (``conv``, ``norm``): a subclass, not a bare ``nn.Module()``, so
    libraries that patch modules by type (``higher``) can patch it too."""


class _TorchConv4(torch_nn.Module):
    def __init__(self, ways: int, in_channels: int, hidden: int, variant: str,
                 image_size: int) -> None:
        super().__init__()
        stride = 2 if variant == "strided" else 1
        self.variant = variant
        size = image_size
        for i in range(4):
            block = _TorchBlock()
            block.conv = torch_nn.Conv2d(in_channels if i == 0 else hidden, hidden, 3, stride, 1)
            block.norm = torch_nn.BatchNorm2d(hidden, track_running_stats=False)
            self.add_module(f"block{i + 1}", block)
            size = (size + 1) // 2 if variant == "strided" else size // 2
        self.head = torch_nn.Linear(hidden if variant == "strided" else hidden * size * size, ways)

    def forward(self, x: Tensor) -> Tensor:
        for i in range(4):
            block = getattr(self, f"block{i + 1}")
            x = F.relu(block.norm(block.conv(x)))
            if self.variant == "pool":
                x = F.max_pool2d(x, 2)
        return self.head(x.mean((2, 3)) if self.variant == "strided" else x.flatten(1))


def conv4_module(
    ways: int,
    *,
    in_channels: int = 1,
    hidden: int = 64,
    variant: str = "strided",
    image_size: int = 28,
) -> torch_nn.Module:
    """conv4 written as a plain ``torch.nn`` module with the same parameter names: the
    reference the tests compare against and the baseline the meta-step benchmark clones
    (``Conv2d`` / ``BatchNorm2d(track_running_stats=False)`` / ReLU, max-pool in the ``pool``
    variant). ``load_state_dict(params)`` takes conv4's params."""
    _check("conv4_module", variant, ways=ways, in_channels=in_channels, hidden=hidden,
           image_size=image_size)
    return _TorchConv4(ways, in_channels, hidden, variant, image_size)


__all__ = ["VARIANTS", "conv4", "conv4_module"]
