"""The disk loaders (folder, mini-ImageNet, CUB), the image decoder and the decoded cache, on
tiny fixtures written by the tests."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from funcgraph import random
from funcgraph.data import (
    ClassDataset,
    TaskSpec,
    as_float,
    load_cub,
    load_folder,
    load_mini_imagenet,
    rotate_classes,
    sample_tasks,
)
from funcgraph.data import folders as folders_module
from funcgraph.data.tasks import check_fits
from funcgraph.errors import ConfigError, DataError, ShapeError, TaskSpecError

SIZE = 8


def solid(path: Path, rgb: tuple[int, int, int], *, size: tuple[int, int] = (12, 12),
          mode: str = "RGB") -> Path:
    """A one-colour image of ``size`` (width, height) saved at ``path`` in PIL ``mode``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    im = Image.new("RGB", size, rgb)
    if mode == "P":
        im = im.convert("P", palette=Image.Palette.ADAPTIVE)
        im.info["transparency"] = 0
    elif mode != "RGB":
        im = im.convert(mode)
    im.save(path)
    return path


def coded_folder(root: Path, counts: dict[str, list[int]]) -> Path:
    """``root/SPLIT/cK/iJ.png`` for ``counts = {split: [images of class 0, ...]}``: image
    ``j`` of class ``k`` is the lossless colour ``(20 k, 20 j, 0)``, so pixels name it."""
    for split, sizes in counts.items():
        for k, n in enumerate(sizes):
            for j in range(n):
                solid(root / split / f"c{k}" / f"i{j}.png", (20 * k, 20 * j, 0))
    return root


def ids(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(class, image) of float images ``(..., 3, H, W)`` written by :func:`coded_folder`."""
    pixel = (x[..., :, 0, 0] * 255).round().long()
    return pixel[..., 0] // 20, pixel[..., 1] // 20


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


# --- folder -----------------------------------------------------------------------------------


def test_folder_layout_shapes_names_and_counts(tmp_path: Path, cache: Path) -> None:
    root = coded_folder(tmp_path / "data", {"train": [3, 5, 4], "val": [2, 2]})
    ds = load_folder(root, "train", image_size=SIZE, cache_dir=cache)
    assert ds.images.shape == (3, 5, 3, SIZE, SIZE), f"padded to the largest class: {ds}"
    assert ds.images.dtype == torch.uint8, "folder datasets hold bytes"
    assert ds.class_names == ["c0", "c1", "c2"] and ds.name == "folder/train", ds
    assert ds.counts is not None and ds.counts.tolist() == [3, 5, 4], "per-class image counts"
    assert ds.per_class == 3, "per_class is the smallest class"
    cls, img = ids(ds.images.float() / 255)
    assert (cls == torch.arange(3)[:, None]).all(), "every row holds its own class"
    assert img[0].tolist() == [0, 1, 2, 0, 1], "a short class repeats its own images"
    val = load_folder(root, "val", image_size=SIZE, cache_dir=cache)
    assert val.counts is None and val.images.shape[:2] == (2, 2), "equal classes: no counts"


def test_modes_and_sizes_are_converted_to_rgb(tmp_path: Path, cache: Path) -> None:
    c = tmp_path / "data" / "train" / "mixed"
    solid(c / "gray.png", (90, 90, 90), mode="L")
    solid(c / "palette.png", (200, 10, 10), mode="P", size=(30, 20))
    solid(c / "rgba.png", (10, 200, 10), mode="RGBA", size=(7, 9))
    solid(c / "cmyk.jpg", (10, 10, 200), mode="CMYK", size=(40, 40))
    solid(c / "UPPER.JPEG", (120, 60, 30), size=(50, 16))
    (c / "notes.txt").write_text("not an image")
    ds = load_folder(tmp_path / "data", "train", image_size=SIZE, cache_dir=cache)
    assert ds.images.shape == (1, 5, 3, SIZE, SIZE), f"five images, the .txt skipped: {ds}"
    centre = ds.images[0, :, :, SIZE // 2, SIZE // 2].int()  # (5, 3), files in sorted order
    want = {"UPPER.JPEG": (120, 60, 30), "cmyk.jpg": (10, 10, 200), "gray.png": (90, 90, 90),
            "palette.png": (200, 10, 10), "rgba.png": (10, 200, 10)}
    for row, (name, rgb) in zip(centre, sorted(want.items()), strict=True):
        assert (row - torch.tensor(rgb)).abs().max() <= 12, (
            f"{name}: centre pixel {row.tolist()}, expected about {rgb}")


def test_centre_crop_keeps_the_middle_of_a_wide_image(tmp_path: Path, cache: Path) -> None:
    wide = np.zeros((30, 90, 3), dtype=np.uint8)
    wide[:, :30, 0] = 255  # red | green | blue thirds
    wide[:, 30:60, 1] = 255
    wide[:, 60:, 2] = 255
    path = tmp_path / "data" / "train" / "c" / "wide.png"
    path.parent.mkdir(parents=True)
    Image.fromarray(wide).save(path)
    ds = load_folder(tmp_path / "data", "train", image_size=SIZE, cache_dir=cache)
    mean = ds.images[0, 0].float().mean(dim=(1, 2))
    # (a stretched image would average 85 in every channel; the bilinear filter reads a
    # little past the crop's edges, hence not exactly 255 / 0)
    assert mean[1] > 240 and mean[0] < 10 and mean[2] < 10, f"the centre square is green: {mean}"


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_an_unreadable_image_is_a_data_error_naming_it(
    tmp_path: Path, cache: Path, damage: str
) -> None:
    root = coded_folder(tmp_path / "data", {"train": [2, 2]})
    good = root / "train" / "c1" / "i1.png"
    bad = root / "train" / "c1" / "photo.jpg"
    solid(bad, (1, 2, 3), size=(64, 64))
    data = bad.read_bytes()
    bad.write_bytes({"garbage": b"this is no jpeg" * 10, "truncated": data[: len(data) // 3],
                     "empty": b""}[damage])
    assert good.exists(), "fixture"
    with pytest.raises(DataError, match=r"cannot read image .*photo\.jpg"):
        load_folder(root, "train", image_size=SIZE, cache_dir=cache, workers=2)


@pytest.mark.parametrize(("make", "match"), [
    (lambda r: r, "split folder .*train not found"),
    (lambda r: (r / "train").mkdir(parents=True), "names no classes"),
    (lambda r: (r / "train" / "empty").mkdir(parents=True), "has no .png/.jpg/.jpeg files"),
])
def test_missing_or_empty_layout_is_a_data_error(
    tmp_path: Path, cache: Path, make: Callable[[Path], object], match: str
) -> None:
    root = tmp_path / "data"
    root.mkdir()
    make(root)
    with pytest.raises(DataError, match=match):
        load_folder(root, "train", image_size=SIZE, cache_dir=cache)


@pytest.mark.parametrize("load", [load_folder, load_mini_imagenet, load_cub])
def test_every_loader_refuses_a_split_alike(tmp_path: Path, cache: Path,
                                            load: Callable[..., Any]) -> None:
    """One start for the three layouts: the same refusal, naming the loader."""
    with pytest.raises(ConfigError, match=rf"^{load.__name__}: unknown split 'background'; "
                                          r"expected one of \['train', 'val', 'test'\]$"):
        load(tmp_path, "background", cache_dir=cache)


def test_bad_arguments_are_config_or_data_errors(tmp_path: Path, cache: Path) -> None:
    with pytest.raises(ConfigError, match="unknown split 'background'"):
        load_folder(tmp_path, "background", cache_dir=cache)
    with pytest.raises(ConfigError, match="image_size must be an int >= 8, got 4"):
        load_folder(tmp_path, "train", image_size=4, cache_dir=cache)
    with pytest.raises(DataError, match="is not a directory"):
        load_folder(tmp_path / "nowhere", "train", cache_dir=cache)


# --- the decoded cache ---------------------------------------------------------------------


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the number of files each real decode pass reads."""
    calls: list[int] = []
    real = folders_module.decode_many

    def counting(paths: list[Path], *args: Any, **kw: Any) -> np.ndarray:
        calls.append(len(paths))
        return real(paths, *args, **kw)

    monkeypatch.setattr(folders_module, "decode_many", counting)
    return calls


def test_second_load_comes_from_the_cache(tmp_path: Path, cache: Path, decodes: list[int]) -> None:
    root = coded_folder(tmp_path / "data", {"train": [2, 3]})
    first = load_folder(root, "train", image_size=SIZE, cache_dir=cache)
    files = list(cache.glob("*.safetensors"))
    assert len(files) == 1 and files[0].name.startswith(f"folder-train-{SIZE}px-"), files
    second = load_folder(root, "train", image_size=SIZE, cache_dir=cache)
    assert decodes == [5], "the second load must not decode"
    assert torch.equal(first.images, second.images), "cached pixels differ from decoded"
    assert second.counts is not None and torch.equal(second.counts, first.counts), "counts"
    assert second.class_names == first.class_names, "class names"
    load_folder(root, "train", image_size=SIZE + 4, cache_dir=cache)
    assert decodes == [5, 5], "another image size is another cache entry"


@pytest.mark.parametrize("change", ["add", "remove", "touch", "rewrite"])
def test_a_changed_folder_invalidates_the_cache(
    tmp_path: Path, cache: Path, decodes: list[int], change: str
) -> None:
    root = coded_folder(tmp_path / "data", {"train": [2, 2]})
    load_folder(root, "train", image_size=SIZE, cache_dir=cache)
    target = root / "train" / "c0" / "i0.png"
    if change == "add":
        solid(root / "train" / "c0" / "new.png", (5, 5, 5))
    elif change == "remove":
        (root / "train" / "c1" / "i1.png").unlink()
    elif change == "touch":
        st = target.stat()
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    else:
        solid(target, (255, 255, 255), size=(40, 40))
    again = load_folder(root, "train", image_size=SIZE, cache_dir=cache)
    assert len(decodes) == 2, f"a {change} must trigger a new decode"
    assert len(list(cache.glob("*.safetensors"))) == 1, "the same cache file is rewritten"
    load_folder(root, "train", image_size=SIZE, cache_dir=cache)
    assert len(decodes) == 2, "the rewritten cache is used afterwards"
    if change == "rewrite":
        assert int(again.images[0, 0, 0, 0, 0]) == 255, "the new pixels are decoded"


def test_cache_defaults_to_the_environment_and_a_damaged_file_is_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decodes: list[int]
) -> None:
    monkeypatch.setenv("FUNCGRAPH_CACHE", str(tmp_path / "env"))
    root = coded_folder(tmp_path / "data", {"test": [2, 2]})
    good = load_folder(root, "test", image_size=SIZE)
    (path,) = (tmp_path / "env").glob("folder-test-*.safetensors")
    path.write_bytes(path.read_bytes()[:100])
    again = load_folder(root, "test", image_size=SIZE)
    assert decodes == [4, 4], "a truncated cache file must be decoded again"
    assert torch.equal(good.images, again.images), "rebuilt pixels differ"


def test_parallel_decode_equals_serial(tmp_path: Path) -> None:
    root = tmp_path / "data"
    for i in range(6):
        solid(root / "train" / "c" / f"{i}.jpg", (40 * i, 255 - 30 * i, 7 * i), size=(20 + i, 17))
    one = load_folder(root, "train", image_size=SIZE, cache_dir=tmp_path / "a", workers=1)
    four = load_folder(root, "train", image_size=SIZE, cache_dir=tmp_path / "b", workers=4)
    assert torch.equal(one.images, four.images), "thread count must not change pixels"


# --- tasks on uneven classes ---------------------------------------------------------------


def test_tasks_on_uneven_classes_never_reuse_an_image(tmp_path: Path, cache: Path) -> None:
    root = coded_folder(tmp_path / "data", {"train": [3, 9, 4, 6, 3]})
    ds = load_folder(root, "train", image_size=SIZE, cache_dir=cache)
    spec = TaskSpec(4, 1, 2)
    b = sample_tasks(random.key(0), ds, spec, 200)
    assert b.support_x.dtype == torch.float32 and float(b.support_x.max()) <= 1, "float images"
    s_cls, s_img = ids(b.support_x)
    q_cls, q_img = ids(b.query_x)
    counts = ds.counts
    assert counts is not None, "fixture is uneven"
    seen: set[int] = set()  # the images drawn of the big class c1
    for t in range(200):
        for label in range(4):
            cls = int(b.classes[t, label])
            picked = s_img[t][b.support_y[t] == label].tolist()
            picked += q_img[t][b.query_y[t] == label].tolist()
            assert (s_cls[t][b.support_y[t] == label] == cls).all(), "label -> its class"
            assert (q_cls[t][b.query_y[t] == label] == cls).all(), "label -> its class"
            assert len(set(picked)) == 3, f"task {t}: an image reused in {picked}"
            assert max(picked) < int(counts[cls]), "only the class's own distinct images"
            seen.update(picked if cls == 1 else [])
    assert seen == set(range(9)), f"the big class's images are all drawn: {seen}"
    rotated = rotate_classes(ds)
    assert rotated.counts is not None and rotated.counts.tolist() == counts.tolist() * 4, (
        "rotations keep each class's count")


def test_check_fits_names_the_smallest_class(tmp_path: Path, cache: Path) -> None:
    root = coded_folder(tmp_path / "data", {"train": [5, 2, 5]})
    ds = load_folder(root, "train", image_size=SIZE, cache_dir=cache)
    with pytest.raises(TaskSpecError, match=r"need 4 examples per class, class 'c1' .* only 2"):
        check_fits(ds, TaskSpec(2, 1, 3))
    with pytest.raises(TaskSpecError, match="need 4 classes"):
        check_fits(ds, TaskSpec(4, 1, 1))
    check_fits(ds, TaskSpec(3, 1, 1))  # two images in every class: fits


# --- mini-ImageNet ---------------------------------------------------------------------------


def mini_imagenet(root: Path, rows: dict[str, list[tuple[str, str]]]) -> Path:
    """``root/images/*.jpg`` and ``root/SPLIT.csv`` from ``{split: [(filename, label)]}``."""
    for split, entries in rows.items():
        lines = ["filename,label"]
        for k, (name, label) in enumerate(entries):
            solid(root / "images" / name, (10 * k, 100, 200), size=(84, 84))
            lines.append(f"{name},{label}")
        (root / f"{split}.csv").write_text("\n".join(lines) + "\n")
    return root


def test_mini_imagenet_reads_the_csv(tmp_path: Path, cache: Path) -> None:
    root = mini_imagenet(tmp_path / "mini", {"train": [
        ("n02_1.jpg", "n02"), ("n01_1.jpg", "n01"), ("n02_2.jpg", "n02"), ("n01_2.jpg", "n01")]})
    ds = load_mini_imagenet(root, "train", image_size=SIZE, cache_dir=cache)
    assert ds.class_names == ["n01", "n02"], "labels sorted"
    assert ds.images.shape == (2, 2, 3, SIZE, SIZE) and ds.counts is None, ds
    red = ds.images[:, :, 0, 4, 4].int()
    assert (red - torch.tensor([[10, 30], [0, 20]])).abs().max() <= 6, (
        f"rows follow the csv order within a class: {red.tolist()}")
    assert ds.name == "mini-imagenet/train"


@pytest.mark.parametrize(("edit", "match"), [
    ("missing file", r"line 3 names .*ghost\.jpg, which does not exist"),
    ("header", "line 1 must be the header 'filename,label'"),
    ("duplicate", "line 3 lists a.jpg a second time"),
    ("short row", "line 3: expected 'filename,label'"),
    ("path", "line 3: '../b.jpg' is not a file name"),
    ("no csv", r"split file .*val\.csv not found"),
])
def test_mini_imagenet_layout_errors(tmp_path: Path, cache: Path, edit: str, match: str) -> None:
    root = mini_imagenet(tmp_path / "mini", {"train": [("a.jpg", "x"), ("b.jpg", "y")]})
    table = root / "train.csv"
    text = table.read_text()
    split = "train"
    if edit == "missing file":
        table.write_text(text.replace("b.jpg", "ghost.jpg"))
    elif edit == "header":
        table.write_text(text.replace("filename,label", "file,class"))
    elif edit == "duplicate":
        table.write_text(text.replace("b.jpg", "a.jpg"))
    elif edit == "short row":
        table.write_text(text.replace("b.jpg,y", "b.jpg"))
    elif edit == "path":
        table.write_text(text.replace("b.jpg", "../b.jpg"))
    else:
        split = "val"
    with pytest.raises(DataError, match=match):
        load_mini_imagenet(root, split, image_size=SIZE, cache_dir=cache)


def test_an_edited_csv_invalidates_the_cache(tmp_path: Path, cache: Path) -> None:
    root = mini_imagenet(tmp_path / "mini", {"test": [("a.jpg", "x"), ("b.jpg", "y")]})
    first = load_mini_imagenet(root, "test", image_size=SIZE, cache_dir=cache)
    table = root / "test.csv"
    table.write_text(table.read_text().replace("b.jpg,y", "b.jpg,x"))
    again = load_mini_imagenet(root, "test", image_size=SIZE, cache_dir=cache)
    assert first.class_names == ["x", "y"] and again.class_names == ["x"], "relabelled"


# --- CUB -------------------------------------------------------------------------------------


def cub(root: Path, classes: dict[str, int], splits: dict[str, str]) -> Path:
    """``root/images/CLASS/*.jpg`` and ``root/splits/SPLIT.txt`` (given text)."""
    for k, (name, n) in enumerate(classes.items()):
        for j in range(n):
            solid(root / "images" / name / f"{name}_{j}.jpg", (30 * k, 10 * j, 60),
                  size=(50 + j, 40))
    (root / "splits").mkdir(parents=True)
    for split, text in splits.items():
        (root / "splits" / f"{split}.txt").write_text(text)
    return root


def test_cub_reads_the_split_files(tmp_path: Path, cache: Path) -> None:
    root = cub(tmp_path / "CUB_200_2011", {"002.Laysan": 3, "001.Albatross": 2, "003.Sooty": 2},
               {"train": "# base classes\n002.Laysan\n\n001.Albatross\n", "test": "003.Sooty\n"})
    ds = load_cub(root, "train", image_size=SIZE, cache_dir=cache)
    assert ds.class_names == ["001.Albatross", "002.Laysan"], "comments and blanks skipped"
    assert ds.counts is not None and ds.counts.tolist() == [2, 3], "uneven CUB classes"
    assert ds.name == "cub/train"
    assert load_cub(root, "test", image_size=SIZE, cache_dir=cache).num_classes == 1


@pytest.mark.parametrize(("text", "split", "match"), [
    ("001.Albatross\n404.Dodo\n", "train", r"line 2 names class '404.Dodo'"),
    ("001.Albatross\n001.Albatross\n", "train", "line 2 lists class '001.Albatross' again"),
    ("# nothing\n", "train", "names no classes"),
    ("001.Albatross\n", "val", r"split file .*val\.txt not found"),
])
def test_cub_layout_errors(tmp_path: Path, cache: Path, text: str, split: str,
                           match: str) -> None:
    root = cub(tmp_path / "cub", {"001.Albatross": 2}, {"train": text})
    with pytest.raises(DataError, match=match):
        load_cub(root, split, image_size=SIZE, cache_dir=cache)


def test_the_record_checks_counts_and_accepts_bytes() -> None:
    pixels = torch.zeros(2, 3, 3, 4, 4, dtype=torch.uint8)
    ds = ClassDataset(pixels, ["a", "b"], "bytes", torch.tensor([3, 2]))
    assert ds.per_class == 2 and ds.image_shape == (3, 4, 4), ds
    assert as_float(pixels + 255).max() == 1.0 and as_float(pixels).dtype == torch.float32, (
        "uint8 -> float32 in [0, 1]")
    for bad in (torch.tensor([3, 4]), torch.tensor([0, 1]), torch.tensor([3.0, 2.0]),
                torch.tensor([3])):
        with pytest.raises(ShapeError, match="counts must be int64"):
            ClassDataset(pixels, ["a", "b"], "bad", bad)
    with pytest.raises(ShapeError, match=r"\(num_classes, per_class, 3, H, W\) \(RGB\)"):
        ClassDataset(torch.zeros(2, 3, 2, 4, 4), ["a", "b"], "two channels")
