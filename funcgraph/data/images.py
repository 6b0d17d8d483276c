"""Reading image files: the one decoder every on-disk loader uses, and a parallel batch decode.

:func:`open_image` opens a file with PIL and converts it to the mode a loader wants; every
way a file can fail to decode (not an image, truncated, corrupt, a decompression bomb)
becomes a :class:`~funcgraph.errors.DataError` naming the file. :func:`decode_rgb` is the
RGB pipeline of the folder loaders:

1. JPEGs are decoded at the smallest DCT scale (1/2, 1/4, 1/8) that still leaves both sides
   at least ``size`` (PIL's ``draft``): a 500x375 photo decodes at 250x188 for 84 pixels, at
   a fraction of the cost, before any resampling;
2. any mode (grayscale, palette, RGBA, CMYK...) is converted to RGB by PIL's ``convert``
   (alpha is dropped; a palette's transparency is resolved first). EXIF orientation is not
   applied, as in torchvision's loader;
3. the largest centred square is cropped and resized to ``size x size`` with PIL's bilinear
   filter, which widens with the downscale factor (antialiased), in one ``resize`` call.

Square images (the pre-resized 84x84 mini-ImageNet files) are therefore only resized (or
left alone); other aspect ratios keep their centre rather than being stretched.

:func:`decode_many` runs :func:`decode_rgb` over many files on a thread pool: PIL releases
the GIL while it decodes and resamples, so the threads run in parallel.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from ..errors import DataError

DECODER_VERSION = 1
"""Bump whenever a change to :func:`decode_rgb` alters any pixel; folder caches key on it."""

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
"""The file types the folder loaders read (matched case-insensitively)."""

_DECODE_ERRORS = (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError,
                  struct.error, Image.DecompressionBombError)
"""What PIL raises for a file it cannot decode (its plugins use all of these)."""


def open_image(path: Path, who: str, mode: str, *, draft: int | None = None) -> Image.Image:
    """The image at ``path`` in PIL mode ``mode`` (``"L"``, ``"RGB"``), fully decoded.

    ``draft`` lets a JPEG decode at a reduced scale that keeps both sides ``>= draft``.
    Raises a DataError ``"<who>: cannot read image <path>: <reason>"`` for any file PIL
    cannot decode.
    """
    try:
        with Image.open(path) as im:
            if draft is not None:
                im.draft(mode, (draft, draft))
            if im.mode == "P" and "transparency" in im.info:
                return im.convert("RGBA").convert(mode)
            return im.convert(mode)  # convert() loads: truncation and corruption fail here
    except _DECODE_ERRORS as e:
        raise DataError(f"{who}: cannot read image {path}: {e}") from None


def decode_rgb(path: Path, size: int, who: str) -> np.ndarray:
    """``(3, size, size)`` uint8 RGB pixels of the file at ``path`` (see the module
    docstring for the steps)."""
    im = open_image(path, who, "RGB", draft=size)
    w, h = im.size
    side = min(w, h)
    left, top = (w - side) // 2, (h - side) // 2
    small = im.resize((size, size), Image.Resampling.BILINEAR,
                      box=(left, top, left + side, top + side))
    return np.asarray(small, dtype=np.uint8).transpose(2, 0, 1)


def default_workers() -> int:
    """Decode threads: the CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)


def decode_many(
    paths: Sequence[Path], size: int, who: str, *, workers: int | None = None
) -> np.ndarray:
    """``(len(paths), 3, size, size)`` uint8: :func:`decode_rgb` of every file, in order, on
    ``workers`` threads (default :func:`default_workers`). The first unreadable file (in
    order) raises its DataError; files not yet started are then skipped."""
    out = np.empty((len(paths), 3, size, size), dtype=np.uint8)

    def one(i: int) -> None:
        out[i] = decode_rgb(paths[i], size, who)

    pool = ThreadPoolExecutor(max_workers=workers or default_workers())
    try:
        for _ in pool.map(one, range(len(paths))):
            pass
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return out


__all__ = ["DECODER_VERSION", "IMAGE_SUFFIXES", "decode_many", "decode_rgb", "default_workers",
           "open_image"]
