"""The cache behaviour every generated data set shares (``funcgraph.data.cache.generated_split``):
a second load reads the cache file, and a damaged file is regenerated; a tiny stand-in for a
set's generator keeps these checks fast."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

from funcgraph.data import ClassDataset


def install_tiny_generator(monkeypatch: pytest.MonkeyPatch, module: ModuleType,
                           generator: str, name: str) -> list[str]:
    """Replace ``module.<generator>`` (``(split, *, seed, image_size) -> ClassDataset``) by one
    that renders three classes of four images with ``module.render_class`` (the first three of
    the split's ``module.SPLITS``), named ``"<name>/<split>"``; the list returned records the
    split of each call."""
    calls: list[str] = []

    def fake(split: str, *, seed: int, image_size: int) -> ClassDataset:
        calls.append(split)
        images = torch.stack([module.render_class(seed, c, image_size=image_size, count=4)
                              for c in module.SPLITS[split][:3]])
        return ClassDataset((images * 255).round().to(torch.uint8), ["a", "b", "c"],
                            f"{name}/{split}")

    monkeypatch.setattr(module, generator, fake)
    return calls


def assert_cache_round_trip(load: Callable[[], ClassDataset], path: Path,
                            calls: list[str]) -> None:
    """``load()`` twice (the second from the cache file ``path``), then once more after
    damaging a pixel byte of ``path``; ``calls`` records each generation of split test."""
    first = load()
    assert path.is_file(), f"cache file {path.name} written"
    second = load()
    assert calls == ["test"], "the second load must come from the cache"
    assert torch.equal(first.images, second.images), "cached pixels differ from generated"
    assert second.images.dtype == torch.uint8 and second.class_names == ["a", "b", "c"], second
    data = bytearray(path.read_bytes())
    data[-50] ^= 0xFF  # a pixel byte: the header parses, the digest does not match
    path.write_bytes(bytes(data))
    again = load()
    assert calls == ["test"] * 2, "a damaged cache must be regenerated"
    assert torch.equal(again.images, first.images), "regenerated pixels differ"
