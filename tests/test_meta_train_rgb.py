"""The RGB pipeline end to end through meta-train: the embedded rgb-shapes set, a folder of
images on disk, and ResNet-12."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_ok as invoke
from PIL import Image
from typer.testing import CliRunner

from funcgraph import random
from funcgraph.cli import app

TINY = ["--steps", "2", "--meta-batch", "2", "--episodes", "4", "--val-episodes", "2",
        "--validate-every", "2", "--device", "cpu"]


def write_folder(root: Path, classes: int = 6, per_class: int = 4) -> None:
    """ROOT/{train,val,test}/CLASS/*.png of class-coloured noise."""
    for split in ("train", "val", "test"):
        for c in range(classes):
            folder = root / split / f"{split}-class{c}"
            folder.mkdir(parents=True)
            for i in range(per_class):
                noise = random.uniform(random.key(c * 100 + i), (20, 24, 3)) * 60
                pixel = (noise + (40 * c % 255)).clamp(0, 255).byte().numpy()
                Image.fromarray(pixel).save(folder / f"{i}.png")


def test_meta_train_on_the_embedded_rgb_set(tmp_path: Path) -> None:
    out = tmp_path / "run"
    output = invoke("meta-train", "--dataset", "rgb-shapes", "--image-size", "16",
                    "--tasks", "5way1shot", "--out", str(out), *TINY)
    assert "test (best checkpoint, 5way1shot)" in output, output
    model = json.loads((out / "config.json").read_text())["model"]
    assert model["in_channels"] == 3 and model["image_size"] == 16, model


@pytest.mark.parametrize("algo", ["protonet", "fomaml"])
def test_meta_train_resnet12_on_a_folder_dataset(tmp_path: Path, algo: str) -> None:
    root = tmp_path / "data"
    write_folder(root)
    out = tmp_path / "run"
    output = invoke("meta-train", "--dataset", "folder", "--data-root", str(root),
                    "--image-size", "16", "--tasks", "3way1shot2query", "--model", "resnet12",
                    "--set", "widths=[4,4,8,8]", "--algo", algo, "--train-queries", "1",
                    "--out", str(out), *TINY)
    assert "test (best checkpoint, 3way1shot2query)" in output, output
    model = json.loads((out / "config.json").read_text())["model"]
    assert model["name"] == "resnet12" and model["in_channels"] == 3, model
    assert model["ways"] == (None if algo == "protonet" else 3), model


def test_a_folder_too_small_for_the_spec_is_refused_before_training(tmp_path: Path) -> None:
    root = tmp_path / "data"
    write_folder(root, classes=3)
    result = CliRunner().invoke(app, ["meta-train", "--dataset", "folder", "--data-root",
                                      str(root), "--tasks", "5way1shot", "--out",
                                      str(tmp_path / "run"), *TINY])
    assert result.exit_code == 2 and "5-way tasks need 5 classes" in result.output, (
        result.output)
    assert not (tmp_path / "run").exists(), "a refused start left a run directory"
