"""Keyed augmentations: determinism, vmap over keys, identities, and what each one does."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import pytest
import torch
from torch import Tensor

from funcgraph import random
from funcgraph.data import color_jitter, compose, horizontal_flip, random_crop
from funcgraph.data.augment import GRAY_WEIGHTS
from funcgraph.errors import ConfigError, ShapeError

IMAGES = random.uniform(random.key(0), (6, 3, 10, 12))
KEYS = random.split(random.key(1), 5)

AUGMENTS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "crop": partial(random_crop, padding=3),
    "crop-smaller": partial(random_crop, padding=1, size=(7, 9)),
    "flip": horizontal_flip,
    "jitter": color_jitter,
    "composed": compose(partial(random_crop, padding=2), horizontal_flip, color_jitter),
}


@pytest.mark.parametrize("name", AUGMENTS)
def test_same_key_same_output_other_key_other_output(name: str) -> None:
    fn = AUGMENTS[name]
    a, b, c = fn(KEYS[0], IMAGES), fn(KEYS[0], IMAGES), fn(KEYS[1], IMAGES)
    assert torch.equal(a, b), f"{name}: the output must be a pure function of the key"
    assert not torch.equal(a, c), f"{name}: another key should give other images"
    assert a.dtype == IMAGES.dtype and a.shape[:2] == IMAGES.shape[:2], f"{name}: {a.shape}"


@pytest.mark.parametrize("name", AUGMENTS)
def test_vmap_over_keys_equals_a_loop(name: str) -> None:
    fn = AUGMENTS[name]
    mapped = torch.func.vmap(lambda k: fn(k, IMAGES))(KEYS)
    looped = torch.stack([fn(k, IMAGES) for k in KEYS])
    assert torch.equal(mapped, looped), f"{name}: vmap over keys differs from a loop"


def test_one_draw_per_image() -> None:
    flipped = horizontal_flip(random.key(3), IMAGES)
    per_image = [torch.equal(f, x.flip(-1)) or torch.equal(f, x)
                 for f, x in zip(flipped, IMAGES, strict=True)]
    assert all(per_image), "each image is either mirrored or unchanged"
    mirrored = [torch.equal(f, x.flip(-1)) for f, x in zip(flipped, IMAGES, strict=True)]
    assert 0 < sum(mirrored) < len(IMAGES), f"images flip independently: {mirrored}"


def test_flip_twice_with_one_key_is_the_identity() -> None:
    for k in KEYS:
        again = horizontal_flip(k, horizontal_flip(k, IMAGES))
        assert torch.equal(again, IMAGES), "the same key flips the same images back"
    assert torch.equal(horizontal_flip(KEYS[0], IMAGES, p=1.0), IMAGES.flip(-1)), "p=1 flips all"
    assert torch.equal(horizontal_flip(KEYS[0], IMAGES, p=0.0), IMAGES), "p=0 flips none"


def test_crop_with_zero_padding_and_full_size_is_the_identity() -> None:
    for k in KEYS:
        assert torch.equal(random_crop(k, IMAGES), IMAGES), "no padding, full size: identity"
        assert torch.equal(random_crop(k, IMAGES, padding=0, size=(10, 12)), IMAGES), "explicit"


def test_crop_is_a_window_of_the_zero_padded_image() -> None:
    pad, (h, w) = 2, (8, 9)
    out = random_crop(random.key(4), IMAGES, padding=pad, size=(h, w))
    padded = torch.nn.functional.pad(IMAGES, (pad,) * 4)
    offsets = set()
    for x, y in zip(padded, out, strict=True):
        found = [(t, s) for t in range(x.shape[1] - h + 1) for s in range(x.shape[2] - w + 1)
                 if torch.equal(x[:, t:t + h, s:s + w], y)]
        assert found, "every crop is some window of the padded image"
        offsets.add(found[0])
    assert len(offsets) > 1, f"offsets are drawn per image: {offsets}"


def test_jitter_strengths() -> None:
    x = IMAGES * 0.5 + 0.25  # away from the clip bounds
    assert torch.equal(color_jitter(KEYS[0], x, brightness=0, contrast=0, saturation=0), x), (
        "zero strengths are exactly the identity")
    bright = color_jitter(KEYS[0], x, contrast=0, saturation=0, brightness=0.2)
    ratio = (bright / x).flatten(1)
    assert torch.allclose(ratio, ratio[:, :1].expand_as(ratio), atol=1e-5), (
        "brightness scales each image by one factor")
    assert ((ratio[:, 0] >= 0.8) & (ratio[:, 0] <= 1.2)).all(), f"factor in [0.8, 1.2]: {ratio}"
    gray = color_jitter(KEYS[0], x, brightness=0, contrast=0, saturation=1.0)
    luma = lambda t: (t * torch.tensor(GRAY_WEIGHTS)[:, None, None]).sum(1)  # noqa: E731
    assert torch.allclose(luma(gray), luma(x), atol=1e-5), "saturation keeps the luma"
    full = color_jitter(KEYS[1], IMAGES, brightness=1, contrast=1, saturation=1)
    assert full.min() >= 0 and full.max() <= 1, "results stay in [0, 1]"


def test_float64_and_one_channel_images() -> None:
    x = random.uniform(random.key(5), (4, 1, 10, 12), dtype=torch.float64)
    for name, fn in AUGMENTS.items():
        y = fn(KEYS[0], x)
        assert y.dtype == torch.float64 and y.shape[1] == 1, f"{name}: {y.dtype} {y.shape}"


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda: random_crop(KEYS[0], IMAGES[0]), ShapeError, r"\(B, C, H, W\)"),
    (lambda: horizontal_flip(KEYS[0], (IMAGES * 255).to(torch.uint8)), ShapeError, "float"),
    (lambda: random_crop(KEYS[0], IMAGES, padding=-1), ConfigError, "padding"),
    (lambda: random_crop(KEYS[0], IMAGES, size=(20, 4)), ConfigError, "exceeds"),
    (lambda: horizontal_flip(KEYS[0], IMAGES, p=2), ConfigError, r"p must be in \[0, 1\]"),
    (lambda: color_jitter(KEYS[0], IMAGES, contrast=1.5), ConfigError, "contrast"),
    (lambda: color_jitter(KEYS[0], torch.rand(2, 2, 4, 4)), ShapeError, "1 or 3 channels"),
    (lambda: compose(), ConfigError, "one or more functions"),
], ids=["3d", "uint8", "padding", "size", "p", "contrast", "channels", "compose"])
def test_bad_inputs_are_funcgraph_errors(call: Callable[[], object], error: type,
                                         match: str) -> None:
    with pytest.raises(error, match=match):
        call()
