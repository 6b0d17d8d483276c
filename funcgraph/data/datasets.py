"""The class-indexed dataset every few-shot loader returns, and what can be done to one.

A :class:`ClassDataset` is one split (background, validation or evaluation) held as a single
tensor ``(num_classes, per_class, 1, H, W)``: one row per character, one column per drawing.
Holding a split as one dense tensor is what makes task sampling a single indexing operation
(see :mod:`funcgraph.data.tasks`) instead of a Python loop over files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from ..errors import ShapeError


@dataclass(frozen=True)
class ClassDataset:
    """One split of a few-shot image dataset.

    Attributes:
        images: ``(num_classes, per_class, 1, H, W)`` float32 in ``[0, 1]``, ink = 1,
            background = 0.
        class_names: one name per class, e.g. ``"alphabet07/character12"``.
        name: what the split is, e.g. ``"glyphs/evaluation"``.
    """

    images: Tensor
    class_names: list[str] = field(repr=False)
    name: str

    def __post_init__(self) -> None:
        x = self.images
        if not isinstance(x, Tensor) or x.dim() != 5 or x.shape[2] != 1:
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ShapeError(
                f"ClassDataset {self.name!r}: images must be (num_classes, per_class, 1, H, W), "
                f"got {got}"
            )
        if x.dtype != torch.float32:
            raise ShapeError(f"ClassDataset {self.name!r}: images must be float32, got {x.dtype}")
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

    @property
    def num_classes(self) -> int:
        """Number of classes (characters)."""
        return int(self.images.shape[0])

    @property
    def per_class(self) -> int:
        """Number of examples (drawings) of every class."""
        return int(self.images.shape[1])

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(1, H, W)``."""
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
    return ClassDataset(torch.cat(rotated), names, f"{ds.name}+rot")


def save_preview(
    ds: ClassDataset, path: str | Path, *, classes: int = 12, per_class: int = 10, scale: int = 2
) -> Path:
    """Write a PNG grid of the first ``classes`` classes (rows) x ``per_class`` drawings.

    Ink is drawn dark on white, as on paper; ``scale`` enlarges every pixel.
    """
    from PIL import Image

    rows = min(classes, ds.num_classes)
    cols = min(per_class, ds.per_class)
    _, h, w = ds.image_shape
    pad = 2
    grid = torch.ones(rows * (h + pad) + pad, cols * (w + pad) + pad)
    for r in range(rows):
        for c in range(cols):
            top, left = pad + r * (h + pad), pad + c * (w + pad)
            grid[top : top + h, left : left + w] = 1.0 - ds.images[r, c, 0]
    pixels = (grid.clamp(0, 1) * 255).round().to(torch.uint8).numpy()
    image = Image.fromarray(pixels)  # uint8 (H, W) -> mode "L"
    image = image.resize((image.width * scale, image.height * scale), Image.Resampling.NEAREST)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    image.save(out)
    return out
