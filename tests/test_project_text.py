"""Only the repository speaks: project text names nothing a reader of the repository cannot
see (the rounds, sessions or agents that wrote it, issue numbers, "this machine" without
saying what it is, files outside the repository)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve()

# Where the words are wrong: (pattern, what to write instead).
BANNED = [
    (r"\b(?:this|that|next|last|later|earlier|previous) round\b",
     "say what changed, not when"),
    (r"\bsessions?\b", "no sessions: say what was measured and how"),
    (r"\bagents?\b", "no agents: say what ran beside the measurement"),
    (r"\bissue(?:s|'s)?\b|#\d{2,}\b", "cite the repository's files, not issues"),
    (r"\bdevelopment machine\b|\b(?:this|the) project's\b|\bthe shared 2-core\b",
     "say what the machine is (\"a 2-core x86-64 CPU\")"),
    (r"\.\./shared\b|/work/", "cite only files inside the repository"),
]
# "this machine" means the machine running the code in messages and help; in docs, examples,
# benchmarks and the CI script it is where a figure came from, which a reader cannot see.
WHERE_FIGURES_ARE = [(r"\bthis machine\b", "say what the machine is")]
# Lines where a banned word is a name: pytest's fixture scope, ONNX Runtime's session.
ALLOWED = re.compile(r'scope="session"|InferenceSession|\bsession\.(?:get_inputs|run)\(|'
                     r"^\s*session = ")


def project_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / ".ci" / "run", ROOT / "mkdocs.yml",
             ROOT / "pyproject.toml",
             *ROOT.glob("docs/**/*.md"), *ROOT.glob("examples/**/*.py"),
             *ROOT.glob("examples/**/*.toml"), *ROOT.glob("examples/**/*.json"),
             *ROOT.glob("benchmarks/*.py"), *ROOT.glob("funcgraph/**/*.py"),
             *ROOT.glob("tests/*.py")]
    return sorted(p for p in files if p.is_file() and p != HERE)


def offences(text: str, rules: list[tuple[str, str]]) -> list[tuple[int, str, str]]:
    found = []
    for i, line in enumerate(text.splitlines(), 1):
        if ALLOWED.search(line):
            continue
        for pattern, advice in rules:
            m = re.search(pattern, line, re.I)
            if m:
                found.append((i, m[0], advice))
    return found


def test_the_rules_catch_the_phrases_and_spare_ordinary_words() -> None:
    bad = ("It was MAML until this round.\nmeasured in a later session\nother agents' jobs\n"
           "the issue's target\nsee ../shared/notes\non the development machine\n")
    assert [w for _, w, _ in offences(bad, BANNED)] == [
        "this round", "session", "agents", "issue's", "../shared", "development machine"]
    fine = ("rounding to 1e-6; --rounds 7; each round times every variant\n"
            "the background split; a round trip; @pytest.fixture(scope=\"session\")\n")
    assert offences(fine, BANNED) == []
    assert offences("interleaved rounds of 21 calls, round-robin", BANNED) == []


@pytest.mark.parametrize("path", project_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_project_text_points_at_nothing_outside_the_repository(path: Path) -> None:
    rules = BANNED
    if path.parts[len(ROOT.parts)] != "funcgraph" and path.name != "cli.md":
        rules = BANNED + WHERE_FIGURES_ARE
    found = offences(path.read_text(errors="replace"), rules)
    assert not found, "\n".join(f"{path.relative_to(ROOT)}:{i}: {w!r}: {advice}"
                                for i, w, advice in found)
