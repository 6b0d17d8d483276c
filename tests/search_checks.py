"""What the architecture-search tests share: synthetic search data, and a search stopped by
Ctrl-C after its first step, then resumed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from funcgraph import random
from funcgraph.nas import SearchConfig, SearchData
from funcgraph.runs import SearchResult, run_search
from funcgraph.runs import search as search_module


def synthetic_data(n: int, classes: int = 3, size: int = 4) -> SearchData:
    """``n`` uniform-noise ``(1, size, size)`` images in each half, labels cycling through
    ``classes``."""
    k = random.split(random.key(0), 2)
    labels = torch.arange(n) % classes
    return SearchData(random.uniform(k[0], (n, 1, size, size)), labels,
                      random.uniform(k[1], (n, 1, size, size)), labels, classes, "synthetic")


def stopped_after_step_1_then_resumed(path: Path, data: SearchData, cfg: SearchConfig,
                                      monkeypatch: pytest.MonkeyPatch) -> SearchResult:
    """``run_search(path, data, cfg)`` interrupted as by Ctrl-C when step 2 begins (the search
    loop saves step 1 and re-raises; the interrupt must reach the caller), then resumed with
    ``resume=True``: the resumed search's result."""
    real = search_module.make_search_step

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        step = real(*args, **kwargs)

        def stop_at_1(i: int, groups: Any) -> Any:
            if i == 1:
                raise KeyboardInterrupt
            return step(i, groups)

        return stop_at_1

    monkeypatch.setattr(search_module, "make_search_step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_search(path, data, cfg, show_progress=False)
    monkeypatch.setattr(search_module, "make_search_step", real)
    return run_search(path, data, cfg, resume=True, show_progress=False)
