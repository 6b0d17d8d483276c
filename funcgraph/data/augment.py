"""Image augmentation as keyed pure functions: random crop, horizontal flip, colour jitter.

Each augmentation is ``fn(key, images, **options) -> images`` over a batch ``(B, C, H, W)``
of float images in ``[0, 1]`` (a task's ``support_x`` or ``query_x`` flattened to one
batch): one draw per image, all from ``key`` (funcgraph.random), so the same key gives the
same output on every run. Nothing branches on a tensor's values (choices are masks and
``torch.where``, crops are gathers at drawn offsets), so ``torch.func.vmap`` over a batch of
keys gives the same images as a Python loop over them; options are plain Python numbers.

* :func:`random_crop`: zero-pad every side by ``padding``, then cut a ``size`` window at a
  uniformly drawn offset per image (torchvision's ``RandomCrop(size, padding)``).
* :func:`horizontal_flip`: mirror each image with probability ``p``.
* :func:`color_jitter`: scale brightness, contrast and saturation by factors drawn
  uniformly from ``[1 - s, 1 + s]`` per image, in that fixed order, each result clipped to
  ``[0, 1]`` (torchvision's ``adjust_*`` formulas; torchvision also shuffles the order).

:func:`compose` chains them, one key each. Options are bound with ``functools.partial``::

    augment = compose(partial(random_crop, padding=8), horizontal_flip, color_jitter)
    x = augment(key, images)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import random
from ..checks import check_fraction, check_int, check_ints
from ..errors import ConfigError, ShapeError
from ..random import Key

Augment = Callable[[Key, Tensor], Tensor]
"""``fn(key, images (B, C, H, W)) -> images``."""

GRAY_WEIGHTS = (0.299, 0.587, 0.114)
"""ITU-R 601 luma weights of R, G, B (torchvision's ``rgb_to_grayscale``)."""


def _batch(fn: str, images: Tensor) -> tuple[int, int, int, int]:
    """``(B, C, H, W)`` of a float image batch; a ShapeError for anything else."""
    if not isinstance(images, Tensor) or images.dim() != 4 or not images.is_floating_point():
        got = f"{tuple(images.shape)} {images.dtype}" if isinstance(images, Tensor) else type(
            images).__name__
        raise ShapeError(f"{fn}: images must be a float tensor (B, C, H, W), got {got}")
    b, c, h, w = images.shape
    return int(b), int(c), int(h), int(w)


def random_crop(
    key: Key, images: Tensor, *, padding: int = 0, size: int | tuple[int, int] | None = None
) -> Tensor:
    """A ``size`` window (default: the input's ``(H, W)``) of each zero-padded image, at an
    offset drawn uniformly per image; ``padding=0`` with the default size is the identity."""
    b, c, h, w = _batch("random_crop", images)
    pad = check_int("random_crop", "padding", padding, minimum=0)
    out_h, out_w = (h, w) if size is None else check_ints("random_crop", "size", size, dims=2)
    full_h, full_w = h + 2 * pad, w + 2 * pad
    if out_h > full_h or out_w > full_w:
        raise ConfigError(f"random_crop: size {(out_h, out_w)} exceeds the padded image "
                          f"{(full_h, full_w)}")
    k_y, k_x = random.split(key, 2)
    top = random.randint(k_y, (b,), 0, full_h - out_h + 1).to(images.device)  # (B,)
    left = random.randint(k_x, (b,), 0, full_w - out_w + 1).to(images.device)
    rows = top[:, None] + torch.arange(out_h, device=images.device)  # (B, out_h)
    cols = left[:, None] + torch.arange(out_w, device=images.device)  # (B, out_w)
    padded = F.pad(images, (pad, pad, pad, pad))  # (B, C, H + 2p, W + 2p), zeros outside
    x = padded.gather(2, rows[:, None, :, None].expand(b, c, out_h, full_w))
    return x.gather(3, cols[:, None, None, :].expand(b, c, out_h, out_w))  # (B, C, h, w)


def horizontal_flip(key: Key, images: Tensor, *, p: float = 0.5) -> Tensor:
    """Each image mirrored left-right with probability ``p``; the same key flips the same
    images, so applying it twice with one key is the identity."""
    b, *_ = _batch("horizontal_flip", images)
    prob = check_fraction("horizontal_flip", "p", p, allow_one=True)
    flip = random.bernoulli(key, prob, (b,)).to(images.device)
    return torch.where(flip[:, None, None, None], images.flip(-1), images)


def _gray(images: Tensor) -> Tensor:
    """``(B, 1, H, W)`` luma of RGB images (the image itself for one channel)."""
    if images.shape[1] == 1:
        return images
    weights = torch.tensor(GRAY_WEIGHTS, dtype=images.dtype, device=images.device)
    return (images * weights[:, None, None]).sum(1, keepdim=True)


def _blend_target(name: str, x: Tensor) -> Tensor:
    """What a jitter step blends with: black (brightness), the mean luma (contrast), the
    luma image (saturation)."""
    if name == "brightness":
        return torch.zeros_like(x)
    if name == "contrast":
        return _gray(x).mean(dim=(1, 2, 3), keepdim=True)
    return _gray(x)


def color_jitter(
    key: Key,
    images: Tensor,
    *,
    brightness: float = 0.4,
    contrast: float = 0.4,
    saturation: float = 0.4,
) -> Tensor:
    """Brightness, contrast and saturation scaled by per-image factors uniform in
    ``[1 - s, 1 + s]``: ``x * f``, then a blend with the image's mean luma, then with its
    luma image (``blend(x, y, f) = clip(y + f (x - y), 0, 1)``). A strength of 0 skips that
    step exactly; saturation needs 1 or 3 channels."""
    b, c, _, _ = _batch("color_jitter", images)
    strengths = {name: check_fraction("color_jitter", name, value, allow_one=True)
                 for name, value in (("brightness", brightness), ("contrast", contrast),
                                     ("saturation", saturation))}
    if strengths["saturation"] > 0 and c not in (1, 3):
        raise ShapeError(f"color_jitter: saturation needs 1 or 3 channels, got {c}")
    keys = random.split(key, 3)
    x = images
    for k, (name, s) in zip(keys, strengths.items(), strict=True):
        if s == 0:
            continue
        f = random.uniform(k, (b,), dtype=images.dtype, low=1 - s, high=1 + s)
        f = f.to(images.device)[:, None, None, None]
        target = _blend_target(name, x)
        x = (target + f * (x - target)).clamp(0, 1)
    return x


def compose(*steps: Augment) -> Augment:
    """One augmentation running ``steps`` in order, step ``i`` with ``split(key, n)[i]``."""
    if not steps or not all(callable(s) for s in steps):
        raise ConfigError(f"compose: expected one or more functions fn(key, images), got "
                          f"{steps!r}")

    def augment(key: Key, images: Tensor) -> Tensor:
        for k, step in zip(random.split(key, len(steps)), steps, strict=True):
            images = step(k, images)
        return images

    return augment


__all__ = ["GRAY_WEIGHTS", "Augment", "color_jitter", "compose", "horizontal_flip",
           "random_crop"]
