"""Results as records: each measurement appends one JSON line to ``results/NAME.jsonl``.

A record says what gave the figures, so a reader can check them and a later run can be
compared with them::

    {"name": "meta_step", "command": "python benchmarks/meta_step.py --steps 3",
     "commit": "1a2b3c4...", "dirty": false, "torch": "2.13.0", "python": "3.11.9",
     "machine": {"cpu": "AMD EPYC 7B13", "cores": 2, "arch": "x86_64", "os": "Linux-6.1"},
     "date": "2026-12-05T12:00:00+00:00", "seconds": 41.2, "figures": [{...}, ...]}

``figures`` holds what the command printed as JSON lines (each benchmark prints its table as
JSON lines beside the text), and for a ``funcgraph`` run its held-out test line and the test
record of its ``metrics.jsonl`` (see ``benchmarks/record_run.py``). A benchmark records itself
when given ``--record`` (its ``main`` is wrapped by :func:`recorded`); any other command is
recorded through ``benchmarks/record_run.py``. ``dirty`` is true when tracked files differed
from the commit, so the code that ran is not exactly the commit's.

The docs' results pages are checked against these files (``tests/test_records.py``): a figure
on a results page that no record holds fails the tests.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
RECORD_FLAG = "--record"


def machine() -> dict[str, Any]:
    """The processor model, core count, architecture and operating system."""
    cpu = platform.processor() or "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    gpu = None
    with contextlib.suppress(Exception):
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    found = {"cpu": cpu, "cores": os.cpu_count(), "arch": platform.machine(),
             "os": f"{platform.system()}-{platform.release()}"}
    return {**found, "gpu": gpu} if gpu else found


def commit() -> tuple[str, bool]:
    """``(HEAD's hash, whether tracked files differ from it)``; ``("unknown", True)`` outside
    a git checkout. The records themselves (``results/``) do not count: a run recorded after
    another, before that one is committed, ran the same code."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                 ".", ":(exclude)results"],
                                cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown", True
    return head, bool(status.strip())


def json_lines(text: str) -> list[dict[str, Any]]:
    """The lines of ``text`` that are JSON objects, parsed, in order."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            with contextlib.suppress(json.JSONDecodeError):
                value = json.loads(line)
                if isinstance(value, dict):
                    out.append(value)
    return out


THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
"""Environment variables that change a measurement; set ones are written before the command."""


def with_environment(command: str) -> str:
    """``command`` preceded by the thread and device variables set in this environment."""
    set_here = [f"{k}={shlex.quote(os.environ[k])}" for k in THREAD_VARIABLES if k in os.environ]
    return " ".join([*set_here, command])


def make_record(name: str, command: str, figures: list[dict[str, Any]],
                seconds: float, code: tuple[str, bool] | None = None) -> dict[str, Any]:
    """The record of ``figures`` measured by ``command`` just now, on this interpreter (the
    thread and device variables set in the environment are written before the command).
    ``code`` is :func:`commit` taken when the measurement started (default: now), so that a
    commit made while a long command runs is not credited with its figures."""
    import torch

    command = with_environment(command)
    head, dirty = commit() if code is None else code
    return {"name": name, "command": command, "commit": head, "dirty": dirty,
            "torch": torch.__version__, "python": platform.python_version(),
            "machine": machine(), "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "seconds": round(seconds, 3), "figures": figures}


def append(record: dict[str, Any], results: Path = RESULTS) -> Path:
    """Append ``record`` as one line to ``results/<name>.jsonl``; returns the file."""
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{record['name']}.jsonl"
    with path.open("a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
    return path


def read(name: str, results: Path = RESULTS) -> list[dict[str, Any]]:
    """Every record of ``results/<name>.jsonl``, oldest first ([] when there is none)."""
    path = results / f"{name}.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class _Tee(io.TextIOBase):
    """Writes through to a stream and keeps a copy."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.copy = stream, io.StringIO()

    def write(self, s: str) -> int:
        self.copy.write(s)
        return self.stream.write(s)

    def flush(self) -> None:
        self.stream.flush()


@contextlib.contextmanager
def capture_stdout() -> Iterator[io.StringIO]:
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        yield tee.copy


def recorded(name: str, results: Path = RESULTS) -> Callable[[Callable[..., Any]], Any]:
    """Wrap a benchmark's ``main``: with ``--record`` among its arguments (``sys.argv`` or the
    list passed), the flag is removed, ``main`` runs, and the JSON lines it printed are
    appended as one record to ``results/<name>.jsonl``."""

    def wrap(main: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(main)
        def run(argv: list[str] | None = None) -> Any:
            args = list(sys.argv[1:] if argv is None else argv)
            if RECORD_FLAG not in args:
                return main() if argv is None else main(argv)
            args.remove(RECORD_FLAG)
            script = Path(sys.argv[0] if argv is None else f"benchmarks/{name}.py")
            with contextlib.suppress(ValueError):
                script = script.resolve().relative_to(ROOT)
            command = shlex.join(["python", str(script), *args])
            code, started = commit(), time.perf_counter()
            with capture_stdout() as out:
                if argv is None:
                    sys.argv[1:] = args
                    value = main()
                else:
                    value = main(args)
            record = make_record(name, command, json_lines(out.getvalue()),
                                 time.perf_counter() - started, code)
            print(f"recorded in {append(record, results)}", file=sys.stderr)
            return value

        return run

    return wrap
