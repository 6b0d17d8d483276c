"""Run a documented command and append its figures to ``results/NAME.jsonl``.

    python benchmarks/record_run.py --name readme -- funcgraph meta-train --tasks 5way1shot
    python benchmarks/record_run.py --name meta-learning -- funcgraph meta-train \\
        --tasks 5way1shot --algo maml --seed 1

The command runs with its output passed through; then the record (see
``benchmarks/records.py``) gets, as figures: every JSON line the command printed; each held-out
test line of a ``funcgraph`` run (``test (best checkpoint, 5way1shot): acc 97.46% +- 0.30%
(95% CI, 600 tasks)``), parsed into its metric, mean, interval and task count; the run's final
``test`` record from ``RUN_DIR/metrics.jsonl`` (the run directory is read from the command's
``run directory:`` line); and the command's wall and CPU seconds (children included). A
command that fails is not recorded: the exit status is passed on.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from records import RESULTS, append, commit, json_lines, make_record

TEST_LINE = re.compile(
    r"^test \((?P<checkpoint>\w+) checkpoint, (?P<tasks>[^)]+)\): (?P<metric>\w+) "
    r"(?P<mean>-?[\d.]+)(?P<unit>%?) \+- (?P<ci95>[\d.]+)%? \(95% CI, (?P<episodes>\d+) tasks\)$")
RUN_DIR = re.compile(r"^run directory: (.+)$")
INTERVAL = re.compile(r"-?\d+(?:\.\d+)?%? \+- \d+(?:\.\d+)?%?")


def test_lines(text: str) -> list[dict[str, Any]]:
    """Each ``test (...)`` line of ``text``: the line itself and its parsed fields."""
    out = []
    for line in text.splitlines():
        m = TEST_LINE.match(line.strip())
        if m:
            scale = 100.0 if m["unit"] == "%" else 1.0
            out.append({"test_line": line.strip(), "checkpoint": m["checkpoint"],
                        "tasks": m["tasks"], "metric": m["metric"],
                        m["metric"]: float(m["mean"]) / scale,
                        f"{m['metric']}_ci95": float(m["ci95"]) / scale,
                        "episodes": int(m["episodes"])})
    return out


def interval_lines(text: str) -> list[dict[str, Any]]:
    """Other printed lines with a ``mean +- interval`` (``pixel 1-NN 5way1shot, 600 tasks:
    57.6% +- 0.8%``), kept as printed."""
    return [{"line": line.strip()} for line in text.splitlines()
            if INTERVAL.search(line) and not TEST_LINE.match(line.strip())
            and not line.strip().startswith("{")]


def run_test_record(text: str) -> dict[str, Any] | None:
    """The last ``test`` record of the run directory the output names, if any."""
    dirs = [m[1].strip() for m in map(RUN_DIR.match, text.splitlines()) if m]
    if not dirs:
        return None
    metrics = Path(dirs[-1]) / "metrics.jsonl"
    if not metrics.is_file():
        return None
    tests = [r for r in json_lines(metrics.read_text()) if r.get("kind") == "test"]
    return {"run_dir": dirs[-1], **tests[-1]} if tests else None


def figures_of(text: str, wall_s: float, cpu_s: float) -> list[dict[str, Any]]:
    figures = [*json_lines(text), *test_lines(text), *interval_lines(text)]
    test = run_test_record(text)
    if test is not None:
        figures.append({"metrics_test": test})
    return [*figures, {"wall_s": round(wall_s, 2), "cpu_s": round(cpu_s, 2)}]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--name", required=True, help="the record file: results/NAME.jsonl")
    parser.add_argument("--results", type=Path, default=RESULTS, help=argparse.SUPPRESS)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    if not re.fullmatch(r"[\w.-]+", args.name):
        parser.error(f"--name must be letters, digits, '.', '_' or '-', got {args.name!r}")

    code_at_start = commit()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        sys.stdout.write(line)
        lines.append(line)
    code = proc.wait()
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if code != 0:
        print(f"record_run: the command exited {code}; nothing recorded", file=sys.stderr)
        return code
    text = "".join(lines)
    record = make_record(args.name, shlex.join(command), figures_of(text, wall, cpu), wall,
                         code_at_start)
    path = append(record, args.results)
    print(f"record_run: recorded in {path}", file=sys.stderr)
    print(json.dumps({"recorded": str(path), "figures": len(record["figures"])}),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
