"""``rgb-shapes``: an embedded, procedurally generated RGB few-shot set (mini-ImageNet-sized).

Nothing downloads: every split is generated from a seed with funcgraph.random keys (so a
seed gives the same pixels on every run) and cached as safetensors like glyphs. The layout
copies mini-ImageNet's: 100 classes, split 64 / 16 / 20 into ``train``, ``val`` and
``test`` (disjoint: class ``c`` is drawn from ``fold_in(key(seed), c)`` and belongs to one
split), :data:`IMAGES_PER_CLASS` images each, 84x84 by default.

**A class** is an object on a background:

* a *shape*: a closed outline ``r(theta) = R (1 + sum_k a_k cos(k theta + phi_k))`` over
  harmonics 2..6, one of them dominant (an elongated blob, or 3 to 6 lobes or points), the
  rest small;
* a *colour* and *texture* of the object: an RGB colour modulated by stripes of a class
  frequency, angle and contrast, drawn in the object's own frame (they turn with it);
* a *background*: a colour with faint stripes of its own frequency and angle.

**An image** of the class moves, scales and turns the object, shifts the stripes' phase,
jitters every colour, mixes the background with a random colour and lights the image with a
random linear gradient (the :class:`Variation` fields). The amounts are tuned so that raw
pixels are a weak cue: the pixel-space 1-nearest-neighbour baseline on 5-way 1-shot test
tasks lands in 35-60% (docs/data.md has the measured figure), far from both chance (20%)
and from solved, so the set separates learners.

``python -m funcgraph.data --dataset rgb-shapes --preview out.png --baseline 600`` writes a
preview grid and scores that baseline.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

from .. import random
from .cache import generated_split
from .datasets import ClassDataset, check_split

GENERATOR_VERSION = 1
"""Bump whenever a change alters any pixel; it is part of the cache key."""

IMAGES_PER_CLASS = 60
"""Images of every class: enough for 5-shot tasks with 15 queries per class twice over."""

SPLITS: dict[str, range] = {"train": range(0, 64), "val": range(64, 80), "test": range(80, 100)}
"""Which class indices make up each split (mini-ImageNet's 64 / 16 / 20; disjoint)."""

HARMONICS = (2, 3, 4, 5, 6)
"""The outline's harmonics; the dominant one gives the shape its elongation (2) or its 3 to 6
lobes."""


@dataclass(frozen=True)
class Variation:
    """How much one image of a class differs from another (standard deviations unless said).

    Attributes:
        position: offset of the object's centre, in half-widths of the image.
        scale: log-scale of the object.
        rotation: turn of the object, radians.
        colour: per-channel offset of the object's and the background's colours.
        background: weight of a random colour mixed into the background (0: class colour
            only, 1: a random colour only); uniform per image in ``[0, background]``.
        light: slope of the random linear lighting gradient across the image.
    """

    position: float = 0.25
    scale: float = 0.2
    rotation: float = 0.6
    colour: float = 0.12
    background: float = 0.75
    light: float = 0.3


def _class_style(key: Tensor) -> dict[str, Tensor]:
    """The fixed attributes of one class (see the module docstring)."""
    k = random.split(key, 10)
    dominant = random.randint(k[0], (), 0, len(HARMONICS))
    amplitude = random.uniform(k[1], (len(HARMONICS),), low=0.0, high=0.08)
    amplitude = torch.where(torch.arange(len(HARMONICS)) == dominant,
                            random.uniform(k[2], (), low=0.15, high=0.35), amplitude)
    return {
        "amplitude": amplitude,  # (harmonics,)
        "phase": random.uniform(k[3], (len(HARMONICS),), high=2 * math.pi),
        "radius": random.uniform(k[4], (), low=0.4, high=0.6),
        "colour": random.uniform(k[5], (3,)),
        "background": random.uniform(k[6], (3,)),
        "stripes": random.uniform(k[7], (2,), low=1.5, high=6.0),  # object, background: cycles
        "angle": random.uniform(k[8], (2,), high=math.pi),
        "contrast": random.uniform(k[9], (2,), low=0.1, high=0.5) * torch.tensor([1.0, 0.3]),
    }


def render_class(
    seed: int, index: int, *, image_size: int = 84, count: int = IMAGES_PER_CLASS,
    variation: Variation | None = None,
) -> Tensor:
    """The images of class ``index``: ``(count, 3, image_size, image_size)`` float32 in
    ``[0, 1]``, quantised to multiples of 1/255 (what the cache stores)."""
    var = variation or Variation()
    style_key, image_key = random.split(random.fold_in(random.key(seed), index), 2)
    style = _class_style(style_key)
    n = count

    def normal(stream: int, *shape: int) -> Tensor:
        """``(n, *shape)`` standard normals: one block per nuisance, for all images."""
        return random.normal(random.fold_in(image_key, stream), (n, *shape))

    def uniform(stream: int, *shape: int) -> Tensor:
        return random.uniform(random.fold_in(image_key, stream), (n, *shape))

    def grid(t: Tensor) -> Tensor:  # (n, ...) -> (n, ..., 1, 1): broadcast over pixels
        return t[..., None, None]

    axis = (torch.arange(image_size, dtype=torch.float32) + 0.5) / image_size * 2 - 1
    v, u = torch.meshgrid(axis, axis, indexing="ij")  # (H, W) in [-1, 1]: rows, columns
    centre = normal(0, 2) * var.position
    scale = grid(torch.exp(normal(1) * var.scale))  # (n, 1, 1)
    turn = grid(normal(2) * var.rotation)
    du, dv = u - grid(centre[:, 0]), v - grid(centre[:, 1])  # (n, H, W)
    x = (du * torch.cos(turn) + dv * torch.sin(turn)) / scale  # the object's own frame
    y = (dv * torch.cos(turn) - du * torch.sin(turn)) / scale
    r, theta = torch.sqrt(x * x + y * y), torch.atan2(y, x)
    harmonics = torch.tensor(HARMONICS, dtype=torch.float32)
    wobble = style["amplitude"] * torch.cos(harmonics * theta[..., None] + style["phase"])
    outline = style["radius"] * (1 + wobble.sum(-1))  # (n, H, W)
    pixel = 2 / image_size / scale  # one pixel in the object's frame
    inside = torch.sigmoid((outline - r) / pixel)[:, None]  # (n, 1, H, W), anti-aliased edge

    phases = uniform(3, 2) * 2 * math.pi  # (n, 2): stripe phase of object, background

    def stripes(which: int, a: Tensor, b: Tensor) -> Tensor:
        """``1 + contrast * sin(...)`` of stripes ``which`` over coordinates ``(a, b)``."""
        angle = style["angle"][which]
        along = a * torch.cos(angle) + b * torch.sin(angle)
        wave = torch.sin(math.pi * style["stripes"][which] * along + grid(phases[:, which]))
        return (1 + style["contrast"][which] * wave)[:, None]  # (n, 1, H, W)

    fg = grid((style["colour"] + normal(4, 3) * var.colour).clamp(0, 1))  # (n, 3, 1, 1)
    bg = (style["background"] + normal(5, 3) * var.colour).clamp(0, 1)
    mix = uniform(6)[:, None] * var.background  # (n, 1)
    bg = grid((1 - mix) * bg + mix * uniform(7, 3))
    slope = normal(8, 2) * var.light
    light = (1 + grid(slope[:, 0]) * u + grid(slope[:, 1]) * v)[:, None]  # (n, 1, H, W)
    images = (inside * fg * stripes(0, x, y) + (1 - inside) * bg * stripes(1, u, v)) * light
    return (images.clamp(0, 1) * 255).round() / 255


def generate_rgb_shapes(split: str, *, seed: int = 0, image_size: int = 84) -> ClassDataset:
    """Generate one split without touching the cache (see :func:`load_rgb_shapes`)."""
    classes = SPLITS[check_split("generate_rgb_shapes", split, SPLITS)]
    images = torch.stack([render_class(seed, c, image_size=image_size) for c in classes])
    pixels = (images * 255).round().to(torch.uint8)
    return ClassDataset(pixels, [f"shape{c:03d}" for c in classes], f"rgb-shapes/{split}")


def load_rgb_shapes(
    split: str, *, seed: int = 0, cache_dir: Path | None = None, image_size: int = 84
) -> ClassDataset:
    """The ``rgb-shapes`` split ``split`` (``"train"``, ``"val"`` or ``"test"``) as uint8, from
    the cache or generated (seconds) and cached, as
    :func:`~funcgraph.data.cache.generated_split` says."""
    return generated_split("rgb-shapes", GENERATOR_VERSION, split, seed=seed,
                           image_size=image_size, cache_dir=cache_dir,
                           generate=generate_rgb_shapes, loader="load_rgb_shapes", splits=SPLITS,
                           variation=str(asdict(Variation())))


__all__ = ["GENERATOR_VERSION", "IMAGES_PER_CLASS", "SPLITS", "Variation",
           "generate_rgb_shapes", "load_rgb_shapes", "render_class"]
