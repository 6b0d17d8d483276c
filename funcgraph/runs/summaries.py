"""What ``funcgraph runs`` lists: one summary per run directory, read without touching the run.

:func:`find_runs` collects run directories (a folder holding ``config.json``) under the given
folders; :func:`summarize` reads one: its command, algorithm or model, data, steps done and
planned, best validation, test result, the time from its start (or last resume) to its last
record, and its status:

* ``in use``: another process holds its lock (:mod:`funcgraph.train.ownership`);
* ``finished``: it logged its final record (``test``, ``final``) or wrote its search summary;
* ``failed``: it diverged, or it never saved a step;
* ``interrupted``: it has a checkpoint to resume from.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import FuncgraphError
from ..train.checkpoint import checkpoint_exists, checkpoint_step
from ..train.ownership import CONFIG_FILE, RunLock
from ..train.run_dir import METRICS_FILE, Run
from .curves import metric_of

STATUSES = ("finished", "interrupted", "failed", "in use")


@dataclass(frozen=True)
class RunSummary:
    """One row of ``funcgraph runs`` (all plain values, so ``--json`` round-trips)."""

    name: str
    path: str
    command: str
    model: str
    data: str
    steps_done: int
    steps_planned: int | None
    best_validation: float | None
    test: float | None
    test_ci95: float | None
    metric: str | None
    seconds: float | None
    status: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def find_runs(folders: Iterable[str | Path]) -> list[Path]:
    """Run directories at or directly below each folder (and one level deeper), sorted."""
    found: set[Path] = set()
    for folder in map(Path, folders):
        for candidate in (folder, *folder.glob("*"), *folder.glob("*/*")):
            if (candidate / CONFIG_FILE).is_file():
                found.add(candidate)
    return sorted(found)


def _describe(config: dict[str, Any]) -> tuple[str, str, str]:
    """``(command, algorithm or model, data)`` from a run's config."""
    model = config.get("model")
    name = (model.get("name") or model.get("factory") or model.get("genotype") or "model"
            if isinstance(model, dict) else str(model or ""))
    if "algo" in config:  # meta-train
        data = f"{config.get('dataset', '?')} {config.get('tasks', '')}".strip()
        return "meta-train", f"{config['algo']} ({name})", data
    command = str(config.get("command", "?"))
    if command == "search":
        return command, f"darts C={config.get('C')} layers={config.get('layers')}", str(
            config.get("data", "?"))
    data = config.get("data", {})
    return command, str(name), str(data.get("name", "?") if isinstance(data, dict) else data)


def summarize(path: str | Path) -> RunSummary:
    """The summary of the run in ``path`` (see the module docstring)."""
    run = Run.open(path)
    records = run.metrics()
    command, model, data = _describe(run.config)
    last = run.checkpoint_dir / "last"
    done = checkpoint_step(last) if checkpoint_exists(last) else 0
    metric = metric_of(records)
    validation = [r for r in records if r.get("kind") == "validation"]
    val_key = metric if any(metric in r for r in validation) else metric_of(validation)
    validations = [float(r[val_key]) for r in validation
                   if val_key and isinstance(r.get(val_key), int | float)]
    higher = metric != "mse"
    best = (max(validations) if higher else min(validations)) if validations else None
    final = next((r for r in reversed(records) if r.get("kind") in ("test", "final")), None)
    test = final.get(metric) if final and metric else None
    ci = final.get(f"{metric}_ci95") if final and metric else None
    if final is not None:
        done = max(done, int(final.get("step", done)))
    summary_file = run.path / "search.json"
    finished = final is not None or summary_file.exists()
    if summary_file.exists():
        done = int(json.loads(summary_file.read_text()).get("steps_done", done))
    if RunLock(run.path).held_elsewhere():
        status = "in use"
    elif finished:
        status = "finished"
    elif any(r.get("kind") == "diverged" for r in records) or done == 0:
        status = "failed"
    else:
        status = "interrupted"
    metrics_file = run.path / METRICS_FILE
    seconds = (metrics_file.stat().st_mtime - (run.path / CONFIG_FILE).stat().st_mtime
               if metrics_file.exists() else None)
    planned = run.config.get("steps")
    return RunSummary(run.path.name, str(run.path), command, model, data, done,
                      planned if isinstance(planned, int) else None, best,
                      float(test) if isinstance(test, int | float) else None,
                      float(ci) if isinstance(ci, int | float) else None, metric,
                      max(seconds, 0.0) if seconds is not None else None, status)


def summarize_all(folders: Iterable[str | Path]) -> list[RunSummary]:
    """Summaries of every run under ``folders``; a directory that cannot be read is listed
    as ``failed`` with what is known, never dropped."""
    rows = []
    for path in find_runs(folders):
        try:
            rows.append(summarize(path))
        except (FuncgraphError, OSError, ValueError):
            rows.append(RunSummary(path.name, str(path), "?", "?", "?", 0, None, None, None,
                                   None, None, None, "failed"))
    return rows


__all__ = ["STATUSES", "RunSummary", "find_runs", "summarize", "summarize_all"]
