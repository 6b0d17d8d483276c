"""Few-shot RGB datasets from disk: a class-per-folder tree, mini-ImageNet and CUB-200-2011.

Every loader is ``load_X(root, split, *, image_size=84)`` with ``split`` one of ``"train"``,
``"val"``, ``"test"``, and returns a uint8 :class:`ClassDataset` of
``(classes, images, 3, image_size, image_size)``. The layouts (nothing is downloaded)::

    folder:         ROOT/{train,val,test}/CLASS/*.{png,jpg,jpeg}
    mini-imagenet:  ROOT/images/*.jpg  and  ROOT/{train,val,test}.csv   ("filename,label")
    cub:            ROOT/images/CLASS/*.jpg  and  ROOT/splits/{train,val,test}.txt
                    (one class folder name per line; blank lines and "#" comments skipped)

Classes are sorted by name; a class's images are in sorted file order (folder, cub) or csv
order (mini-imagenet). Classes may differ in size (see :class:`ClassDataset`'s ``counts``).
Images are decoded by :func:`funcgraph.data.images.decode_rgb` (RGB, centre square, bilinear).

**The decoded cache.** The first load of a split decodes every file on a thread pool and
writes the pixels to ``<cache dir>/<kind>-<split>-<size>px-<root hash>.safetensors`` (the
directory is ``cache_dir``, else ``$FUNCGRAPH_CACHE``, else ``~/.cache/funcgraph``, as for
glyphs); later loads memory-map that file. Its key, stored in the header, is the SHA-256 of
the split's listing: every image's path relative to the root, byte size and modification
time (ns), in class order, plus the bytes of the csv / split file, plus the decoder version
and the image size. Adding, removing, renaming, rewriting or touching a file changes the key
and the split is decoded again (into the same file, so stale copies do not pile up). Pixel
bytes are never hashed: reading 60,000 JPEGs to hash them would cost most of what decoding
them does. A file edited in place with its size and mtime restored goes unnoticed.
"""

from __future__ import annotations

import csv
import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import Tensor

from ..checks import check_int
from ..errors import ConfigError, DataError
from .cache import cache_path, load_cached, save_cached
from .datasets import ClassDataset
from .images import DECODER_VERSION, IMAGE_SUFFIXES, decode_many

SPLITS = ("train", "val", "test")

_FOLDER = "ROOT/{train,val,test}/CLASS/*.{png,jpg,jpeg}"
_MINI = "ROOT/images/*.jpg with ROOT/{train,val,test}.csv (header 'filename,label')"
_CUB = "ROOT/images/CLASS/*.jpg with ROOT/splits/{train,val,test}.txt (one class per line)"

Classes = dict[str, list[Path]]
"""Class name -> its image files, in order."""


def _check(kind: str, root: str | Path, split: str, image_size: int, layout: str) -> Path:
    """The checked root of a ``kind`` load (a ConfigError for a bad split or size, a
    DataError for a missing root)."""
    if split not in SPLITS:
        raise ConfigError(f"{kind}: unknown split {split!r}; expected one of {list(SPLITS)}")
    check_int(kind, "image_size", image_size, minimum=8)
    path = Path(root).expanduser().resolve()  # one cache entry per folder, whatever the cwd
    if not path.is_dir():
        raise DataError(f"{kind}: data root {path} is not a directory; expected {layout}")
    return path


def _images_in(folder: Path) -> list[Path]:
    """The image files directly in ``folder``, sorted by name (hidden files and other types
    skipped). ``scandir`` and string sorting: listing 60,000 files stays well under a second."""
    with os.scandir(folder) as entries:
        names = sorted(e.name for e in entries if not e.name.startswith(".")
                       and os.path.splitext(e.name)[1].lower() in IMAGE_SUFFIXES and e.is_file())
    return [folder / n for n in names]


def _required(path: Path, kind: str, what: str, layout: str, *, folder: bool) -> Path:
    if not (path.is_dir() if folder else path.is_file()):
        raise DataError(f"{kind}: {what} {path} not found; expected {layout}")
    return path


def _nonempty(classes: Classes, kind: str, where: Path, layout: str) -> Classes:
    if not classes:
        raise DataError(f"{kind}: {where} names no classes; expected {layout}")
    return classes


def _content_key(kind: str, root: Path, classes: Classes, defining: Iterable[Path]) -> str:
    """SHA-256 of the split's listing (see the module docstring); a listed file that cannot
    be stat'ed is a DataError naming it."""
    h = hashlib.sha256()
    prefix = len(str(root)) + 1  # files are root/...: their path below the root
    for name, files in classes.items():
        h.update(f"class\t{name}\n".encode())
        for f in files:
            try:
                st = os.stat(f)
            except OSError as e:
                raise DataError(f"{kind}: cannot read image {f}: {e.strerror or e}") from None
            h.update(f"{str(f)[prefix:]}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
    for f in defining:
        h.update(f"split-file\t{f.name}\t".encode() + hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def _padded(flat: Tensor, counts: list[int]) -> Tensor:
    """``(classes, max(counts), ...)`` from the images of all classes in a row: each class
    padded by repeating its own images from its first (a view when all counts are equal)."""
    most = max(counts)
    if min(counts) == most:
        return flat.reshape(len(counts), most, *flat.shape[1:])
    sizes = torch.tensor(counts, dtype=torch.int64)
    starts = torch.cumsum(sizes, 0) - sizes
    index = starts[:, None] + torch.arange(most)[None, :] % sizes[:, None]
    return flat[index]


def _load(kind: str, root: Path, split: str, classes: Classes, defining: list[Path],
          image_size: int, cache_dir: Path | None, workers: int | None) -> ClassDataset:
    """The split ``classes`` from the cache, or decoded and cached (see the module docstring)."""
    names = list(classes)
    counts = [len(files) for files in classes.values()]
    ragged = min(counts) != max(counts)
    meta = {
        "dataset": kind,
        "decoder_version": str(DECODER_VERSION),
        "image_size": str(image_size),
        "split": split,
        "root": str(root),
        "content": _content_key(kind, root, classes, defining),
    }
    where = hashlib.sha256(str(root).encode()).hexdigest()[:12]
    path = cache_path(cache_dir, f"{kind}-{split}-{image_size}px-{where}")
    label = f"{kind}/{split}"
    cached = load_cached(path, meta, verify=False)
    if cached is not None:  # the content key covers the class names
        return ClassDataset(cached.pixels, names, label, cached.counts)
    files = [f for group in classes.values() for f in group]
    flat = torch.from_numpy(decode_many(files, image_size, kind, workers=workers))
    pixels = _padded(flat, counts)
    sizes = torch.tensor(counts, dtype=torch.int64) if ragged else None
    save_cached(path, pixels, names, meta, counts=sizes, digest=False)
    return ClassDataset(pixels, names, label, sizes)


def load_folder(
    root: str | Path,
    split: str,
    *,
    image_size: int = 84,
    cache_dir: Path | None = None,
    workers: int | None = None,
) -> ClassDataset:
    """One split of ``ROOT/{train,val,test}/CLASS/*.{png,jpg,jpeg}`` (any class-per-folder
    few-shot set, e.g. tiered-ImageNet or FC100 unpacked to images).

    Arguments:
        root: the folder holding ``train/``, ``val/``, ``test/``.
        split: ``"train"``, ``"val"`` or ``"test"``.
        image_size: side of the square images returned.
        cache_dir: where the decoded cache lives (default ``$FUNCGRAPH_CACHE``).
        workers: decode threads on a cache miss (default: the CPUs available).
    Raises:
        DataError: the root or split folder is missing, has no class folders, a class folder
            has no images, or an image cannot be read (the message names the path).
    """
    kind = "folder"
    base = _check(kind, root, split, image_size, _FOLDER)
    folder = _required(base / split, kind, "split folder", _FOLDER, folder=True)
    classes: Classes = {}
    for sub in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        images = _images_in(sub)
        if not images:
            raise DataError(f"{kind}: class folder {sub} has no .png/.jpg/.jpeg files; "
                            f"expected {_FOLDER}")
        classes[sub.name] = images
    return _load(kind, base, split, _nonempty(classes, kind, folder, _FOLDER), [], image_size,
                 cache_dir, workers)


def _read_csv(table: Path, images: Path, kind: str) -> Classes:
    """Label -> image files of a ``filename,label`` csv, labels sorted, rows in file order."""
    try:
        with table.open(newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{kind}: cannot read {table}: {e}") from None
    if not rows or [c.strip() for c in rows[0]] != ["filename", "label"]:
        raise DataError(f"{kind}: {table} line 1 must be the header 'filename,label', got "
                        f"{','.join(rows[0]) if rows else 'an empty file'!r}")
    by_label: Classes = {}
    seen: set[str] = set()
    for line, row in enumerate(rows[1:], start=2):
        if not any(c.strip() for c in row):
            continue
        if len(row) != 2 or not row[0].strip() or not row[1].strip():
            raise DataError(f"{kind}: {table} line {line}: expected 'filename,label', got "
                            f"{','.join(row)!r}")
        name, label = row[0].strip(), row[1].strip()
        if Path(name).name != name:
            raise DataError(f"{kind}: {table} line {line}: {name!r} is not a file name in "
                            f"{images} (no folders); expected {_MINI}")
        if name in seen:
            raise DataError(f"{kind}: {table} line {line} lists {name} a second time")
        seen.add(name)
        file = images / name
        if not file.is_file():
            raise DataError(f"{kind}: {table} line {line} names {file}, which does not exist; "
                            f"expected {_MINI}")
        by_label.setdefault(label, []).append(file)
    return {label: by_label[label] for label in sorted(by_label)}


def load_mini_imagenet(
    root: str | Path,
    split: str,
    *,
    image_size: int = 84,
    cache_dir: Path | None = None,
    workers: int | None = None,
) -> ClassDataset:
    """One split of mini-ImageNet in Ravi & Larochelle's layout: ``ROOT/images/*.jpg`` and
    ``ROOT/{train,val,test}.csv`` with a ``filename,label`` header (64 / 16 / 20 classes of
    600 images). Arguments as :func:`load_folder`.

    Raises:
        DataError: the root, ``images/`` or the split's csv is missing, the csv is malformed,
            lists a file twice or names a file that does not exist, or an image cannot be
            read (the message names the file, and the csv line).
    """
    kind = "mini-imagenet"
    base = _check(kind, root, split, image_size, _MINI)
    images = _required(base / "images", kind, "image folder", _MINI, folder=True)
    table = _required(base / f"{split}.csv", kind, "split file", _MINI, folder=False)
    classes = _nonempty(_read_csv(table, images, kind), kind, table, _MINI)
    return _load(kind, base, split, classes, [table], image_size, cache_dir, workers)


def _read_class_list(listing: Path, images: Path, kind: str) -> Classes:
    """Class folder -> its images, for the class names in ``listing`` (sorted)."""
    try:
        lines = listing.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{kind}: cannot read {listing}: {e}") from None
    classes: Classes = {}
    for number, text in enumerate(lines, start=1):
        name = text.strip()
        if not name or name.startswith("#"):
            continue
        if name in classes:
            raise DataError(f"{kind}: {listing} line {number} lists class {name!r} again")
        folder = images / name
        if not folder.is_dir():
            raise DataError(f"{kind}: {listing} line {number} names class {name!r}, but "
                            f"{folder} is not a folder; expected {_CUB}")
        files = _images_in(folder)
        if not files:
            raise DataError(f"{kind}: class folder {folder} has no .jpg/.jpeg/.png files")
        classes[name] = files
    return {name: classes[name] for name in sorted(classes)}


def load_cub(
    root: str | Path,
    split: str,
    *,
    image_size: int = 84,
    cache_dir: Path | None = None,
    workers: int | None = None,
) -> ClassDataset:
    """One split of CUB-200-2011 (``ROOT`` is the unpacked ``CUB_200_2011/``): the class
    folders of ``ROOT/images/`` named in ``ROOT/splits/{train,val,test}.txt``, one per line
    (``001.Black_footed_Albatross``). docs/data.md shows how to write the usual 100 / 50 /
    50 split. Arguments as :func:`load_folder`.

    Raises:
        DataError: the root, ``images/`` or the split file is missing, the split file names a
            class twice or a folder that does not exist or has no images, or an image cannot
            be read (the message names the file, and the line).
    """
    kind = "cub"
    base = _check(kind, root, split, image_size, _CUB)
    images = _required(base / "images", kind, "image folder", _CUB, folder=True)
    listing = _required(base / "splits" / f"{split}.txt", kind, "split file", _CUB, folder=False)
    classes = _nonempty(_read_class_list(listing, images, kind), kind, listing, _CUB)
    return _load(kind, base, split, classes, [listing], image_size, cache_dir, workers)


__all__ = ["SPLITS", "load_cub", "load_folder", "load_mini_imagenet"]

