"""Executable docs: every ```python block in README.md and docs/*.md runs here.

The rule (also in docs/testing.md):

- A fence whose info string is exactly ``python`` is executed. The blocks of one file run in
  order in one shared namespace, so a page can build an example up block by block.
- ``python no-run`` marks a block that is shown but not executed (a sketch, or code that
  needs data or hardware a test run does not have). Use it sparingly, and say why nearby.
- Any other language tag (``bash``, ``text``, ``console``, ``toml``) is never executed.
- Other spellings of Python (``py``, ``python3``, ``pycon``) are rejected, so no block is
  skipped by accident.

Blocks run with the working directory set to a temporary directory, so a snippet that writes
files leaves nothing in the repository.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^`\s]*)\s*(.*)$")


def code_blocks(text: str) -> list[tuple[int, str, str]]:
    """``(line of the opening fence, info string, code)`` for every fenced block of ``text``."""
    blocks = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        indent, fence, lang, rest = m.groups()
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            line = lines[i]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            i += 1
        blocks.append((start, f"{lang} {rest}".strip(), "\n".join(body) + "\n"))
        i += 1
    return blocks


def runnable(info: str) -> bool:
    return info == "python"


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_python_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    for line, info, code in code_blocks(page.read_text()):
        if not runnable(info):
            continue
        name = f"{page.relative_to(ROOT)}:{line}"
        try:
            exec(compile(code, name, "exec"), namespace)
        except Exception as e:
            raise AssertionError(f"{name}: the python block starting here failed: "
                                 f"{type(e).__name__}: {e}") from e


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_no_python_block_is_skipped_by_its_spelling(page: Path) -> None:
    odd = [
        f"{page.name}:{line} ```{info}"
        for line, info, _ in code_blocks(page.read_text())
        if info.split(" ")[0] in ("py", "python3", "pycon", "Python")
        or (info.startswith("python") and info not in ("python", "python no-run"))
    ]
    assert not odd, f"use ```python (runs) or ```python no-run (shown only): {odd}"


def test_the_collector_finds_and_classifies_blocks() -> None:
    text = "x\n```python\na = 1\n```\n```python no-run\nb\n```\n  ```bash\n  ls\n  ```\n"
    assert code_blocks(text) == [(2, "python", "a = 1\n"), (5, "python no-run", "b\n"),
                                 (8, "bash", "ls\n")]
    assert [runnable(info) for _, info, _ in code_blocks(text)] == [True, False, False]


def test_every_page_in_the_mkdocs_nav_exists() -> None:
    nav = re.findall(r"^\s*-\s[^:]+:\s*(\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert "index.md" in nav
    missing = [page for page in nav if not (ROOT / "docs" / page).is_file()]
    assert not missing, f"mkdocs.yml names pages that do not exist: {missing}"


def test_cli_reference_is_current() -> None:
    from funcgraph.cli import app
    from funcgraph.commands.docgen import render

    current = (ROOT / "docs" / "cli.md").read_text()
    assert current == render(app), (
        "docs/cli.md is stale: regenerate it with `python -m funcgraph.commands.docgen`"
    )
