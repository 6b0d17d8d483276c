"""The README's "at a glance" table, generated from the records.

Between ``<!-- glance -->`` and ``<!-- end glance -->`` the README holds one row per entry of
:data:`GLANCE`: what was measured, the figure (the newest matching record; for several seeds
their mean and range) and the results page that holds the records. An entry picks its runs by
record file and command options, so a new record of the same command moves the README with it.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from results_tables import options, runs_of

Records = Callable[[str], list[dict[str, Any]]]
GLANCE_BLOCK = re.compile(r"(<!-- glance -->\n)(.*?)(<!-- end glance -->)", re.S)
META = "docs/results/meta-learning.md"


@dataclass(frozen=True)
class Runs:
    """Test accuracy of the runs in ``names`` whose command has ``want``'s options (``None``:
    absent) on ``dataset``: the newest run, or with ``seeds`` the mean over those seeds."""

    label: str
    names: tuple[str, ...]
    dataset: str
    want: dict[str, str | None] = field(default_factory=dict)
    seeds: tuple[int, ...] = ()

    def matches(self, row: dict[str, str]) -> bool:
        opts = options(row["command"].strip("`"))
        return row["data set"] == self.dataset and row["precision"] == "float32" and all(
            opts.get(k) == v if v is not None else k not in opts for k, v in self.want.items())

    def figure(self, read: Records) -> str | None:
        rows = [row for name in self.names for record in read(name) for row in runs_of(record)
                if self.matches(row)]
        rows.sort(key=lambda r: r["date"], reverse=True)
        if not self.seeds:
            if not rows:
                return None
            return f"{rows[0]['accuracy (95% CI)']} in {rows[0]['CPU s']} CPU s"
        by_seed = {}
        for row in rows:  # the newest run of each seed
            by_seed.setdefault(int(row["seed"]), row)
        if not all(s in by_seed for s in self.seeds):
            return None
        accs = [float(by_seed[s]["accuracy (95% CI)"].split("%")[0]) for s in self.seeds]
        return (f"{statistics.fmean(accs):.2f}% (seeds {min(self.seeds)}-{max(self.seeds)}: "
                f"{min(accs):.2f} to {max(accs):.2f})")


@dataclass(frozen=True)
class Speed:
    """One meta-step's speed-up: funcgraph's fastest variant (among those named ``ours``, or
    all) over the row named exactly ``against`` in the newest ``meta_step`` record that has
    both at ``queries`` queries per class."""

    label: str
    queries: int
    against: str
    ours: tuple[str, ...] = ()

    def figure(self, read: Records) -> str | None:
        for record in sorted(read("meta_step"), key=lambda r: r["date"], reverse=True):
            rows = {f["variant"]: f["s_per_step"] for f in record["figures"]
                    if "variant" in f and f.get("config", {}).get("queries") == self.queries}
            other = rows.get(self.against)
            ours = {v: s for v, s in rows.items() if v.startswith("funcgraph") and (
                not self.ours or v in self.ours)}
            if other and ours:
                best = min(ours, key=ours.__getitem__)
                return f"{other / ours[best]:.2f}x ({best.removeprefix('funcgraph ')})"
        return None


GLANCE: tuple[tuple[Runs | Speed, str], ...] = (
    (Runs("The README's run: ProtoNet, glyphs 5-way 1-shot", ("readme",), "glyphs"), META),
    (Runs("MAML++ default, glyphs (`meta-train --tasks 5way1shot --algo mamlpp`)",
          ("meta-learning",), "glyphs", {"algo": "mamlpp", "steps": None, "threads": None}),
     META),
    (Runs("MAML++ default on the confirmation set (rgb-shapes 28 px, not tuned on but seen "
          "by the choice of default; "
          "`meta-train --algo mamlpp`, seed 0)", ("confirmation",), "rgb-shapes 28px",
          {"algo": "mamlpp", "steps": None, "seed": "0"}), META),
    (Runs("ProtoNet default on the confirmation set", ("confirmation",), "rgb-shapes 28px",
          {"algo": "protonet", "steps": None}, (0, 1, 2)), META),
    (Runs("MAML default on the confirmation set", ("confirmation",), "rgb-shapes 28px",
          {"algo": "maml", "steps": None}, (0, 1, 2)), META),
    (Runs("MAML at about the tuned MAML++'s CPU time on the confirmation set (`--steps 1600`)",
          ("confirmation",), "rgb-shapes 28px", {"algo": "maml", "steps": "1600"}, (0, 1, 2)),
     META),
    (Speed("One MAML meta-step (conv4, 32 tasks, one thread), 15 queries per class: speed-up "
           "over a clone-and-adapt loop",
           15, "baseline (clone-and-adapt loop)"), META),
    (Speed("The same meta-step: speed-up over `higher`", 15,
           "higher (innerloop_ctx, installed)"), META),
    (Speed("The same at 1 query per class (the meta-train default)",
           1, "baseline (clone-and-adapt loop)"), META),
)


def glance_table(read: Records) -> str:
    rows = ["| measured | figure | records |", "| --- | --- | --- |"]
    for entry, page in GLANCE:
        value = entry.figure(read)
        if value is not None:
            rows.append(f"| {entry.label} | {value} | [{page.split('/')[-1]}]({page}) |")
    return "\n".join(rows) + "\n"


def render_glance(text: str, read: Records) -> str:
    return GLANCE_BLOCK.sub(lambda m: m[1] + glance_table(read) + m[3], text)
