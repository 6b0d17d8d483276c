"""The class-indexed dataset every few-shot loader returns, and what can be done to one.

A :class:`ClassDataset` is one split (glyphs' background / validation / evaluation, an image
folder's train / val / test) held as a single tensor ``(num_classes, per_class, C, H, W)``:
one row per class, one column per example. Holding a split as one dense tensor is what makes
task sampling a single indexing operation (see :mod:`funcgraph.data.tasks`) instead of a
Python loop over files.

Real image folders have **different numbers of images per class** (CUB: 41 to 60). They stay
one dense tensor: each class's row is padded to the largest class by repeating that class's
own images from its first, and ``counts`` records how many of the row are distinct images.
The sampler draws examples only from ``range(counts[c])``, so padding never puts one image in
both the support and the query set; code that ignores ``counts`` sees repeats of real images
of the right class, never blanks. Padding costs memory in proportion to the imbalance (a
folder with one class of 1,000 images and the rest of 50 pads every row to 1,000).

Images are float32 in ``[0, 1]``, or **uint8** (value * 255): the image caches store bytes
and hand them out memory-mapped, so a 60,000-image split costs no read and no float copy
until a task gathers its few images (:func:`as_float` converts them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from ..checks import check_int
from ..errors import ConfigError, ShapeError

CHANNELS = (1, 3)
"""Grayscale (glyphs, patterns, Omniglot) or RGB (image folders, rgb-shapes)."""


def check_split(fn: str, split: str, splits: Iterable[str]) -> str:
    """``split`` if it is one of ``splits``, else a ConfigError naming the loader ``fn``, the
    split names it knows and the value: an unknown split name is a wrong argument (as an
    unknown option is), not a fault of the files on disk, which is a DataError."""
    names = list(splits)
    if split not in names:
        raise ConfigError(f"{fn}: unknown split {split!r}; expected one of {names}")
    return split


def check_generator_args(fn: str, split: str, splits: Iterable[str], seed: object,
                         image_size: object) -> None:
    """The arguments every generated set's loader takes: a known ``split``, a ``seed`` that
    :func:`funcgraph.random.key` accepts and an ``image_size`` of at least 8; a ConfigError
    naming ``fn`` otherwise."""
    check_split(fn, split, splits)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise ConfigError(f"{fn}: seed must be an int in [0, 2**64), got {seed!r}")
    check_int(fn, "image_size", image_size, minimum=8)


def as_float(images: Tensor) -> Tensor:
    """``images`` as float32 in ``[0, 1]``: uint8 pixels divided by 255 (in place in the new
    float copy: one allocation), float32 unchanged."""
    return images.to(torch.float32).div_(255) if images.dtype == torch.uint8 else images


@dataclass(frozen=True)
class ClassDataset:
    """One split of a few-shot image dataset.

    Attributes:
        images: ``(num_classes, per_class, C, H, W)`` with ``C`` 1 (ink = 1, background = 0)
            or 3 (RGB); float32 in ``[0, 1]`` or uint8 (value * 255).
        class_names: one name per class, e.g. ``"alphabet07/character12"``.
        name: what the split is, e.g. ``"glyphs/evaluation"``.
        counts: ``(num_classes,)`` int64, the distinct images of each class when classes
            differ in size (row ``c`` holds them first, then repeats of them; see the module
            docstring); ``None`` when every row is full.
    """

    images: Tensor
    class_names: list[str] = field(repr=False)
    name: str
    counts: Tensor | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        x = self.images
        if not isinstance(x, Tensor) or x.dim() != 5 or x.shape[2] not in CHANNELS:
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ShapeError(
                f"ClassDataset {self.name!r}: images must be (num_classes, per_class, 1, H, W) "
                f"(grayscale) or (num_classes, per_class, 3, H, W) (RGB), got {got}"
            )
        if x.dtype not in (torch.float32, torch.uint8):
            raise ShapeError(f"ClassDataset {self.name!r}: images must be float32 in [0, 1] or "
                             f"uint8, got {x.dtype}")
        if x.shape[0] < 1 or x.shape[1] < 1:
            raise ShapeError(
                f"ClassDataset {self.name!r}: needs at least one class and one example per "
                f"class, got images of shape {tuple(x.shape)}"
            )
        if len(self.class_names) != x.shape[0]:
            raise ShapeError(
                f"ClassDataset {self.name!r}: {len(self.class_names)} class names for "
                f"{x.shape[0]} classes"
            )
        c = self.counts
        if c is not None and not (
            isinstance(c, Tensor) and c.dtype == torch.int64 and c.shape == x.shape[:1]
            and bool((c >= 1).all()) and bool((c <= x.shape[1]).all())
        ):
            shown = f"{tuple(c.shape)} {c.dtype}" if isinstance(c, Tensor) else type(c).__name__
            raise ShapeError(
                f"ClassDataset {self.name!r}: counts must be int64 ({x.shape[0]},) with values "
                f"in [1, {x.shape[1]}] (images per class), got {shown}"
            )

    @property
    def num_classes(self) -> int:
        """Number of classes (characters)."""
        return int(self.images.shape[0])

    @property
    def per_class(self) -> int:
        """Number of examples every class has: the smallest class's count."""
        return int(self.images.shape[1]) if self.counts is None else int(self.counts.min())

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)``."""
        c, h, w = self.images.shape[2:]
        return int(c), int(h), int(w)


def rotate_classes(ds: ClassDataset) -> ClassDataset:
    """Add 90, 180 and 270 degree rotations of every class as new classes (MAML protocol).

    Finn et al. (2017), following Santoro et al. (2016), augment Omniglot's training characters
    this way: a rotated character is a different class, so the class count quadruples. The
    result is ``[originals, rot90, rot180, rot270]`` along the class axis; names get a
    ``"/rot90"``-style suffix. Use it on the training split only.
    """
    if ds.images.shape[-1] != ds.images.shape[-2]:
        raise ShapeError(
            f"rotate_classes: images must be square to rotate, got {tuple(ds.images.shape)}"
        )
    rotated = [torch.rot90(ds.images, k, dims=(-2, -1)) for k in range(4)]
    names = [n if k == 0 else f"{n}/rot{90 * k}" for k in range(4) for n in ds.class_names]
    counts = None if ds.counts is None else ds.counts.repeat(4)
    return ClassDataset(torch.cat(rotated), names, f"{ds.name}+rot", counts)


def save_preview(
    ds: ClassDataset, path: str | Path, *, classes: int = 12, per_class: int = 10, scale: int = 2
) -> Path:
    """Write a PNG grid of the first ``classes`` classes (rows) x ``per_class`` examples.

    Grayscale ink is drawn dark on white, as on paper; RGB images as they are, on white.
    ``scale`` enlarges every pixel.
    """
    from PIL import Image

    rows = min(classes, ds.num_classes)
    cols = min(per_class, ds.per_class)
    channels, h, w = ds.image_shape
    pad = 2
    grid = torch.ones(channels, rows * (h + pad) + pad, cols * (w + pad) + pad)
    for r in range(rows):
        for c in range(cols):
            top, left = pad + r * (h + pad), pad + c * (w + pad)
            x = as_float(ds.images[r, c])  # (C, H, W)
            grid[:, top : top + h, left : left + w] = 1.0 - x if channels == 1 else x
    pixels = (grid.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    image = Image.fromarray(pixels[..., 0] if channels == 1 else pixels)  # mode "L" or "RGB"
    image = image.resize((image.width * scale, image.height * scale), Image.Resampling.NEAREST)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    image.save(out)
    return out
