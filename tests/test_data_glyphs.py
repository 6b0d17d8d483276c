"""The glyphs generator: determinism, split layout, image sanity, and the cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from funcgraph.data import ClassDataset, glyphs, load_glyphs
from funcgraph.data.__main__ import main
from funcgraph.data.cache import cache_path
from funcgraph.data.glyphs import (
    ALPHABET_SIZES,
    DRAWERS,
    GENERATOR_VERSION,
    SPLITS,
    render_alphabet,
)
from funcgraph.errors import ConfigError, DataError

FEW = slice(0, 3)  # three characters keep every test tiny


def test_same_seed_same_pixels_other_seed_other_pixels() -> None:
    a = render_alphabet(0, 31, characters=FEW)
    b = render_alphabet(0, 31, characters=FEW)
    c = render_alphabet(1, 31, characters=FEW)
    assert torch.equal(a, b), "generation must be a pure function of the seed"
    assert (a - c).abs().mean() > 0.02, "another seed must give other characters"


def test_subset_equals_the_same_characters_of_the_full_alphabet() -> None:
    smallest = min(range(len(ALPHABET_SIZES)), key=ALPHABET_SIZES.__getitem__)
    full = render_alphabet(0, smallest)
    assert full.shape == (ALPHABET_SIZES[smallest], DRAWERS, 1, 28, 28)
    assert torch.equal(render_alphabet(0, smallest, characters=slice(4, 7)), full[4:7]), (
        "rendering characters 4:7 alone must give those rows of the full alphabet")


def test_images_are_quantised_ink_in_unit_range_and_never_blank() -> None:
    x = render_alphabet(0, 3, characters=FEW, image_size=32)
    assert x.shape == (3, DRAWERS, 1, 32, 32) and x.dtype == torch.float32
    assert 0 <= x.min() and x.max() <= 1
    assert ((x * 255 - (x * 255).round()).abs() < 1e-4).all(), "ink is on the 1/255 grid"
    ink = x.sum(dim=(2, 3, 4))
    assert (ink > 5).all(), f"every drawing needs visible ink, got min {ink.min():.1f}"
    border = x[..., 0, :].abs().sum() + x[..., -1, :].abs().sum()
    assert border < 0.05 * x.sum(), "characters should sit inside the frame"


def test_drawings_of_a_character_are_closer_than_other_characters() -> None:
    x = torch.cat([render_alphabet(0, a, characters=slice(0, 4)) for a in (30, 40)])
    flat = x.flatten(2)  # (C, D, pixels)
    centre = flat.mean(1)  # (C, pixels)
    d = torch.cdist(flat.transpose(0, 1), centre[None].expand(DRAWERS, -1, -1))  # (D, C, C)
    own = d.diagonal(dim1=1, dim2=2)  # (D, C) distance to its own class mean
    nearest_other = (d + torch.eye(8) * 1e9).amin(-1)
    assert (own < nearest_other).float().mean() > 0.9, "within-class spread must be smaller"


def test_split_layout_matches_omniglot() -> None:
    sizes = {s: [ALPHABET_SIZES[a] for a in r] for s, r in SPLITS.items()}
    assert (len(sizes["background"]), sum(sizes["background"])) == (30, 964)
    assert (len(sizes["evaluation"]), sum(sizes["evaluation"])) == (20, 659)
    assert sum(sizes["background"]) + sum(sizes["evaluation"]) == 1623
    assert min(ALPHABET_SIZES) == 14 and max(ALPHABET_SIZES) == 55
    used = [a for r in SPLITS.values() for a in r]
    assert len(used) == len(set(used)) == len(ALPHABET_SIZES), "splits share no alphabet"


def test_bad_arguments_are_config_errors_as_for_rgb_shapes(tmp_path: Path) -> None:
    """The same refusals, in the same words, as load_rgb_shapes (tests/test_data_rgb.py)."""
    with pytest.raises(ConfigError, match=r"^load_glyphs: unknown split 'train'; expected one "
                                          r"of \['background', 'evaluation', 'validation'\]$"):
        load_glyphs("train", cache_dir=tmp_path)
    with pytest.raises(ConfigError, match="generate_glyphs: unknown split 'val'"):
        glyphs.generate_glyphs("val")
    with pytest.raises(ConfigError, match=r"load_glyphs: seed must be an int in \[0, 2\*\*64\), "
                                          "got -1"):
        load_glyphs("evaluation", seed=-1, cache_dir=tmp_path)
    with pytest.raises(ConfigError, match="load_glyphs: image_size must be an int >= 8, got 4"):
        load_glyphs("evaluation", cache_dir=tmp_path, image_size=4)
    with pytest.raises(DataError, match="alphabet must be in"):
        render_alphabet(0, len(ALPHABET_SIZES))


@pytest.fixture
def tiny_generator(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make load_glyphs generate three characters of one alphabet; records each call."""
    calls: list[str] = []

    def fake(split: str, *, seed: int = 0, image_size: int = 28) -> ClassDataset:
        calls.append(split)
        images = render_alphabet(seed, SPLITS[split][0], characters=FEW, image_size=image_size)
        return ClassDataset(images, ["a", "b", "c"], f"glyphs/{split}")

    monkeypatch.setattr(glyphs, "generate_glyphs", fake)
    return calls


def test_cache_round_trip(tmp_path: Path, tiny_generator: list[str]) -> None:
    first = load_glyphs("evaluation", seed=3, cache_dir=tmp_path)
    files = list(tmp_path.glob("*.safetensors"))
    assert [f.name for f in files] == [
        f"glyphs-v{GENERATOR_VERSION}-seed3-28px-evaluation.safetensors"
    ]
    second = load_glyphs("evaluation", seed=3, cache_dir=tmp_path)
    assert tiny_generator == ["evaluation"], "the second load must come from the cache"
    assert torch.equal(first.images, second.images), "the cached images differ from the generated"
    assert first.class_names == second.class_names, "the cached class names differ"
    assert second.name == "glyphs/evaluation"
    load_glyphs("evaluation", seed=4, cache_dir=tmp_path)
    assert tiny_generator == ["evaluation"] * 2, "another seed is another cache entry"


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage"])
def test_corrupt_cache_is_regenerated(
    tmp_path: Path, tiny_generator: list[str], damage: str
) -> None:
    good = load_glyphs("validation", cache_dir=tmp_path)
    path = cache_path(tmp_path, f"glyphs-v{GENERATOR_VERSION}-seed0-28px-validation")
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-100] ^= 0xFF  # a pixel byte: the header still parses, the hash does not match
    elif damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data = bytearray(b"not a safetensors file")
    path.write_bytes(bytes(data))
    again = load_glyphs("validation", cache_dir=tmp_path)
    assert tiny_generator == ["validation"] * 2, "a damaged cache must be regenerated"
    assert torch.equal(again.images, good.images), "regenerated images differ"
    load_glyphs("validation", cache_dir=tmp_path)
    assert len(tiny_generator) == 2, "the regenerated file must be valid again"


def test_cache_dir_defaults_to_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FUNCGRAPH_CACHE", str(tmp_path / "env"))
    assert cache_path(None, "x") == tmp_path / "env" / "x.safetensors"
    monkeypatch.delenv("FUNCGRAPH_CACHE")
    assert cache_path(None, "x") == Path.home() / ".cache" / "funcgraph" / "x.safetensors"


def test_preview_command_writes_a_png(
    tmp_path: Path, tiny_generator: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "preview.png"
    args = ["--preview", str(out), "--split", "background", "--cache-dir", str(tmp_path)]
    main([*args, "--baseline", "4", "--tasks", "2way1shot1query"])
    assert out.stat().st_size > 100 and tiny_generator == ["background"]
    printed = capsys.readouterr().out
    assert "pixel 1-NN 2way1shot1query, 4 tasks:" in printed, printed
