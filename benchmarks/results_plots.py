"""The plots of the results pages, drawn from the records (``results/*.jsonl``).

Each plot is a function of the records it names; ``python benchmarks/results_pages.py``
redraws a plot whenever what it would draw changed, and stores a digest of that data in the
PNG's text chunk (``funcgraph-data``), so ``--check`` (and ``tests/test_records.py``) finds a
plot that its records no longer give without comparing pixels across matplotlib versions.

- ``accuracy_glyphs.png``, ``accuracy_rgb-shapes.png``: each training's test accuracy (with
  its 95% interval) against its CPU seconds, one colour per algorithm, float32 runs of the
  5-way 1-shot benchmark on glyphs and on the confirmation set (rgb-shapes at 28 px);
- ``meta_step.png``: one meta-step's time per variant (funcgraph's strategies against the
  clone-and-adapt baseline and ``higher``), per recorded configuration;
- ``darts_protocol.png``: held-out accuracy of the searched cells against random cells of the
  same space, per proxy data set.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from results_tables import options, runs_of

Records = Callable[[str], list[dict[str, Any]]]
KEY = "funcgraph-data"


def _accuracy_points(read: Records, names: tuple[str, ...], dataset: str) -> list[dict[str, Any]]:
    points = []
    for name in names:
        for record in read(name):
            for row in runs_of(record):
                if (row["data set"] == dataset and row["tasks"] in ("5way1shot", "")
                        and row["precision"] == "float32" and row["CPU s"] != "None"):
                    acc, _, ci = row["accuracy (95% CI)"].partition(" ± ")
                    steps = options(row["command"].strip("`")).get("steps")
                    label = row["algorithm"] + (f" --steps {steps}" if steps else
                                                f" (defaults at {row['commit'][:7]})")
                    points.append({"algorithm": label, "cpu_s": float(row["CPU s"]),
                                   "acc": float(acc.rstrip("%")), "ci": float(ci or 0),
                                   "seed": row["seed"]})
    return sorted(points, key=lambda p: (p["algorithm"], p["cpu_s"], p["acc"]))


def accuracy_data(dataset: str, names: tuple[str, ...]) -> Callable[[Records], Any]:
    return lambda read: _accuracy_points(read, names, dataset)


MARKERS = "osD^v<>phP*X"


def draw_accuracy(ax: Any, points: list[dict[str, Any]], title: str) -> None:
    import matplotlib

    colours = matplotlib.colormaps["tab20"].colors  # 20 colours, and a marker each: no twins
    for i, algo in enumerate(sorted({p["algorithm"] for p in points})):
        mine = [p for p in points if p["algorithm"] == algo]
        ax.errorbar([p["cpu_s"] for p in mine], [p["acc"] for p in mine],
                    yerr=[p["ci"] for p in mine], fmt=MARKERS[i % len(MARKERS)],
                    color=colours[i % len(colours)], capsize=3, label=algo)
    ax.set_xlabel("CPU seconds of the training")
    ax.set_ylabel("test accuracy, % (95% CI)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def meta_step_data(read: Records) -> list[dict[str, Any]]:
    out = []
    for record in read("meta_step"):
        rows = [f for f in record["figures"] if "variant" in f and "s_per_step" in f]
        if rows:
            config = rows[0].get("config", {})
            out.append({"label": f"{config.get('queries')} query, {config.get('variant')} "
                                 f"({record['date'][:10]})",
                        "rows": [(f["variant"], f["s_per_step"], f["speedup_vs_baseline"])
                                 for f in rows]})
    return out


def draw_meta_step(fig: Any, data: list[dict[str, Any]]) -> None:
    axes = fig.subplots(len(data), 1, squeeze=False)[:, 0]
    for ax, part in zip(axes, data, strict=True):
        names = [r[0] for r in part["rows"]]
        ax.barh(names, [r[1] for r in part["rows"]], color="tab:blue")
        for i, (_, seconds, speedup) in enumerate(part["rows"]):
            ax.text(seconds, i, f" {speedup:.2f}x", va="center", fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("seconds per meta-step (median)")
        ax.set_title(part["label"], fontsize=9)


def darts_data(read: Records) -> list[dict[str, Any]]:
    out = []
    for record in read("darts"):
        rows = [f for f in record["figures"] if f.get("bench") == "darts_protocol"]
        summary = next((f for f in record["figures"]
                        if f.get("bench") == "darts_protocol_summary"), None)
        if rows and summary:
            dataset = summary["budget"].get("dataset", "glyphs")
            out.append({"dataset": dataset, "date": record["date"][:10],
                        "random": sorted(r["test_acc"] for r in rows if r["kind"] == "random"),
                        "searched": [(r["arch"], r["test_acc"]) for r in rows
                                     if r["kind"] == "searched"]})
    return out


def draw_darts(fig: Any, data: list[dict[str, Any]]) -> None:
    import statistics

    axes = fig.subplots(1, len(data), squeeze=False)[0]
    for ax, part in zip(axes, data, strict=True):
        rand = part["random"]
        ax.scatter([0] * len(rand), [100 * a for a in rand], color="tab:gray", label="random")
        ax.scatter([1] * len(part["searched"]), [100 * a for _, a in part["searched"]],
                   color="tab:red", label="searched")
        q = statistics.quantiles(rand, n=4) if len(rand) > 1 else rand * 3
        for y, style in ((q[1], "--"), (q[2], ":")):
            ax.axhline(100 * y, color="tab:gray", linestyle=style, linewidth=0.8)
        mean = statistics.fmean(a for _, a in part["searched"])
        ax.plot([0.8, 1.2], [100 * mean] * 2, color="tab:red", linewidth=2)
        ax.set_xticks([0, 1], ["random cells", "searched cells"])
        ax.set_xlim(-0.6, 1.6)
        ax.set_ylabel("held-out test accuracy, % (mean of seeds)")
        ax.set_title(f"{part['dataset']} ({part['date']})", fontsize=9)
    fig.suptitle("random cells' median (dashed) and 75th percentile (dotted); "
                 "red bar: searched mean", fontsize=9)


PLOTS: dict[str, tuple[Callable[[Records], Any], Callable[[Any, Any], None]]] = {
    "accuracy_glyphs.png": (
        accuracy_data("glyphs", ("readme", "meta-learning")),
        lambda fig, d: draw_accuracy(fig.subplots(), d, "glyphs, 5-way 1-shot")),
    "accuracy_rgb-shapes.png": (
        accuracy_data("rgb-shapes 28px", ("confirmation", "tune-confirm")),
        lambda fig, d: draw_accuracy(fig.subplots(), d,
                                     "confirmation set: rgb-shapes 28 px, 5-way 1-shot")),
    "meta_step.png": (meta_step_data, draw_meta_step),
    "darts_protocol.png": (darts_data, draw_darts),
}


def digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def stored_digest(path: Path) -> str | None:
    """The data digest a plot was drawn from, or ``None`` for a missing or foreign file."""
    if not path.is_file():
        return None
    from PIL import Image

    with Image.open(path) as image:
        return image.info.get(KEY)


def stale_plots(folder: Path, read: Records) -> list[tuple[Path, Any]]:
    """The plots whose data changed (or that are missing) with that data; a plot with no
    data yet is not drawn."""
    out = []
    for name, (data_of, _) in PLOTS.items():
        data = data_of(read)
        if data and stored_digest(folder / name) != digest(data):
            out.append((folder / name, data))
    return out


def draw(path: Path, data: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5 if path.name != "meta_step.png" else 2.5 * len(data)),
                 layout="constrained")
    PLOTS[path.name][1](fig, data)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata={KEY: digest(data)})
