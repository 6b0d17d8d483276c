"""Pictures of runs: ``curves.png`` in every run directory, and several runs on one figure.

A run's ``metrics.jsonl`` holds ``train`` records (loss and the training metric every few
steps), ``validation`` records (the metric, with a 95% CI for meta-learning) and a final
``test`` or ``final`` record. :func:`write_curves` draws them on two panels — training loss,
and the metric with validation and test on top — smoothed with the raw values faint, and
writes the PNG atomically (a reader never sees half a file). The runs call it at each
validation and at the end. :func:`plot_runs` overlays one metric of several runs.
matplotlib is imported only when a figure is drawn.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..files import atomic_write
from ..train import Run

CURVES_FILE = "curves.png"
METRICS = ("acc", "accuracy", "val_acc", "mse")
"""Metric names the runs log, in order of preference."""


def metric_of(records: Iterable[Mapping[str, Any]]) -> str | None:
    """The metric a run reports (``acc`` for meta-learning, ``accuracy`` for ``train``...)."""
    seen = {k for r in records for k in r}
    return next((m for m in METRICS if m in seen), None)


def smooth(values: Sequence[float], weight: float = 0.8) -> list[float]:
    """Exponential moving average (TensorBoard's smoothing), bias-corrected at the start."""
    out, avg, norm = [], 0.0, 0.0
    for v in values:
        avg, norm = weight * avg + (1 - weight) * v, weight * norm + (1 - weight)
        out.append(avg / norm)
    return out


def _series(records: Sequence[Mapping[str, Any]], kind: str, key: str
            ) -> tuple[list[int], list[float]]:
    pairs = [(int(r["step"]), float(r[key])) for r in records
             if r.get("kind") == kind and isinstance(r.get(key), int | float)]
    return [s for s, _ in pairs], [v for _, v in pairs]


def _png(fig: Any) -> bytes:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_curves(run_dir: str | Path) -> Path:
    """Draw ``RUN_DIR/curves.png`` from the run's ``metrics.jsonl``; returns its path."""
    run = Run.open(run_dir)
    records = run.metrics()
    metric = metric_of(records)
    plt = _pyplot()
    fig, (ax_loss, ax_metric) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    steps, loss = _series(records, "train", "loss")
    if steps:
        ax_loss.plot(steps, loss, color="tab:blue", alpha=0.25, linewidth=1)
        ax_loss.plot(steps, smooth(loss), color="tab:blue", label="training loss")
    ax_loss.set(xlabel="step", ylabel="loss", title="training loss")
    if metric is not None:
        steps, values = _series(records, "train", metric)
        if steps:
            ax_metric.plot(steps, values, color="tab:orange", alpha=0.25, linewidth=1)
            ax_metric.plot(steps, smooth(values), color="tab:orange", label=f"training {metric}")
        val = [r for r in records if r.get("kind") == "validation" and metric in r]
        if val:
            vs = [int(r["step"]) for r in val]
            vm = [float(r[metric]) for r in val]
            ax_metric.plot(vs, vm, "o-", color="tab:green", label=f"validation {metric}")
            ci = [float(r.get("ci95") or 0.0) for r in val]
            ax_metric.fill_between(vs, [m - c for m, c in zip(vm, ci, strict=True)],
                                   [m + c for m, c in zip(vm, ci, strict=True)],
                                   color="tab:green", alpha=0.2, label="95% CI")
        for r in records:
            if r.get("kind") in ("test", "final") and isinstance(r.get(metric), int | float):
                err = r.get(f"{metric}_ci95")
                ax_metric.errorbar([int(r["step"])], [float(r[metric])],
                                   yerr=[float(err)] if err else None, fmt="*", markersize=12,
                                   color="tab:red", capsize=4, label=f"{r['kind']} {metric}")
        ax_metric.set(xlabel="step", ylabel=metric, title=metric)
    for ax in (ax_loss, ax_metric):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize=8)
    fig.suptitle(run.path.name, fontsize=10)
    out = run.path / CURVES_FILE
    atomic_write(out, _png(fig))
    return out


def plot_runs(run_dirs: Sequence[str | Path], out: str | Path, *,
              metric: str | None = None) -> Path:
    """One figure with ``metric`` of every run in ``run_dirs`` against the step (validation
    records when a run has them, else its training records, smoothed); returns ``out``."""
    if not run_dirs:
        raise ConfigError("plot: name at least one run directory")
    runs = [Run.open(d) for d in run_dirs]
    records = {run.path: run.metrics() for run in runs}
    if metric is None:
        metric = metric_of(r for rs in records.values() for r in rs) or "loss"
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5), constrained_layout=True)
    drawn = 0
    for run in runs:
        steps, values = _series(records[run.path], "validation", metric)
        if not steps:
            steps, values = _series(records[run.path], "train", metric)
            values = smooth(values)
        if steps:
            ax.plot(steps, values, marker="." if len(steps) < 30 else None, label=run.path.name)
            drawn += 1
    if not drawn:
        plt.close(fig)
        raise ConfigError(f"plot --metric {metric}: none of the runs logged it")
    ax.set(xlabel="step", ylabel=metric, title=f"{metric} of {drawn} run(s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    path = Path(out)
    atomic_write(path, _png(fig))
    return path


__all__ = ["CURVES_FILE", "metric_of", "plot_runs", "smooth", "write_curves"]
