"""The record tables of the results pages: named columns a reader takes in at a glance, the
full records one click away.

Three kinds of figures, each its own table (``block``):

- **runs** (a ``funcgraph`` training's held-out test line, as ``record_run.py`` records it, or
  a row ``tune confirm`` prints with its command and accuracy): algorithm, data set, tasks,
  accuracy with its 95% interval, steps, CPU seconds, seed, precision, commit, date and the
  command as a user types it (a scratch ``--out`` directory left out);
- **trials** (``tune show --json`` rows): trial, state, validation accuracy, step, CPU seconds,
  then one column per searched setting;
- **anything else** (a benchmark's JSON lines): one table per kind of row (rows with the same
  keys), the keys as columns, a nested dict's entries as ``key: entry`` columns.

Under the tables: the commands, the machines and the records themselves in a ``<details>``
block (JSON, one record per line), so every cell can be traced to what measured it.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Iterable
from typing import Any

RUN_COLUMNS = ("algorithm", "data set", "tasks", "accuracy (95% CI)", "steps", "CPU s", "seed",
               "precision", "commit", "date", "command")
TRIAL_COLUMNS = ("trial", "state", "val acc", "step", "CPU s")
COST = {"cpu_s", "wall_s"}


def options(command: str) -> dict[str, str]:
    """``--name value`` pairs of a command line (a flag without value maps to ``""``)."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    out: dict[str, str] = {}
    for i, word in enumerate(words):
        if word.startswith("--"):
            name, eq, value = word[2:].partition("=")
            nxt = words[i + 1] if i + 1 < len(words) else ""
            out[name] = value if eq else ("" if nxt.startswith("--") else nxt)
    return out


def user_command(command: str) -> str:
    """The command as a user would type it: without its ``--out DIR`` (a scratch directory
    of the run that recorded it), unless it continues a run (``--resume`` needs it)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return command
    if "--resume" in words:
        return command
    kept: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word == "--out":
            skip = True
        elif not word.startswith("--out="):
            kept.append(word)
    return shlex.join(kept)


def _number(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _cell(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_cell(v)}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(_cell(v) for v in value)
    return _number(value)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _short_date(record: dict[str, Any]) -> str:
    return str(record["date"])[:10]


def _short_commit(record: dict[str, Any]) -> str:
    return str(record["commit"])[:7] + (" (modified)" if record.get("dirty") else "")


def run_row(command: str, acc: float, ci: float | None, *, tasks: str | None,
            steps: int | None, cpu_s: float | None, seed: int | None,
            record: dict[str, Any]) -> dict[str, str]:
    """One training as a row of the runs table."""
    opts = options(command)
    dataset = opts.get("dataset", "glyphs")
    algo = opts.get("algo", "maml" if dataset == "sinusoid" else "protonet")
    if "image-size" in opts:
        dataset += f" {opts['image-size']}px"
    steps = steps if steps is not None else (int(opts["steps"]) if "steps" in opts else None)
    seed = seed if seed is not None else int(opts.get("seed", 0))
    interval = f"{100 * acc:.2f}%" + (f" ± {100 * ci:.2f}" if ci is not None else "")
    default_tasks = "10shot" if dataset == "sinusoid" else "5way1shot"  # meta-train's
    return {"algorithm": algo, "data set": dataset,
            "tasks": tasks or opts.get("tasks", default_tasks),
            "accuracy (95% CI)": interval, "steps": _number(steps), "CPU s": _number(
                None if cpu_s is None else round(cpu_s)),
            "seed": str(seed), "precision": opts.get("precision", "float32"),
            "commit": _short_commit(record), "date": _short_date(record),
            "command": f"`{user_command(command)}`"}


def runs_of(record: dict[str, Any]) -> list[dict[str, str]]:
    """The trainings a record holds: the rows ``tune confirm`` printed (each with its own
    command), else the record's own test line."""
    figures = record["figures"]
    rows = [f for f in figures if "command" in f and "acc" in f]
    if rows:
        return [run_row(f["command"], f["acc"], f.get("acc_ci95"), tasks=None, steps=None,
                        cpu_s=f.get("cpu_s"), seed=f.get("seed"), record=record) for f in rows]
    tests = [f for f in figures if "test_line" in f]
    if not tests:
        return []
    steps = next((f["metrics_test"].get("step") for f in figures if "metrics_test" in f), None)
    cost = next((f["cpu_s"] for f in figures if set(f) == COST), None)
    test = tests[-1]
    return [run_row(record["command"], test[test["metric"]], test.get(f"{test['metric']}_ci95"),
                    tasks=test.get("tasks"), steps=steps, cpu_s=cost, seed=None,
                    record=record)]


def _is_run_figure(figure: dict[str, Any]) -> bool:
    return ("test_line" in figure or "metrics_test" in figure or ("command" in figure
            and "acc" in figure) or "confirm" in figure)


def markdown(columns: Iterable[str], rows: Iterable[dict[str, str]]) -> str:
    cols = list(columns)
    lines = ["| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    for row in rows:
        lines.append("| " + " | ".join(str(row.get(c, "")).replace("|", "\\|")
                                       for c in cols) + " |")
    return "\n".join(lines) + "\n"


def trial_rows(records: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, str]]]:
    """The trials of ``tune show --json`` records: fixed columns, then each setting."""
    figures = [f for r in records for f in r["figures"] if "trial" in f and "state" in f]
    settings = sorted({k for f in figures for k in f.get("params", {})})
    rows = []
    for f in figures:
        row = {"trial": str(f["trial"]), "state": f["state"] + (
            f" ({f['reason']})" if f.get("reason") else ""),
            "val acc": "" if f.get("val_acc") is None else f"{100 * f['val_acc']:.2f}%",
            "step": str(f.get("step", "")), "CPU s": _number(round(f.get("cpu_s") or 0))}
        row.update({k: _number(v) for k, v in f.get("params", {}).items()})
        rows.append(row)
    return [*TRIAL_COLUMNS, *settings], rows


def _flat(figure: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as ``outer: inner`` columns (a benchmark's per-variant timings); the run
    configuration a row may carry (``config``) stays in the full record."""
    out: dict[str, Any] = {}
    for key, value in figure.items():
        if key == "config":
            continue
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}: "))
        else:
            out[f"{prefix}{key}"] = value
    return out


def figure_tables(records: list[dict[str, Any]]) -> list[str]:
    """The other figures, one table per kind of row (the same keys), with each row's CPU,
    record date and commit."""
    groups: dict[tuple[str, ...], list[dict[str, str]]] = {}
    for record in sorted(records, key=lambda r: r["date"], reverse=True):
        for figure in record["figures"]:
            if (_is_run_figure(figure) or "trial" in figure or "best_trial" in figure
                    or str(figure.get("bench", "")).startswith("darts_protocol")):
                continue
            if set(figure) == COST and len(record["figures"]) > 1:
                continue  # the cost of a run whose own figures are shown
            flat = _flat(figure)
            row = {k: _cell(v) for k, v in flat.items()}
            row.update(machine=record["machine"]["cpu"], date=_short_date(record),
                       commit=_short_commit(record),
                       command=f"`{user_command(record['command'])}`")
            groups.setdefault(tuple(flat), []).append(row)
    return [_with_constants([*keys, "machine", "date", "commit", "command"], rows)
            for keys, rows in groups.items()]


def _with_constants(columns: list[str], rows: list[dict[str, str]]) -> str:
    """A table without the columns that are the same in every row, those said in a line
    above it (``batch 32, clock cpu``), so the columns left are the ones that vary."""
    same = [c for c in columns if len(rows) > 1 and len({r.get(c, "") for r in rows}) == 1]
    varying = [c for c in columns if c not in same] or columns[:1]
    where = ("machine", "date", "commit", "command")
    varying.sort(key=lambda c: (c == "command") + (c in where) + all(
        _is_number(r.get(c, "")) for r in rows))  # names, then figures, then where from
    said = ", ".join(f"{c} {rows[0].get(c, '')}" for c in same
                     if c not in varying and c != "command")  # commands: listed below
    return (f"Every row: {said}.\n\n" if said else "") + markdown(varying, rows)


def protocol_tables(records: list[dict[str, Any]]) -> list[str]:
    """The DARTS protocol's records (``benchmarks/darts.py protocol``): per data set, the
    random cells' distribution against the searched cells' mean, then every cell's accuracy
    (the genotypes are in the full records)."""
    import statistics

    summary, cells = [], []
    for record in sorted(records, key=lambda r: r["date"]):
        rows = [f for f in record["figures"] if f.get("bench") == "darts_protocol"]
        done = next((f for f in record["figures"]
                     if f.get("bench") == "darts_protocol_summary"), None)
        if not rows or done is None:
            continue
        dataset = done["budget"].get("dataset", "glyphs")
        rand = [f["test_acc"] for f in rows if f["kind"] == "random"]
        searched = [f["test_acc"] for f in rows if f["kind"] == "searched"]
        q = statistics.quantiles(rand, n=4) if len(rand) > 1 else rand * 3
        names = [f["arch"] for f in rows if f["kind"] == "searched"]
        prefix = os.path.commonprefix(names) if len(names) > 1 else ""
        summary.append({
            "data set": dataset, "classes": str(done["budget"].get("classes")),
            "searched runs": f"{prefix}*" if prefix else ", ".join(names),
            "random cells": str(len(rand)), "random median": f"{100 * q[1]:.2f}%",
            "random 75th percentile": f"{100 * q[2]:.2f}%",
            "searched cells": str(len(searched)),
            "searched mean": f"{100 * statistics.fmean(searched):.2f}%",
            "searched under the random median": str(sum(a < q[1] for a in searched)),
            "date": _short_date(record), "commit": _short_commit(record)})
        cells += [{"data set": dataset, "cell": f["arch"], "kind": f["kind"],
                   "accuracy (mean of seeds)": f"{100 * f['test_acc']:.2f}%",
                   "per seed": ", ".join(f"{100 * a:.1f}%" for a in f["per_seed"]),
                   "percentile among random": "" if "percentile" not in f
                   else f"{f['percentile']:.0f}"} for f in rows]
    if not summary:
        return []
    return [markdown(list(summary[0]), summary), markdown(list(cells[0]), cells)]


def provenance(records: list[dict[str, Any]]) -> str:
    """The commands (as recorded), machines and torch versions, then the records in full."""
    newest = sorted(records, key=lambda r: r["date"], reverse=True)
    machines = sorted({f"{r['machine']['cpu']}, {r['machine']['cores']} cores"
                       + (f", {r['machine']['gpu']}" if r["machine"].get("gpu") else "")
                       + f"; torch {r['torch']}" for r in records})
    commands = list(dict.fromkeys(user_command(r["command"]) for r in newest))
    lines = ["", "Measured on: " + " / ".join(machines) + ".", ""]
    if len(commands) <= 3:
        lines += ["Commands: " + "; ".join(f"`{c}`" for c in commands) + ".", ""]
    lines += [f"<details><summary>The {len(records)} record(s) in full</summary>", "",
              "```json", *(json.dumps(r, sort_keys=True) for r in newest), "```", "",
              "</details>"]
    return "\n".join(lines) + "\n"


def block(records: list[dict[str, Any]]) -> str:
    """Everything between a page's ``records`` markers for these records."""
    if not records:
        return "No record yet.\n"
    parts = []
    runs = [row for r in sorted(records, key=lambda r: r["date"], reverse=True)
            for row in runs_of(r)]
    if runs:
        cols = [c for c in RUN_COLUMNS
                if c != "precision" or any(r["precision"] != "float32" for r in runs)]
        parts.append(markdown(cols, runs))
    trial_cols, trials = trial_rows(records)
    if trials:
        parts.append(markdown(trial_cols, trials))
    parts += protocol_tables(records)
    parts += figure_tables(records)
    return "\n".join(parts) + provenance(records)
