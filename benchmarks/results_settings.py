"""The four standard few-shot settings as one table, in the layout of the MAML papers' Table 1.

Rows are algorithms at their defaults (``funcgraph meta-train --tasks SETTING --algo ALGO``
on glyphs, seed 0, float32: no option that changes the recipe), columns the settings
5-way 1-shot, 5-way 5-shot, 20-way 1-shot and 20-way 5-shot; each cell is the newest such
record in :data:`SOURCES` (test accuracy, 95% interval, CPU seconds), or says that it has not
been recorded and how to record it. ``benchmarks/results_pages.py`` writes it into the block
``<!-- records: standard-settings -->`` of a results page, above that file's own records.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from results_tables import markdown, options, runs_of

SETTINGS = ("5way1shot", "5way5shot", "20way1shot", "20way5shot")
ALGORITHMS = ("protonet", "maml", "mamlpp")
SOURCES = ("standard-settings", "meta-learning", "readme")
"""Record files whose runs may fill a cell (the README's run is ProtoNet's 5-way 1-shot)."""
RECIPE_OPTIONS = {"algo", "tasks", "out", "threads", "dataset", "resume"}
"""Options a default run may carry: anything else changes the recipe (``--resume`` continues
the run's own recorded options, and refuses changed ones)."""

Records = Callable[[str], list[dict[str, Any]]]


def is_default(command: str, algo: str, setting: str) -> bool:
    """Whether ``command`` is ``meta-train`` at ``algo``'s defaults on glyphs for
    ``setting``, seed 0."""
    opts = options(command)
    return (opts.get("algo", "protonet") == algo and opts.get("tasks") == setting
            and opts.get("dataset", "glyphs") == "glyphs" and opts.get("seed", "0") == "0"
            and set(opts) <= RECIPE_OPTIONS | {"seed"} and " meta-train " in f" {command} ")


def cell(read: Records, algo: str, setting: str) -> str:
    """The newest default run of ``algo`` on ``setting``, as a table cell; a run of an
    earlier default (its steps are not today's default steps) says so."""
    from funcgraph.runs.meta_training.config import default_config

    rows = [(record["date"], row) for name in SOURCES for record in read(name)
            if is_default(record["command"], algo, setting) for row in runs_of(record)]
    if not rows:
        return f"not recorded (`meta-train --tasks {setting} --algo {algo}`)"
    _, row = max(rows, key=lambda r: r[0])
    steps = default_config(algo, "glyphs", tasks=setting).steps
    earlier = (f"; the previous default, {row['steps']} steps"
               if str(row["steps"]) != str(steps) else "")
    return f"{row['accuracy (95% CI)']} ({row['CPU s']} CPU s{earlier})"


def settings_table(read: Records) -> str:
    """The table: one row per algorithm, one column per setting."""
    names = {"protonet": "ProtoNet", "maml": "MAML", "mamlpp": "MAML++"}
    columns = ["algorithm (default)", *SETTINGS]
    rows = [{"algorithm (default)": names[a], **{s: cell(read, a, s) for s in SETTINGS}}
            for a in ALGORITHMS]
    return markdown(columns, rows)


__all__ = ["ALGORITHMS", "SETTINGS", "SOURCES", "cell", "is_default", "settings_table"]
