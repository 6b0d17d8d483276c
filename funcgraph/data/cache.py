"""The dataset cache: one safetensors file per split, written atomically, checked on load.

Generated sets (glyphs, rgb-shapes, patterns) and decoded image folders share it. A file holds
the pixels as uint8 (value * 255; generators quantise to that grid, so nothing is lost), for
classes of different sizes their ``counts``, and, in the safetensors header, the cache key
(which the caller builds: generator version, seed, size, split; or a folder's content key),
the class names and, when asked, the SHA-256 of the pixel bytes. Loading checks the key,
the shapes and that digest, and returns ``None`` for anything missing, truncated, corrupt or
made differently, which the caller answers by regenerating. Nothing is unpickled.

Loaded pixels are memory-mapped (safetensors maps the file; pages are read when touched and
copied on write), so opening a cached split costs milliseconds whatever its size, unless the
digest is verified, which reads every byte: the generated sets verify (their files are tens
of megabytes), decoded folders do not (a gigabyte to hash on every start would cost more
than the mapping saves; their files are written atomically and safetensors refuses a file
whose length disagrees with its header, so a crash or a truncation is still caught).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save
from torch import Tensor

from ..errors import DataError
from ..files import atomic_write
from .datasets import ClassDataset, check_generator_args


@dataclass(frozen=True)
class Cached:
    """A split read back from the cache.

    Attributes:
        pixels: ``(num_classes, per_class, C, H, W)`` uint8, memory-mapped.
        class_names: one per class.
        counts: ``(num_classes,)`` int64 images per class, or ``None`` when all are full.
    """

    pixels: Tensor
    class_names: list[str]
    counts: Tensor | None


class Generate(Protocol):
    """A generated set's ``generate_X(split, *, seed, image_size)``: one split, uncached."""

    def __call__(self, split: str, *, seed: int, image_size: int) -> ClassDataset: ...


def generated_split(dataset: str, version: int, split: str, *, seed: int, image_size: int,
                    cache_dir: Path | None, generate: Generate, loader: str,
                    splits: Iterable[str], variation: str | None = None,
                    as_read: Callable[[Tensor], Tensor] | None = None) -> ClassDataset:
    """What every generated set's ``load_X`` does: check the arguments (a ConfigError naming
    ``loader`` for a ``split`` not in ``splits``, a bad ``seed`` or ``image_size``), then give
    the split from the cache when a verified file for (``dataset``, generator ``version``,
    ``seed``, ``image_size``, ``split``, ``variation``) is there (memory-mapped), else
    ``generate(split, seed=seed, image_size=image_size)``'s, written to the cache atomically
    (a corrupt or mismatching file is regenerated). The cache directory is ``cache_dir``, else
    ``$FUNCGRAPH_CACHE``, else ``~/.cache/funcgraph``. ``as_read`` converts the cached uint8
    pixels (glyphs reads them as float)."""
    check_generator_args(loader, split, splits, seed, image_size)
    meta = {"dataset": dataset, "generator_version": str(version), "seed": str(seed),
            "image_size": str(image_size), "split": split,
            **({"variation": variation} if variation is not None else {})}
    path = cache_path(cache_dir, f"{dataset}-v{version}-seed{seed}-{image_size}px-{split}")
    cached = load_cached(path, meta)
    if cached is not None:
        pixels = cached.pixels if as_read is None else as_read(cached.pixels)
        return ClassDataset(pixels, cached.class_names, f"{dataset}/{split}")
    ds = generate(split, seed=seed, image_size=image_size)
    save_cached(path, ds.images, ds.class_names, meta)
    return ds


def cache_path(cache_dir: Path | None, stem: str) -> Path:
    """``cache_dir/stem.safetensors``; the directory defaults to ``$FUNCGRAPH_CACHE`` or
    ``~/.cache/funcgraph``."""
    if cache_dir is None:
        env = os.environ.get("FUNCGRAPH_CACHE")
        cache_dir = Path(env) if env else Path.home() / ".cache" / "funcgraph"
    return Path(cache_dir) / f"{stem}.safetensors"


def _digest(pixels: Tensor) -> str:
    return hashlib.sha256(pixels.contiguous().numpy().tobytes()).hexdigest()


def save_cached(
    path: Path,
    images: Tensor,
    class_names: list[str],
    meta: Mapping[str, str],
    *,
    counts: Tensor | None = None,
    digest: bool = True,
) -> None:
    """Store ``images`` (uint8, or float on the 1/255 grid) with ``class_names``, ``counts``
    and ``meta``; with ``digest``, the SHA-256 of the pixels that ``verify`` checks."""
    pixels = images.detach().cpu()
    if pixels.dtype != torch.uint8:
        pixels = (pixels * 255).round().to(torch.uint8)
    tensors = {"images": pixels.contiguous()}
    if counts is not None:
        tensors["counts"] = counts.to(torch.int64).cpu().contiguous()
    header = {**meta, "class_names": json.dumps(class_names)}
    if digest:
        header["sha256"] = _digest(pixels)
    try:
        atomic_write(path, save(tensors, metadata=header))
    except OSError as e:
        raise DataError(f"cannot write the dataset cache {path} ({e.strerror or e}); set "
                        "FUNCGRAPH_CACHE to a writable directory") from None


def load_cached(path: Path, meta: Mapping[str, str], *, verify: bool = True) -> Cached | None:
    """The split in ``path`` if it exists, is intact and matches ``meta``; with ``verify``,
    its pixels must match the stored SHA-256 too."""
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
            pixels = f.get_tensor("images")
            counts = f.get_tensor("counts") if "counts" in f.keys() else None
    except (SafetensorError, OSError, ValueError, KeyError):
        return None
    if any(header.get(k) != v for k, v in meta.items()):
        return None
    if pixels.dtype != torch.uint8 or pixels.dim() != 5:
        return None
    if counts is not None and (counts.dtype != torch.int64 or counts.shape != pixels.shape[:1]):
        return None
    if verify and header.get("sha256") != _digest(pixels):
        return None
    try:
        names = json.loads(header.get("class_names", ""))
    except json.JSONDecodeError:
        return None
    if not isinstance(names, list) or len(names) != pixels.shape[0]:
        return None
    return Cached(pixels, [str(n) for n in names], counts)
