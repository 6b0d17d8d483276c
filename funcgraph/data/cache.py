"""The dataset cache: one safetensors file per generated split, written atomically, verified.

A file holds the images as uint8 (ink * 255; generators quantise to that grid, so nothing
is lost) and, in the safetensors header, the cache key (generator version, seed, size,
split), the class names and the SHA-256 of the pixel bytes. Loading checks all three and
returns ``None`` for anything missing, truncated, corrupt or generated differently, which
the caller answers by regenerating. Nothing is unpickled.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save
from torch import Tensor

from ..errors import DataError
from ..files import atomic_write


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
    path: Path, images: Tensor, class_names: list[str], meta: Mapping[str, str]
) -> None:
    """Store float ``images`` (on the 1/255 grid) with ``class_names`` and ``meta``."""
    pixels = (images.detach().cpu() * 255).round().to(torch.uint8)
    header = {
        **meta,
        "class_names": json.dumps(class_names),
        "sha256": _digest(pixels),
    }
    try:
        atomic_write(path, save({"images": pixels}, metadata=header))
    except OSError as e:
        raise DataError(f"cannot write the dataset cache {path} ({e.strerror or e}); set "
                        "FUNCGRAPH_CACHE to a writable directory") from None


def load_cached(path: Path, meta: Mapping[str, str]) -> tuple[Tensor, list[str]] | None:
    """``(images, class_names)`` from ``path`` if it exists, is intact and matches ``meta``."""
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
            pixels = f.get_tensor("images")
    except (SafetensorError, OSError, ValueError, KeyError):
        return None
    if any(header.get(k) != v for k, v in meta.items()):
        return None
    if pixels.dtype != torch.uint8 or pixels.dim() != 5 or header.get("sha256") != _digest(pixels):
        return None
    try:
        names = json.loads(header.get("class_names", ""))
    except json.JSONDecodeError:
        return None
    if not isinstance(names, list) or len(names) != pixels.shape[0]:
        return None
    return pixels.to(torch.float32) / 255, [str(n) for n in names]
