"""``funcgraph runs`` and ``funcgraph plot``: see and compare the runs on disk."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from .common import console, user_errors

LISTING_PANEL = "Listing"
FIGURE_PANEL = "Figure"


class SortKey(StrEnum):
    name = "name"
    command = "command"
    model = "model"
    data = "data"
    steps = "steps"
    best = "best"
    test = "test"
    seconds = "seconds"
    status = "status"


def _pct(value: float | None, metric: str | None) -> str:
    if value is None:
        return ""
    return f"{100 * value:.2f}%" if metric in ("acc", "accuracy", "val_acc") else f"{value:.4g}"


@user_errors
def runs(
    folders: Annotated[list[Path] | None, typer.Argument(
        help="Folders holding run directories (default: runs/).")] = None,
    sort: Annotated[SortKey, typer.Option(
        rich_help_panel=LISTING_PANEL, help="Column to sort by.")] = SortKey.name,
    reverse: Annotated[bool, typer.Option(
        "--reverse", rich_help_panel=LISTING_PANEL, help="Sort descending.")] = False,
    as_json: Annotated[bool, typer.Option(
        "--json", rich_help_panel=LISTING_PANEL, help="One JSON list, for scripts.")] = False,
) -> None:
    """List the runs under the given folders: command, model, data, steps, best validation,
    test result, time and status (finished, interrupted, failed, in use).

    Example: funcgraph runs runs/ --sort test --reverse
    """
    from ..runs.summaries import summarize_all

    rows = summarize_all(folders or [Path("runs")])
    field = {"steps": "steps_done", "best": "best_validation"}.get(sort.value, sort.value)
    rows.sort(key=lambda r: (getattr(r, field) is None, getattr(r, field) or 0)
              if field in ("steps_done", "best_validation", "test", "seconds")
              else str(getattr(r, field)), reverse=reverse)
    if as_json:
        console.print_json(json.dumps([r.to_json() for r in rows]))
        return
    # Three short lines a run (its name and state; what it ran; its figures), so the listing
    # reads at 80 columns without a word broken across lines.
    console.print(f"{len(rows)} run(s)", highlight=False)
    for r in rows:
        steps = f"{r.steps_done}/{r.steps_planned}" if r.steps_planned else str(r.steps_done)
        time_ = f", {r.seconds:.0f} s" if r.seconds is not None else ""
        figures = [f"steps {steps}"]
        if r.best_validation is not None:
            figures.append(f"best val {_pct(r.best_validation, r.metric)}")
        if r.test is not None:
            figures.append(f"test {_pct(r.test, r.metric)}" + (
                f" +- {_pct(r.test_ci95, r.metric)}" if r.test_ci95 else ""))
        what = " ".join(v for v in (r.command, r.model, r.data) if v)
        for line in (f"{r.name}  ({r.status}{time_})", f"  {what}", "  " + ",  ".join(figures)):
            console.print(line, highlight=False, markup=False, soft_wrap=True)


@user_errors
def plot(
    run_dirs: Annotated[list[Path], typer.Argument(help="Run directories to overlay.")],
    metric: Annotated[str | None, typer.Option(
        rich_help_panel=FIGURE_PANEL,
        help="Metric to plot (default: the runs' own, e.g. acc or accuracy; or loss).")] = None,
    out: Annotated[Path, typer.Option(
        "--out", "-o", rich_help_panel=FIGURE_PANEL, help="The PNG to write.")] =
        Path("runs.png"),
) -> None:
    """Overlay one metric of several runs on one figure (validation points where a run has
    them, smoothed training values otherwise).

    Example: funcgraph plot runs/maml-a runs/protonet-b --metric acc --out compare.png
    """
    from ..runs.curves import plot_runs

    path = plot_runs(run_dirs, out, metric=metric)
    console.print(f"wrote {path}", highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    app.command("runs")(runs)
    app.command("plot")(plot)
