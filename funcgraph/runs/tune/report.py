"""What ``funcgraph tune show`` reports of a study: the trial table, the best settings as a
ready ``meta-train`` command line, plots, and JSON lines for the results records.

The plots are Optuna's own (``optuna.visualization.matplotlib``: the optimisation history and
the parameter importances by Optuna's default evaluator, PED-ANOVA, which needs no
scikit-learn) beside one of ours, each trial's validation accuracy against
the CPU seconds it took, so the cost of a setting is on the same page as its accuracy, with
the study's front: the complete trials no other complete trial beats at both.
"""

from __future__ import annotations

import shlex
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ...checks import option
from ...errors import ConfigError
from ..meta_training.config import MetaTrainConfig, default_config
from .space import FRACTIONS, MODEL_PREFIX, OPTION_NAMES, SearchSpace
from .study import (
    attempt_cpu_s,
    higher_is_better,
    origin,
    shown_setting,
    shown_value,
    study_metric,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FLAG_OPTIONS: dict[str, tuple[str | None, str | None]] = {
    "cosine_meta_lr": ("--cosine-meta-lr", "--constant-meta-lr"),
    "linear_meta_lr": ("--linear-meta-lr", None),
    "rotate": ("--rotate", "--no-rotate"),
    "first_order": ("--first-order", None),
    "remat": ("--remat", None),
    "bn_running_stats": ("--bn-running-stats", None),
    "inner_minibatches": ("--inner-minibatches", "--inner-full-batch"),
    "compile": ("--compile", "--no-compile"),
}
"""``meta-train``'s on and off flags of each boolean config field."""

NOT_OPTIONS = ("algo", "dataset", "model", "checkpoint_every")


@dataclass(frozen=True)
class TrialRow:
    """One trial as the table and the records show it."""

    number: int
    state: str
    value: float | None
    step: int
    cpu_s: float
    params: dict[str, Any]
    run_dir: str | None
    reason: str | None
    metric: str = "acc"
    """The validation figure ``value`` is: ``"acc"``, or ``"mse"`` on regression."""

    def as_record(self) -> dict[str, Any]:
        """The row as a ``tune show --json`` line, its value keyed by the study's metric
        (``val_acc``, or ``val_mse`` on regression)."""
        return {"trial": self.number, "state": self.state, f"val_{self.metric}": self.value,
                "step": self.step, "cpu_s": self.cpu_s, "params": self.params,
                "run_dir": self.run_dir, **({"reason": self.reason} if self.reason else {})}


LOST = "killed or lost: its process ended without a word"
"""A failed trial's reason where none was recorded: no exception, no Ctrl-C (``kill -9``, the
out-of-memory killer, a machine gone; failed by the next start or Optuna's heartbeat)."""


def trial_rows(study: Any) -> list[TrialRow]:
    """Every trial that ran, in order; ``step`` is the attempt's last validated step, and a
    failed trial's ``reason`` says why (its error, ``interrupted``, or :data:`LOST`) and what
    retried it."""
    rows = []
    metric = study_metric(study)
    trials = study.get_trials(deepcopy=False)
    for t in trials:
        if t.state.name == "WAITING":
            continue
        steps = max(max(t.intermediate_values, default=0), int(t.user_attrs.get("validated", 0)))
        run_dir = t.user_attrs.get("run_dir")
        reason = t.user_attrs.get("failure") or (
            "interrupted" if t.user_attrs.get("interrupted") else
            LOST if t.state.name == "FAIL" else None)
        after = [r.number for r in trials if origin(r) == origin(t) and r.number > t.number]
        if reason in ("interrupted", LOST) and after:
            reason = f"{reason}; retried as trial {after[0]}"
        if origin(t) != t.number:
            reason = f"retry of trial {origin(t)}" + (f"; {reason}" if reason else "")
        if t.state.name == "PRUNED" and "CPU cap" in t.user_attrs.get("pruned", ""):
            reason = "over the CPU cap"
        rows.append(TrialRow(t.number, t.state.name.lower(), t.value, steps, attempt_cpu_s(t),
                             dict(t.params), run_dir, reason, metric))
    return rows


def best_trial(study: Any) -> Any | None:
    """Optuna's best trial (the complete trial with the best value in the study's direction),
    or ``None`` before the first complete trial."""
    try:
        return study.best_trial
    except ValueError:  # Optuna's answer when no trial is complete
        return None


def run_costs(rows: list[TrialRow]) -> list[TrialRow]:
    """``rows`` with each one's CPU seconds those of its whole run: a retry's attempts (an
    interrupted attempt's included) summed, as the run directory they share cost."""
    def run(r: TrialRow) -> str:
        return r.run_dir or str(r.number)

    spent: dict[str, float] = {}
    for r in rows:
        spent[run(r)] = spent.get(run(r), 0) + r.cpu_s
    return [replace(r, cpu_s=spent[run(r)]) for r in rows]


def front(rows: list[TrialRow], metric: str) -> list[TrialRow]:
    """The complete trials no other complete trial beats at both validation figure and CPU
    seconds (better at one, no worse at the other), cheapest first. A retry's CPU seconds
    count every attempt of its run (an interrupted attempt's too): what the run cost.

    A study has one objective (a pruner needs one), so accuracy against cost is read here, on
    finished trials: a default is chosen on this front, not by the best figure alone.
    """
    def better(a: float, b: float) -> bool:
        return a > b if higher_is_better(metric) else a < b

    done = [r for r in run_costs(rows) if r.state == "complete" and r.value is not None]

    def beaten(r: TrialRow) -> bool:
        assert r.value is not None
        return any(o.value is not None and o.cpu_s <= r.cpu_s and not better(r.value, o.value)
                   and (o.cpu_s < r.cpu_s or better(o.value, r.value)) for o in done)

    return sorted((r for r in done if not beaten(r)), key=lambda r: (r.cpu_s, r.number))


def command_line(cfg: MetaTrainConfig, overrides: dict[str, str], *,
                 given: Iterable[str] = (), threads: int | None = None,
                 device: str | None = None) -> str:
    """``funcgraph meta-train ...`` that runs ``cfg``: every option named in ``given`` (a
    study's ``[study]``, ``[fixed]`` and searched settings, at their defaults too) and every
    other that differs from the algorithm's defaults on the dataset, then the model's
    ``--set`` overrides, then ``--device`` and ``--threads`` where known (a run's figures
    depend on its thread count). Floats are written exactly (``repr``), so the command
    reproduces the trial bit for bit on the same machine.

    A value ``meta-train`` can only take by leaving its flag out (``first_order = false``:
    ``--first-order`` has no off switch) follows as a shell comment, ``# first_order=false``,
    so the line names every value and still runs as printed."""
    base = default_config(cfg.algo, cfg.dataset)
    named = set(given)
    words = ["funcgraph", "meta-train", "--algo", cfg.algo, "--dataset", cfg.dataset]
    unsaid = []
    for name, value in cfg.to_json().items():
        if name in NOT_OPTIONS or value is None or (
                name not in named and value == getattr(base, name, None)):
            continue
        if name in FLAG_OPTIONS:
            on, off = FLAG_OPTIONS[name]
            flag = on if value else off
            if flag is not None:
                words.append(flag)
            elif value == getattr(base, name, None):
                unsaid.append(f"{name}={str(value).lower()}")
            else:  # no registered algorithm's defaults reach this: refuse, never misprint
                raise ConfigError(f"{option(name)}: meta-train has no option that sets "
                                  f"{name}={value}; this run cannot be written as a command")
            continue
        words += [OPTION_NAMES.get(name, option(name)), repr(value) if
                  isinstance(value, float) else str(value)]
    for key, value in overrides.items():
        words += ["--set", f"{key}={value}"]
    if device is not None:
        words += ["--device", device]
    if threads is not None:
        words += ["--threads", str(threads)]
    line = shlex.join(words)
    return line + (f"  # {' '.join(unsaid)} (meta-train's default: the flag left out)"
                   if unsaid else "")


def space_settings(space: SearchSpace) -> set[str]:
    """The config fields a study's space names: its ``[study]`` values, ``[fixed]`` values
    and knobs (a fraction knob by the field it sets)."""
    names = [*space.study, *space.fixed, *(k.name for k in space.knobs)]
    return {FRACTIONS.get(n, n) for n in names if not n.startswith(MODEL_PREFIX)}


def best_command(study: Any, space: SearchSpace) -> str | None:
    """The ready ``meta-train`` command line of the best trial (with the device and thread
    count it ran on), or ``None``."""
    best = best_trial(study)
    if best is None:
        return None
    return trial_command(best, space)


def trial_command(trial: Any, space: SearchSpace) -> str:
    """The ``meta-train`` command line that reruns ``trial`` (see :func:`command_line`)."""
    threads = trial.user_attrs.get("threads")
    return command_line(space.config(trial.params), space.model_overrides(trial.params),
                        given=space_settings(space), device=trial.user_attrs.get("device"),
                        threads=None if threads is None else int(threads))


def table(rows: list[TrialRow], metric: str, width: int = 80) -> str:
    """The trial table as text at ``width`` columns (settings wrap at word boundaries)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    grid = Table(box=None, pad_edge=False, show_edge=False)
    value_name = "val acc" if metric == "acc" else f"val {metric}"
    for name, justify in (("#", "right"), ("state", "left"), (value_name, "right"),
                          ("step", "right"), ("CPU s", "right"), ("settings", "left")):
        grid.add_column(name, justify=justify, no_wrap=name != "settings")  # type: ignore[arg-type]
    for r in rows:
        value = "" if r.value is None else shown_value(r.value, metric)
        settings = " ".join(f"{k}={shown_setting(v)}" for k, v in r.params.items())
        if r.reason:
            settings += f" [{r.reason}]"
        # Plain text: rich would read "[interrupted; ...]" or a failure's "[...]" as markup
        # and drop it.
        grid.add_row(*map(Text, (str(r.number), r.state, value, str(r.step), f"{r.cpu_s:.0f}",
                                 settings)))
    import io

    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(grid)
    return console.export_text()


def write_plots(study: Any, folder: Path, metric: str) -> list[Path]:
    """``history.png``, ``importance.png`` (when two or more trials are complete) and
    ``cost.png`` in ``folder``; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as optuna_plots

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    complete = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
        plots: list[tuple[str, Any]] = [
            ("history.png", optuna_plots.plot_optimization_history)]
        if len(complete) >= 2 and any(len({str(t.params.get(k)) for t in complete}) > 1
                                      for k in complete[0].params):
            plots.append(("importance.png", optuna_plots.plot_param_importances))
        for name, plot in plots:
            figure = cast("Figure", plot(study).figure)
            figure.set_size_inches(7, 4.5)
            figure.tight_layout()
            figure.savefig(folder / name, dpi=100)
            plt.close(figure)
            written.append(folder / name)
    attempts = trial_rows(study)
    rows = run_costs(attempts)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    scale = 100 if metric == "acc" else 1
    for state, marker in (("complete", "o"), ("pruned", "x")):
        pts = [(r.cpu_s, scale * last) for r in rows if r.state == state
               for last in [_last(study, r)] if last is not None]
        if pts:
            ax.scatter(*zip(*pts, strict=True), marker=marker, label=state)
    on_front = front(attempts, metric)
    if on_front:
        ax.step([r.cpu_s for r in on_front], [scale * cast(float, r.value) for r in on_front],
                where="post", color="grey", linewidth=1, label="front")
        for r in on_front:
            ax.annotate(str(r.number), (r.cpu_s, scale * cast(float, r.value)), fontsize=8,
                        xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("CPU seconds of the trial's run (a retry's attempts summed)")
    ax.set_ylabel(("validation accuracy (%)" if metric == "acc" else f"validation {metric}")
                  + " (pruned: at its last report)")
    ax.set_title("accuracy against cost")
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    fig.savefig(folder / "cost.png", dpi=100)
    plt.close(fig)
    return [*written, folder / "cost.png"]


def _last(study: Any, row: TrialRow) -> float | None:
    if row.value is not None:
        return row.value
    trial = study.trials[row.number]
    steps = max(trial.intermediate_values, default=None)
    return None if steps is None else trial.intermediate_values[steps]


__all__ = ["FLAG_OPTIONS", "LOST", "TrialRow", "best_command", "best_trial", "command_line",
           "front", "run_costs", "space_settings", "table", "trial_command", "trial_rows",
           "write_plots"]
