"""The Omniglot folder loader, on a tiny fixture written in the official layout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from funcgraph.data import load_omniglot
from funcgraph.errors import ConfigError, DataError

BACKGROUND = {"Alpha": 2, "Beta": 1, "Gamma": 2}  # alphabet -> characters
EVALUATION = {"Delta": 2, "Epsilon": 1}
DRAWINGS = 3


def _png(path: Path, box: tuple[int, int, int, int]) -> None:
    """A 105x105 Omniglot-style drawing: a black rectangle stroke on white, mode '1'."""
    im = Image.new("1", (105, 105), 1)
    ImageDraw.Draw(im).rectangle(box, fill=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    im.save(path)


def _write(root: Path, folder: str, alphabets: dict[str, int]) -> None:
    for a, (alphabet, chars) in enumerate(alphabets.items()):
        for c in range(chars):
            for d in range(DRAWINGS):
                left = 10 + 20 * c + 3 * d + a
                box = (left, 20, left + 12, 80)
                _png(root / folder / alphabet / f"character{c + 1:02d}" / f"{c}_{d:02d}.png", box)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    _write(tmp_path, "images_background", BACKGROUND)
    _write(tmp_path, "images_evaluation", EVALUATION)
    return tmp_path


def test_splits_shapes_and_names(root: Path) -> None:
    bg = load_omniglot(root, "background")
    val = load_omniglot(root, "validation")
    ev = load_omniglot(root, "evaluation")
    assert bg.images.shape == (3, DRAWINGS, 1, 28, 28) and bg.images.dtype == torch.float32
    assert bg.class_names == ["Alpha/character01", "Alpha/character02", "Beta/character01"]
    assert val.class_names == ["Gamma/character01", "Gamma/character02"], "last sixth, >= 1"
    assert ev.class_names == ["Delta/character01", "Delta/character02", "Epsilon/character01"]
    assert not set(bg.class_names) & set(val.class_names), "validation is cut from background"
    assert bg.name == "omniglot/background"


def test_pixels_are_inverted_and_box_resized(root: Path) -> None:
    ds = load_omniglot(root, "evaluation", image_size=21)
    png = root / "images_evaluation" / "Delta" / "character02" / "1_01.png"
    with Image.open(png) as im:
        gray = np.asarray(im.convert("L"), dtype=np.float64)
    # BOX resampling 105 -> 21 is an exact 5x5 block mean.
    expected = (255 - gray).reshape(21, 5, 21, 5).mean(axis=(1, 3)) / 255
    got = ds.images[1, 1, 0].double().numpy()
    assert np.abs(got - expected).max() < 1.5 / 255, "ink = 1 - paper, area-averaged"
    assert ds.images.min() == 0 and ds.images.max() == 1, "white paper 0, solid stroke 1"


def test_missing_root_names_the_path_and_layout(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(DataError, match=r"nowhere is not a directory.*images_background/ALPHABET"):
        load_omniglot(missing, "background")


def test_missing_split_folder(tmp_path: Path) -> None:
    _write(tmp_path, "images_background", BACKGROUND)
    with pytest.raises(DataError, match=r"images_evaluation not found; expected ROOT/"):
        load_omniglot(tmp_path, "evaluation")


def test_unknown_split_is_a_config_error(root: Path) -> None:
    with pytest.raises(ConfigError, match=r"load_omniglot: unknown split 'test'; expected one "
                                          r"of \['background', 'validation', 'evaluation'\]"):
        load_omniglot(root, "test")


def test_character_without_pngs(root: Path) -> None:
    (root / "images_evaluation" / "Epsilon" / "character02").mkdir()
    with pytest.raises(DataError, match=r"character02 has no \.png files"):
        load_omniglot(root, "evaluation")


def test_uneven_drawing_counts(root: Path) -> None:
    (root / "images_evaluation" / "Epsilon" / "character01" / "0_00.png").unlink()
    with pytest.raises(DataError, match="has 2 drawings, earlier characters have 3"):
        load_omniglot(root, "evaluation")


def test_unreadable_png(root: Path) -> None:
    (root / "images_evaluation" / "Delta" / "character01" / "0_00.png").write_bytes(b"junk")
    with pytest.raises(DataError, match=r"cannot read image .*0_00\.png"):
        load_omniglot(root, "evaluation")


def test_background_needs_two_alphabets_for_validation(tmp_path: Path) -> None:
    _write(tmp_path, "images_background", {"Only": 1})
    with pytest.raises(DataError, match="need at least 2"):
        load_omniglot(tmp_path, "validation")
