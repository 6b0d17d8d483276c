"""``glyphs``: the embedded, procedurally generated Omniglot-like dataset.

Nothing downloads: every split is generated from a seed with :mod:`funcgraph.data.strokes`
(funcgraph.random keys only, so a seed gives the same pixels on every run; another platform's
maths library may round a rare pixel differently) and cached as safetensors. The layout
copies Omniglot's: 50 alphabets of 14-55 characters (Omniglot's own alphabet sizes), 1,623
characters, 20 drawings each, split by alphabet into **background** (30 alphabets, 964
characters) and **evaluation** (20 alphabets, 659 characters). Because new alphabets cost
nothing here, **validation** is a separate set of 10 further alphabets (299 characters)
rather than a cut from background: background stays Omniglot-sized, and validation measures
what the test measures, transfer to unseen alphabets. Every alphabet ``a`` draws from
``fold_in(key(seed), a)``, so each split is generated on its own.

``python -m funcgraph.data --preview out.png --baseline 600`` writes a grid of drawings and
scores the pixel 1-NN baseline (see :mod:`funcgraph.data.__main__`).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from .. import random
from ..errors import DataError
from .cache import generated_split
from .datasets import ClassDataset, as_float, check_split
from .strokes import Noise, render, sample_characters, sample_drawings, sample_style

GENERATOR_VERSION = 2
"""Bump whenever a change alters any pixel; it is part of the cache key."""

DRAWERS = 20
# Omniglot's alphabet sizes: images_background (30 alphabets, 964 characters), then
# images_evaluation (20 alphabets, 659 characters); then our 10 validation alphabets.
BACKGROUND_SIZES = (
    20, 29, 26, 41, 40, 24, 46, 14, 26, 34, 33, 22, 26, 43, 24,
    48, 22, 16, 52, 47, 40, 26, 40, 41, 33, 14, 42, 23, 17, 55,
)  # fmt: skip
EVALUATION_SIZES = (
    20, 26, 26, 26, 26, 26, 45, 45, 41, 26, 47, 40, 30, 45, 46, 28, 23, 25, 42, 26,
)  # fmt: skip
VALIDATION_SIZES = (20, 26, 33, 41, 24, 46, 17, 30, 40, 22)
ALPHABET_SIZES = BACKGROUND_SIZES + EVALUATION_SIZES + VALIDATION_SIZES


def _span(start: int, sizes: tuple[int, ...]) -> range:
    return range(start, start + len(sizes))


SPLITS: dict[str, range] = {
    "background": _span(0, BACKGROUND_SIZES),
    "evaluation": _span(len(BACKGROUND_SIZES), EVALUATION_SIZES),
    "validation": _span(len(BACKGROUND_SIZES) + len(EVALUATION_SIZES), VALIDATION_SIZES),
}
"""Which alphabet indices make up each split (disjoint by construction)."""


def render_alphabet(
    seed: int,
    alphabet: int,
    *,
    image_size: int = 28,
    characters: slice | None = None,
    noise: Noise | None = None,
) -> Tensor:
    """Images of one alphabet's characters: ``(n, DRAWERS, 1, image_size, image_size)``.

    ``characters`` picks a subset (the random draws are made for the whole alphabet first, so
    a subset's pixels equal the same characters' pixels in the full alphabet). Ink is
    quantised to multiples of 1/255, exactly what the cache stores.
    """
    if not 0 <= alphabet < len(ALPHABET_SIZES):
        raise DataError(f"glyphs: alphabet must be in [0, {len(ALPHABET_SIZES)}), got {alphabet}")
    k_style, k_chars, k_draw = random.split(random.fold_in(random.key(seed), alphabet), 3)
    style = sample_style(k_style)
    ctrl, active = sample_characters(k_chars, style, ALPHABET_SIZES[alphabet])
    drawn, pen = sample_drawings(k_draw, ctrl, style, DRAWERS, noise or Noise())
    pick = characters or slice(None)
    drawn, pen, active = drawn[pick], pen[pick], active[pick]
    n = drawn.shape[0]
    flat_active = active[:, None].expand(n, DRAWERS, -1).flatten(0, 1)
    ink = render(drawn.flatten(0, 1), flat_active, pen.flatten(), image_size)
    ink = (ink * 255).round() / 255
    return ink.reshape(n, DRAWERS, 1, image_size, image_size)


def generate_glyphs(split: str, *, seed: int = 0, image_size: int = 28) -> ClassDataset:
    """Generate one split without touching the cache (see :func:`load_glyphs`)."""
    alphabets = SPLITS[check_split("generate_glyphs", split, SPLITS)]
    images = torch.cat([render_alphabet(seed, a, image_size=image_size) for a in alphabets])
    names = [
        f"alphabet{a:02d}/character{c + 1:02d}" for a in alphabets for c in range(ALPHABET_SIZES[a])
    ]
    return ClassDataset(images, names, f"glyphs/{split}")


def load_glyphs(
    split: str, *, seed: int = 0, cache_dir: Path | None = None, image_size: int = 28
) -> ClassDataset:
    """The ``glyphs`` split ``split`` ("background", "validation" or "evaluation") as float,
    from the cache or generated (a few seconds) and cached, as
    :func:`~funcgraph.data.cache.generated_split` says."""
    return generated_split("glyphs", GENERATOR_VERSION, split, seed=seed, image_size=image_size,
                           cache_dir=cache_dir, generate=generate_glyphs, loader="load_glyphs",
                           splits=SPLITS, as_read=as_float)
