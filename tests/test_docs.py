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
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("**/*.md")])
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
            # dont_inherit: the block runs as its own script, without this file's __future__
            exec(compile(code, name, "exec", dont_inherit=True), namespace)
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
        "docs/cli.md is stale: regenerate it with `funcgraph docs`"
    )


# --- commands and scripts the docs name ----------------------------------------------------

SCRIPT = re.compile(r"(?<![\w/.-])((?:benchmarks|examples)/[\w./-]+?\.(?:py|sh))\b")
COMMAND = re.compile(
    r"(?<![\w.])(?<!from )(?<!import )funcgraph\s+([a-z][\w-]*)(?![\w.])(?:\s+([a-z][\w-]*))?")
SHELL_FENCES = ("bash", "sh", "console", "shell")
# An inline code span: a run of backticks, then text up to a run of the same length, within
# one paragraph (as CommonMark pairs them; ```` ```python ```` is one span).
INLINE_CODE = re.compile(r"(?<!`)(`+)(?!`)((?:(?!\n[ \t]*\n).)+?)(?<!`)\1(?!`)", re.S)


def command_texts(text: str) -> list[tuple[int, str]]:
    """``(line, text)`` of what the page writes as code: each line of a shell fence, and every
    inline code span outside fences (whitespace, line breaks included, collapsed)."""
    out: list[tuple[int, str]] = []
    for line, info, code in code_blocks(text):
        if info.split(" ")[0] in SHELL_FENCES:
            out += [(line + 1 + i, row) for i, row in enumerate(code.splitlines())]
    prose, fence = [], ""
    for row in text.splitlines():
        m = FENCE.match(row)
        if not fence and m:
            fence = m.group(2)
        elif fence and row.strip().startswith(fence):
            fence = ""
        else:
            prose.append("" if fence else row)
            continue
        prose.append("")
    body = "\n".join(prose)
    for m in INLINE_CODE.finditer(body):
        out.append((body.count("\n", 0, m.start()) + 1, " ".join(m[2].split())))
    return out


def registered_commands() -> dict[str, set[str]]:
    """Top-level command -> its subcommands (empty for a plain command)."""
    import typer.main

    from funcgraph.cli import app

    group = typer.main.get_command(app)
    return {name: set(getattr(cmd, "commands", {})) for name, cmd in group.commands.items()}


def test_the_command_scanner_finds_commands_and_skips_python() -> None:
    text = ("Run `funcgraph train --steps 2` or `OMP_NUM_THREADS=1 funcgraph model list`;\n"
            "`from funcgraph import nn` and the `funcgraph func.grad` column are no commands,\n"
            "nor is funcgraph declares in prose after a ```` ```python ```` span.\n"
            "```bash\npython -m funcgraph meta-train --nproc 2\n```\n"
            "```python\nfuncgraph.nn.relu()\n```\n")
    found = [m.groups() for _, t in command_texts(text) for m in COMMAND.finditer(t)]
    assert sorted(found, key=str) == [("meta-train", None), ("model", "list"),
                                      ("train", None)], found
    assert SCRIPT.findall("`python benchmarks/x.py --a` and examples/y.py.") == [
        "benchmarks/x.py", "examples/y.py"]


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_scripts_the_docs_name_exist(page: Path) -> None:
    missing = sorted({s for s in SCRIPT.findall(page.read_text()) if not (ROOT / s).is_file()})
    assert not missing, f"{page.name} names scripts that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_funcgraph_commands_the_docs_name_are_registered(page: Path) -> None:
    commands = registered_commands()
    wrong = []
    for line, text in command_texts(page.read_text()):
        for m in COMMAND.finditer(text):
            name, sub = m.groups()
            if name not in commands:
                wrong.append(f"{page.name}:{line}: `funcgraph {name}`")
            elif commands[name] and sub is not None and sub not in commands[name]:
                wrong.append(f"{page.name}:{line}: `funcgraph {name} {sub}`")
    assert not wrong, f"commands that `funcgraph` does not register ({sorted(commands)}): {wrong}"


SCRIPTS = sorted([*(ROOT / "benchmarks").glob("*.py"), *(ROOT / "examples").glob("*.py")])


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.relative_to(ROOT).as_posix() for p in SCRIPTS])
def test_every_benchmark_and_example_imports(script: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Their top level (imports, definitions) runs: a name moved in the library breaks here,
    not when someone next runs the script."""
    import importlib.util
    import sys

    monkeypatch.syspath_prepend(str(script.parent))  # as `python benchmarks/x.py` runs it
    name = f"_script_{script.parent.name}_{script.stem}"
    spec = importlib.util.spec_from_file_location(name, script)
    assert spec is not None and spec.loader is not None, script
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
