"""The Python examples in docs/data.md run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "data.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_page_has_examples() -> None:
    assert len(BLOCKS) >= 2, f"expected python examples in {DOC}"


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_docs_example_runs(code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FUNCGRAPH_CACHE", str(tmp_path))  # never touch the user's cache
    exec(compile(code, str(DOC), "exec"), {})
