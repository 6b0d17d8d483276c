"""The embedded texture set (patterns): determinism, disjoint splits, layout, difficulty, the
cache, ``python -m funcgraph.data`` and meta-train on it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cache_checks import assert_cache_round_trip, install_tiny_generator
from cli_helpers import run_ok

from funcgraph import random
from funcgraph.data import ClassDataset, TaskSpec, load_patterns
from funcgraph.data import patterns as patterns_module
from funcgraph.data.__main__ import main
from funcgraph.data.cache import cache_path
from funcgraph.data.patterns import (
    FAMILIES,
    GENERATOR_VERSION,
    IMAGES_PER_CLASS,
    NUM_CLASSES,
    SPLITS,
    generate_patterns,
    render_class,
)
from funcgraph.data.registry import RUN_SPLITS, dataset_type
from funcgraph.data.tasks import check_fits, nearest_neighbour_accuracy
from funcgraph.errors import ConfigError, DataError


@pytest.fixture(scope="module")
def val() -> ClassDataset:
    """The val split at 28 px from the test run's cache (generated once, about a second)."""
    return load_patterns("val")


@pytest.fixture(scope="module")
def test_split() -> ClassDataset:
    return load_patterns("test")


def test_same_seed_same_bytes_other_seed_other_pixels(val: ClassDataset) -> None:
    again = generate_patterns("val")
    assert again.images.numpy().tobytes() == val.images.numpy().tobytes(), (
        "the val split generated again must be byte for byte the one loaded")
    assert again.class_names == val.class_names, "class names must be a function of the seed"
    other = render_class(1, SPLITS["val"][0], count=4)
    assert (other - render_class(0, SPLITS["val"][0], count=4)).abs().mean() > 0.05, (
        "another seed must give another class")


def test_a_class_is_a_function_of_its_index_alone(val: ClassDataset) -> None:
    """What makes the splits independent (and disjoint): class c's pixels come from its own
    key, whichever split or subset is generated."""
    for k in (0, 57, 199):
        alone = (render_class(0, SPLITS["val"][k]) * 255).round().to(torch.uint8)
        assert torch.equal(alone, val.images[k]), f"class {k} of val rendered alone differs"


def test_splits_are_disjoint_and_every_split_fits_20_way_5_shot(
        val: ClassDataset, test_split: ClassDataset) -> None:
    assert [len(SPLITS[s]) for s in RUN_SPLITS] == [600, 200, 200], SPLITS
    used = [c for r in SPLITS.values() for c in r]
    assert sorted(used) == list(range(NUM_CLASSES)), "every class in exactly one split"
    assert not set(val.class_names) & set(test_split.class_names), "val and test share a class"
    assert dataset_type("patterns").splits == RUN_SPLITS, "the run's split names, as rgb-shapes"
    spec = TaskSpec.parse("20way5shot")  # 15 queries: 20 images a class
    for ds in (val, test_split):
        check_fits(ds, spec)
    assert IMAGES_PER_CLASS >= spec.shots + spec.queries, "the train split fits it too"
    for ds in (val, test_split):
        families = {name.split("/")[1] for name in ds.class_names}
        assert families == set(FAMILIES), f"{ds.name} lacks {set(FAMILIES) - families}"


def test_shapes_dtypes_and_range(val: ClassDataset) -> None:
    assert val.images.shape == (200, IMAGES_PER_CLASS, 1, 28, 28), val.images.shape
    assert val.images.dtype == torch.uint8 and val.counts is None, "dense uint8 split"
    assert val.name == "patterns/val" and val.class_names[0].startswith("0600/"), val
    x = render_class(0, 3, count=6, image_size=32)
    assert x.shape == (6, 1, 32, 32) and x.dtype == torch.float32, x.shape
    assert 0 <= x.min() and x.max() <= 1, "pixels in [0, 1]"
    assert ((x * 255 - (x * 255).round()).abs() < 1e-4).all(), "pixels are on the 1/255 grid"
    contrast = val.images.float().div(255).flatten(2).std(-1)  # (classes, images)
    assert contrast.min() > 0.02, f"an image with no visible pattern: std {contrast.min():.3f}"
    saturated = (val.images == 0) | (val.images == 255)
    assert saturated.float().mean() < 0.1, "most pixels must stay inside the grey range"


def test_images_of_a_class_are_closer_but_not_trivially_close(val: ClassDataset) -> None:
    """Twenty classes: images of one class are nearer each other in pixel space than to other
    classes' images on average, and for most classes; but not by a wide margin (over the whole
    split the ratio is about 0.87 and 79% of the classes are tighter)."""
    n, m = 20, IMAGES_PER_CLASS
    x = val.images[:n].float().div(255).flatten(2)  # (classes, images, pixels)
    d = torch.cdist(x.flatten(0, 1), x.flatten(0, 1)).reshape(n, m, n, m)
    within = d.diagonal(dim1=0, dim2=2).sum((0, 1)) / (m * (m - 1))  # (classes,): no self
    pair = d.mean((1, 3))  # (classes, classes)
    between = (pair.sum(1) - pair.diagonal()) / (n - 1)
    ratio = float(within.mean() / between.mean())
    assert ratio < 0.92, f"within-class distance {ratio:.2f} of between-class: no class signal"
    assert ratio > 0.5, f"within-class distance {ratio:.2f} of between-class: too easy"
    closer = int((within < between).sum())
    assert closer >= 14, f"only {closer} of {n} classes are tighter than their distance to others"


def test_pixels_are_a_weak_cue_and_the_texture_a_strong_one(test_split: ClassDataset) -> None:
    """Pixel 1-NN on 5-way 1-shot test tasks lands well above chance and far from solved, and
    a phase-blind feature (the amplitude spectrum) beats it: the class is in the texture."""
    spec, key = TaskSpec(5, 1, 15), random.key(0)
    pixel, _ = nearest_neighbour_accuracy(key, test_split, spec, 300)
    assert 0.28 < pixel < 0.55, f"pixel 1-NN 5-way 1-shot {pixel:.3f}: not in 28-55%"
    x = test_split.images.float().div(255)
    amplitude = torch.fft.fft2(x).abs().flatten(2)  # (classes, images, frequencies)
    amplitude = amplitude / amplitude.norm(dim=-1, keepdim=True)
    spectra = ClassDataset(amplitude[:, :, None, None].contiguous(), test_split.class_names, "a")
    texture, _ = nearest_neighbour_accuracy(key, spectra, spec, 300)
    assert texture > pixel + 0.1, f"spectrum 1-NN {texture:.3f} vs pixel 1-NN {pixel:.3f}"


@pytest.fixture
def tiny_generator(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make load_patterns generate three classes of four images; records each call."""
    return install_tiny_generator(monkeypatch, patterns_module, "generate_patterns", "patterns")


def test_cache_round_trip_and_a_damaged_file_is_regenerated(
    tmp_path: Path, tiny_generator: list[str]
) -> None:
    assert_cache_round_trip(
        lambda: load_patterns("test", seed=2, cache_dir=tmp_path, image_size=16),
        cache_path(tmp_path, f"patterns-v{GENERATOR_VERSION}-seed2-16px-test"), tiny_generator)


@pytest.mark.parametrize(("kw", "match"), [
    ({"split": "evaluation"}, r"^load_patterns: unknown split 'evaluation'; expected one of "
                              r"\['train', 'val', 'test'\]$"),
    ({"seed": -1}, r"load_patterns: seed must be an int in \[0, 2\*\*64\), got -1"),
    ({"image_size": 4}, "load_patterns: image_size must be an int >= 8, got 4"),
])
def test_bad_arguments_are_config_errors(tmp_path: Path, kw: dict, match: str) -> None:
    args = {"split": "val", **kw}
    with pytest.raises(ConfigError, match=match):
        load_patterns(args.pop("split"), cache_dir=tmp_path, **args)


def test_a_class_outside_the_set_is_refused() -> None:
    with pytest.raises(DataError, match=r"^patterns: class index must be in \[0, 1000\), got "
                                        r"1000$"):
        render_class(0, NUM_CLASSES)


def test_python_m_funcgraph_data_previews_and_scores_patterns(
    tmp_path: Path, tiny_generator: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "preview.png"
    main(["--dataset", "patterns", "--cache-dir", str(tmp_path), "--preview", str(out),
          "--baseline", "4", "--tasks", "2way1shot1query"])
    assert out.is_file(), "no preview written"
    printed = capsys.readouterr().out
    assert tiny_generator == ["test"], "the held-out split is the default"
    assert "patterns/test: 3 classes x 4 images" in printed, printed
    assert "pixel 1-NN 2way1shot1query, 4 tasks:" in printed, printed


def test_meta_train_protonet_runs_on_patterns(tmp_path: Path) -> None:
    out = tmp_path / "run"
    output = run_ok("meta-train", "--dataset", "patterns", "--algo", "protonet", "--steps", "2",
                    "--episodes", "3", "--val-episodes", "2", "--validate-every", "2",
                    "--device", "cpu", "--out", str(out))
    assert "test (best checkpoint, 5way1shot" in output, output
    config = json.loads((out / "config.json").read_text())
    assert config["dataset"] == "patterns", config
    assert (config["model"]["in_channels"], config["model"]["image_size"]) == (1, 28), config
