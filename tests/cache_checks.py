"""The cache behaviour every generated data set shares (``funcgraph.data.cache.generated_split``):
a second load reads the cache file, and a damaged file is regenerated."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from funcgraph.data import ClassDataset


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
