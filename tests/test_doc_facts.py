"""The facts the docs repeat most, checked against the code: the default algorithm, the
thread default of ``meta-train``, and the result the README prints (against its record)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import typer.main

from funcgraph.cli import app
from funcgraph.runs.meta_training.loop import default_algo

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
TEST_LINE = re.compile(r"test \(best checkpoint, 5way1shot\): acc [\d.]+% \+- [\d.]+% "
                       r"\(95% CI, \d+ tasks\)")


def pages() -> dict[str, str]:
    return {p.relative_to(ROOT).as_posix(): p.read_text()
            for p in [ROOT / "README.md", *(ROOT / "docs").glob("**/*.md")]}


def option_default(command: str, option: str) -> object:
    cmd = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    [param] = [p for p in cmd.params if option in getattr(p, "opts", [])]
    return param.default


def test_the_default_algorithm_on_images_is_protonet_and_the_docs_say_so() -> None:
    assert default_algo("glyphs") == "protonet" and default_algo("omniglot") == "protonet"
    assert default_algo("sinusoid") == "maml"
    for name in ("README.md", "docs/index.md", "docs/meta-learning.md"):
        text = " ".join(pages()[name].split())
        assert re.search(r"prototypical networks", text, re.I), f"{name} names no default"
    wrong = [(name, m[0]) for name, text in pages().items()
             for m in re.finditer(r"(?:quick ?start|main job|default run).{0,80}?"
                                  r"meta-trains (?:second-order )?MAML",
                                  " ".join(text.split()), re.I)]
    assert not wrong, f"pages that call MAML the default: {wrong}"


def test_the_thread_defaults_the_docs_state_are_the_commands() -> None:
    threads = option_default("meta-train", "--threads")
    assert threads == 0, threads
    stated = []
    for name, text in pages().items():
        if name == "docs/cli.md":
            continue
        flat = " ".join(text.split())
        for m in re.finditer(r"`meta-train`(?:'s)? (?:`--threads` )?(?:defaults to|uses every "
                             r"core by default \(`--threads) (\w+)", flat):
            stated.append((name, m[1]))
        for _ in re.finditer(r"`meta-train` defaults to one thread", flat):
            stated.append((name, "1"))
    assert stated, "no page states meta-train's thread default"
    wrong = [(n, v) for n, v in stated if v != str(threads)]
    assert not wrong, f"pages stating another --threads default than {threads}: {wrong}"


def test_the_readme_prints_the_newest_recorded_result() -> None:
    printed = TEST_LINE.findall(README)
    assert len(printed) == 1, f"the README should print one test line, found {printed}"
    path = ROOT / "results" / "readme.jsonl"
    assert path.is_file(), (
        "the README's result has no record: run `python benchmarks/record_run.py --name readme "
        "-- funcgraph meta-train --tasks 5way1shot`")
    newest = max((json.loads(line) for line in path.read_text().splitlines() if line.strip()),
                 key=lambda r: r["date"])
    assert newest["command"].endswith("funcgraph meta-train --tasks 5way1shot"), newest["command"]
    recorded = [f["test_line"] for f in newest["figures"] if "test_line" in f]
    assert recorded == printed, f"README prints {printed}, the newest record {recorded}"


def test_the_set_up_commands_are_what_ci_runs_and_the_torch_note_says_what_the_pin_does(
        ) -> None:
    from test_docs import code_blocks

    commands = [code.strip() for _, info, code in code_blocks(README) if info == "bash"]
    assert len(commands) >= 2 and all(c.startswith("python3 -m venv .venv") for c in commands[:2])
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci == commands[1], f".ci/run runs {ci!r}, the README says {commands[1]!r}"
    index = (ROOT / "docs" / "index.md").read_text()
    assert commands[0] in index and commands[1] in index, "docs/index.md repeats both commands"
    note = " ".join(README.split())
    assert "does not by itself choose a CPU build" in note
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in note
