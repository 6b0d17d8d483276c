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
Each layout is a :class:`Layout` (how a split's classes are listed); every loader starts the
same way, in :func:`_read_split`.

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
import io
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ..checks import check_int
from ..errors import DataError
from .cache import cache_path, load_cached, save_cached
from .datasets import ClassDataset, check_split
from .images import DECODER_VERSION, IMAGE_SUFFIXES, decode_many

SPLITS = ("train", "val", "test")

Classes = dict[str, list[Path]]
"""Class name -> its image files, in order."""


@dataclass(frozen=True)
class Layout:
    """One on-disk layout and how to list a split of it.

    Attributes:
        kind: its name in messages and cache file names (``"mini-imagenet"``).
        loader: the public function that reads it, named by argument errors.
        text: the expected layout, quoted by every error about the files.
        list_split: ``(root, split, layout) -> (classes, where they are listed, the files that
            define the split)``; the defining files' bytes are part of the cache key.
    """

    kind: str
    loader: str
    text: str
    list_split: Callable[[Path, str, Layout], tuple[Classes, Path, list[Path]]]


def _read_split(layout: Layout, root: str | Path, split: str, image_size: int,
                cache_dir: Path | None, workers: int | None) -> ClassDataset:
    """The start every loader shares: check the split, the size and the root, list the
    split's classes (refusing none), then load them through the cache."""
    check_split(layout.loader, split, SPLITS)
    check_int(layout.loader, "image_size", image_size, minimum=8)
    base = Path(root).expanduser().resolve()  # one cache entry per folder, whatever the cwd
    if not base.is_dir():
        raise DataError(f"{layout.kind}: data root {base} is not a directory; expected "
                        f"{layout.text}")
    classes, where, defining = layout.list_split(base, split, layout)
    if not classes:
        raise DataError(f"{layout.kind}: {where} names no classes; expected {layout.text}")
    return _load(layout.kind, base, split, classes, defining, image_size, cache_dir, workers)


def _images_in(folder: Path) -> list[Path]:
    """The image files directly in ``folder``, sorted by name (hidden files and other types
    skipped). ``scandir`` and string sorting: listing 60,000 files stays well under a second."""
    with os.scandir(folder) as entries:
        names = sorted(e.name for e in entries if not e.name.startswith(".")
                       and os.path.splitext(e.name)[1].lower() in IMAGE_SUFFIXES and e.is_file())
    return [folder / n for n in names]


def _required(path: Path, layout: Layout, what: str, *, folder: bool) -> Path:
    if not (path.is_dir() if folder else path.is_file()):
        raise DataError(f"{layout.kind}: {what} {path} not found; expected {layout.text}")
    return path


def _images_and_split_file(base: Path, split_file: str, layout: Layout) -> tuple[Path, Path, str]:
    """``ROOT/images``, the split file ``ROOT/<split_file>`` and its text (UTF-8, line endings
    as written), each required: a DataError naming what is missing or unreadable."""
    images = _required(base / "images", layout, "image folder", folder=True)
    path = _required(base / split_file, layout, "split file", folder=False)
    try:
        with path.open(newline="", encoding="utf-8") as f:
            return images, path, f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{layout.kind}: cannot read {path}: {e}") from None


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
    return _read_split(FOLDER, root, split, image_size, cache_dir, workers)


def _class_folders(base: Path, split: str, layout: Layout) -> tuple[Classes, Path, list[Path]]:
    """The class folders of ``ROOT/<split>/``, sorted, each with its images."""
    folder = _required(base / split, layout, "split folder", folder=True)
    classes: Classes = {}
    for sub in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        images = _images_in(sub)
        if not images:
            raise DataError(f"{layout.kind}: class folder {sub} has no .png/.jpg/.jpeg files; "
                            f"expected {layout.text}")
        classes[sub.name] = images
    return classes, folder, []


def _csv_classes(base: Path, split: str, layout: Layout) -> tuple[Classes, Path, list[Path]]:
    """Label -> image files of ``ROOT/<split>.csv`` (``filename,label``), labels sorted, rows
    in file order."""
    images, table, text = _images_and_split_file(base, f"{split}.csv", layout)
    kind = layout.kind
    rows = list(csv.reader(io.StringIO(text, newline="")))
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
                            f"{images} (no folders); expected {layout.text}")
        if name in seen:
            raise DataError(f"{kind}: {table} line {line} lists {name} a second time")
        seen.add(name)
        file = images / name
        if not file.is_file():
            raise DataError(f"{kind}: {table} line {line} names {file}, which does not exist; "
                            f"expected {layout.text}")
        by_label.setdefault(label, []).append(file)
    return {label: by_label[label] for label in sorted(by_label)}, table, [table]


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
    return _read_split(MINI_IMAGENET, root, split, image_size, cache_dir, workers)


def _listed_classes(base: Path, split: str, layout: Layout) -> tuple[Classes, Path, list[Path]]:
    """Class folder -> its images, for the class names in ``ROOT/splits/<split>.txt``
    (sorted)."""
    images, listing, text = _images_and_split_file(base, f"splits/{split}.txt", layout)
    kind = layout.kind
    lines = text.splitlines()
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
                            f"{folder} is not a folder; expected {layout.text}")
        files = _images_in(folder)
        if not files:
            raise DataError(f"{kind}: class folder {folder} has no .jpg/.jpeg/.png files")
        classes[name] = files
    return {name: classes[name] for name in sorted(classes)}, listing, [listing]


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
    return _read_split(CUB, root, split, image_size, cache_dir, workers)


FOLDER = Layout("folder", "load_folder", "ROOT/{train,val,test}/CLASS/*.{png,jpg,jpeg}",
                _class_folders)
MINI_IMAGENET = Layout("mini-imagenet", "load_mini_imagenet",
                       "ROOT/images/*.jpg with ROOT/{train,val,test}.csv (header 'filename,label')",
                       _csv_classes)
CUB = Layout("cub", "load_cub",
             "ROOT/images/CLASS/*.jpg with ROOT/splits/{train,val,test}.txt (one class per line)",
             _listed_classes)


__all__ = ["SPLITS", "load_cub", "load_folder", "load_mini_imagenet"]

