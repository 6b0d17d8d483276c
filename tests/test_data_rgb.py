"""The embedded RGB set (rgb-shapes): determinism, layout, difficulty, the cache and the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cache_checks import assert_cache_round_trip, install_tiny_generator
from PIL import Image

from funcgraph import random
from funcgraph.data import TaskSpec, load_rgb_shapes, sample_tasks
from funcgraph.data import rgb_shapes as rgb_module
from funcgraph.data.__main__ import main
from funcgraph.data.cache import cache_path
from funcgraph.data.rgb_shapes import (
    GENERATOR_VERSION,
    IMAGES_PER_CLASS,
    SPLITS,
    generate_rgb_shapes,
    render_class,
)
from funcgraph.data.tasks import nearest_neighbour_accuracy
from funcgraph.errors import ConfigError

SIZE = 16  # small images keep the tests quick; the 84-pixel figures are in docs/data.md


def test_same_seed_same_pixels_other_seed_other_pixels() -> None:
    a = render_class(0, 70, image_size=SIZE, count=4)
    assert torch.equal(a, render_class(0, 70, image_size=SIZE, count=4)), "a pure function"
    assert (a - render_class(1, 70, image_size=SIZE, count=4)).abs().mean() > 0.05, (
        "another seed must give another class")
    assert a.shape == (4, 3, SIZE, SIZE) and a.dtype == torch.float32, a.shape
    assert 0 <= a.min() and a.max() <= 1, "pixels in [0, 1]"
    assert ((a * 255 - (a * 255).round()).abs() < 1e-4).all(), "pixels are on the 1/255 grid"


def test_split_layout_is_mini_imagenets_and_disjoint() -> None:
    assert [len(SPLITS[s]) for s in ("train", "val", "test")] == [64, 16, 20], SPLITS
    used = [c for r in SPLITS.values() for c in r]
    assert sorted(used) == list(range(100)), "every class in exactly one split"
    ds = generate_rgb_shapes("val", image_size=SIZE)
    assert ds.images.shape == (16, IMAGES_PER_CLASS, 3, SIZE, SIZE), ds.images.shape
    assert ds.images.dtype == torch.uint8 and ds.counts is None, "dense uint8 split"
    assert ds.class_names[0] == "shape064" and ds.name == "rgb-shapes/val", ds


def test_images_of_a_class_are_closer_to_it_than_to_other_classes() -> None:
    ds = generate_rgb_shapes("val", image_size=SIZE)
    x = ds.images.float().div(255).flatten(2)  # (classes, images, pixels)
    d = torch.cdist(x.transpose(0, 1), x.mean(1)[None].expand(x.shape[1], -1, -1))
    own = d.diagonal(dim1=1, dim2=2)  # (images, classes): distance to its own class mean
    nearest_other = (d + torch.eye(16) * 1e9).amin(-1)
    share = (own < nearest_other).float().mean()
    assert share > 0.4, f"class means should classify far above chance (1/16), got {share:.2f}"


def test_pixel_nearest_neighbour_lands_in_the_target_band() -> None:
    ds = generate_rgb_shapes("test", image_size=SIZE)
    mean, ci = nearest_neighbour_accuracy(random.key(0), ds, TaskSpec(5, 1, 15), 200)
    assert 0.35 < mean < 0.60, f"pixel 1-NN 5-way 1-shot {mean:.3f} +- {ci:.3f}: not in 35-60%"


def test_tasks_are_float_rgb() -> None:
    ds = generate_rgb_shapes("test", image_size=SIZE)
    b = sample_tasks(random.key(0), ds, TaskSpec(5, 1, 15), 3)
    assert b.support_x.shape == (3, 5, 3, SIZE, SIZE) and b.support_x.dtype == torch.float32
    assert b.query_x.max() <= 1 and b.query_x.min() >= 0, "float images in [0, 1]"


@pytest.fixture
def tiny_generator(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make load_rgb_shapes generate three classes of four images; records each call."""
    return install_tiny_generator(monkeypatch, rgb_module, "generate_rgb_shapes", "rgb-shapes")


def test_cache_round_trip_and_a_damaged_file_is_regenerated(
    tmp_path: Path, tiny_generator: list[str]
) -> None:
    assert_cache_round_trip(
        lambda: load_rgb_shapes("test", seed=2, cache_dir=tmp_path, image_size=SIZE),
        cache_path(tmp_path, f"rgb-shapes-v{GENERATOR_VERSION}-seed2-{SIZE}px-test"),
        tiny_generator)


@pytest.mark.parametrize(("kw", "match"), [
    ({"split": "background"}, "unknown split 'background'"),
    ({"seed": -1}, "seed must be an int in"),
    ({"image_size": 4}, "image_size must be an int >= 8, got 4"),
])
def test_bad_arguments_are_config_errors(tmp_path: Path, kw: dict, match: str) -> None:
    args = {"split": "val", **kw}
    with pytest.raises(ConfigError, match=match):
        load_rgb_shapes(args.pop("split"), cache_dir=tmp_path, **args)


def test_cli_previews_and_scores_rgb_shapes(
    tmp_path: Path, tiny_generator: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "preview.png"
    main(["--dataset", "rgb-shapes", "--split", "val", "--cache-dir", str(tmp_path),
          "--preview", str(out), "--baseline", "4", "--tasks", "2way1shot1query"])
    with Image.open(out) as im:
        assert im.mode == "RGB" and im.width > 4 * 84, f"an RGB grid: {im.mode} {im.size}"
    printed = capsys.readouterr().out
    assert "rgb-shapes/val: 3 classes x 4 images" in printed, printed
    assert "pixel 1-NN 2way1shot1query, 4 tasks:" in printed, printed
    with pytest.raises(SystemExit):
        main(["--dataset", "rgb-shapes", "--split", "evaluation", "--cache-dir", str(tmp_path)])
