"""Real Omniglot from its standard on-disk layout (nothing is downloaded).

Expected layout (as unzipped from the official ``images_background.zip`` and
``images_evaluation.zip``)::

    ROOT/images_background/ALPHABET/characterNN/*.png   (30 alphabets, 964 characters)
    ROOT/images_evaluation/ALPHABET/characterNN/*.png   (20 alphabets, 659 characters)

Each PNG is a 105x105 drawing, black strokes on white. We invert it (ink = 1) and resize it
to ``image_size`` with PIL's area-averaging ``BOX`` filter. Splits: ``evaluation`` is
``images_evaluation``; ``validation`` is the last sixth of the background alphabets in
sorted order (5 of 30), and ``background`` the rest (25), so the three never share an
alphabet. Every character must have the same number of drawings (20 in Omniglot).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..errors import DataError
from .datasets import ClassDataset, check_split

SPLITS = ("background", "validation", "evaluation")
_LAYOUT = "ROOT/images_background/ALPHABET/characterNN/*.png (and images_evaluation/)"


def _subdirs(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))


def _alphabets(root: Path, split: str) -> list[Path]:
    """The alphabet folders of ``split``."""
    check_split("load_omniglot", split, SPLITS)
    if not root.is_dir():
        raise DataError(f"omniglot: data root {root} is not a directory; expected {_LAYOUT}")
    folder = root / ("images_evaluation" if split == "evaluation" else "images_background")
    if not folder.is_dir():
        raise DataError(f"omniglot: {folder} not found; expected {_LAYOUT}")
    alphabets = _subdirs(folder)
    if split == "evaluation":
        return _nonempty(alphabets, folder)
    n_val = max(1, round(len(alphabets) / 6))
    if len(alphabets) < 2:
        raise DataError(
            f"omniglot: {folder} has {len(alphabets)} alphabet folder(s); background and "
            f"validation need at least 2; expected {_LAYOUT}"
        )
    chosen = alphabets[-n_val:] if split == "validation" else alphabets[:-n_val]
    return _nonempty(chosen, folder)


def _nonempty(alphabets: list[Path], folder: Path) -> list[Path]:
    if not alphabets:
        raise DataError(f"omniglot: {folder} has no alphabet folders; expected {_LAYOUT}")
    return alphabets


def _read(png: Path, image_size: int) -> np.ndarray:
    from PIL import Image

    from .images import open_image

    gray = open_image(png, "omniglot", "L")
    ink = Image.eval(gray, lambda v: 255 - v)  # black strokes on white -> ink = bright
    small = ink.resize((image_size, image_size), Image.Resampling.BOX)
    return np.asarray(small, dtype=np.float32) / 255.0


def load_omniglot(root: Path, split: str, *, image_size: int = 28) -> ClassDataset:
    """Load one split of Omniglot from ``root`` (see the module docstring for the layout).

    Raises:
        DataError: the root or a split folder is missing, a character folder has no PNGs or
            a different number of drawings than the others, or a PNG cannot be read; the
            message names the path and the expected layout.
    """
    root = Path(root).expanduser()
    images: list[np.ndarray] = []
    names: list[str] = []
    per_class: int | None = None
    for alphabet in _alphabets(root, split):
        characters = _subdirs(alphabet)
        if not characters:
            raise DataError(f"omniglot: {alphabet} has no character folders; expected {_LAYOUT}")
        for character in characters:
            pngs = sorted(character.glob("*.png"))
            if not pngs:
                raise DataError(f"omniglot: {character} has no .png files; expected {_LAYOUT}")
            if per_class is None:
                per_class = len(pngs)
            elif len(pngs) != per_class:
                raise DataError(
                    f"omniglot: {character} has {len(pngs)} drawings, earlier characters have "
                    f"{per_class}; every character needs the same number"
                )
            images.append(np.stack([_read(p, image_size) for p in pngs]))
            names.append(f"{alphabet.name}/{character.name}")
    pixels = torch.from_numpy(np.stack(images))[:, :, None]  # (C, P, 1, H, W)
    return ClassDataset(pixels, names, f"omniglot/{split}")
