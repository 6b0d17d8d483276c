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

from funcgraph.meta.settings import MAMLPP_META_STEPS

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
    algorithm: str | None = None
    """The row's algorithm (``--algo``, or meta-train's default where the command names none)."""
    tasks: str | None = None
    steps: int | None = None
    """The run's steps (its record's ``steps`` column), to tell one default from another."""

    def matches(self, row: dict[str, str]) -> bool:
        opts = options(row["command"].strip("`"))
        if (self.algorithm is not None and row["algorithm"] != self.algorithm) or (
                self.tasks is not None and row["tasks"] != self.tasks) or (
                self.steps is not None and str(row["steps"]) != str(self.steps)):
            return False
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
class Settings:
    """The four standard settings table (``benchmarks/results_settings.py``): how many of its
    cells have records."""

    label: str

    def figure(self, read: Records) -> str | None:
        from results_settings import ALGORITHMS, SETTINGS, cell

        cells = [cell(read, a, s) for a in ALGORITHMS for s in SETTINGS]
        done = sum(not c.startswith("not recorded") for c in cells)
        earlier = sum("the previous default" in c for c in cells)
        return (f"{done} of {len(cells)} cells recorded" + (
            f", {earlier} of them at an algorithm's previous default" if earlier else "")
                ) if done else None


@dataclass(frozen=True)
class Versus:
    """Two ``Runs`` side by side: ``first``'s figure against ``second``'s."""

    label: str
    first: Runs
    second: Runs

    def figure(self, read: Records) -> str | None:
        a, b = self.first.figure(read), self.second.figure(read)
        if a is None or b is None:
            return None
        return f"{self.first.label} {a} against {self.second.label} {b}"


@dataclass(frozen=True)
class Edge:
    """The newest ``edge_latency`` record: the AOTInductor program's speed-up over the eager
    model at batch 1, per model."""

    label: str

    def figure(self, read: Records) -> str | None:
        records = sorted(read("edge_latency"), key=lambda r: r["date"], reverse=True)
        if not records:
            return None
        rows = [f for f in records[0]["figures"] if f.get("batch") == 1
                and f.get("case") in ("-", "exit 0.50")]
        return ", ".join(f"{f['model']} {f['aoti_speedup']:.2f}x" for f in rows) or None


@dataclass(frozen=True)
class Darts:
    """The newest ``darts`` protocol record: searched cells' mean test accuracy and
    percentiles among the random cells trained alike."""

    label: str

    def figure(self, read: Records) -> str | None:
        for record in sorted(read("darts"), key=lambda r: r["date"], reverse=True):
            for f in record["figures"]:
                if f.get("bench") == "darts_protocol_summary":
                    searched = [s["test_acc"] for s in f["searched"]]
                    ranks = sorted(s["percentile"] for s in f["searched"])
                    return (f"{100 * statistics.fmean(searched):.2f}% (searched, "
                            f"{len(searched)} seeds) against {100 * f['random']['mean']:.2f}% "
                            f"({f['random']['n']} random cells; {f['budget']['dataset']}); "
                            f"searched cells' percentiles {', '.join(f'{r:.0f}' for r in ranks)}")
        return None


@dataclass(frozen=True)
class Study:
    """The newest ``tune show --json`` record of study ``name``: trials, the best validation
    accuracy and the CPU hours over every attempt."""

    label: str
    name: str

    def figure(self, read: Records) -> str | None:
        records = sorted(read(self.name), key=lambda r: r["date"], reverse=True)
        trials = [f for f in records[0]["figures"] if "trial" in f] if records else []
        done = [f for f in trials if f.get("state") == "complete" and f.get("val_acc")]
        if not done:
            return None
        best = max(done, key=lambda f: f["val_acc"])
        cpu_h = sum(f.get("cpu_s") or 0.0 for f in trials) / 3600
        return (f"best of {len(trials)} trials: validation {100 * best['val_acc']:.2f}% "
                f"(trial {best['trial']}), {cpu_h:.1f} CPU h in all")


@dataclass(frozen=True)
class Peers:
    """funcgraph's ``ours`` against the real learn2learn in the newest ``peers`` record
    (``benchmarks/peers.py``) at ``queries`` and ``threads`` with glibc's default allocator on
    both sides: the ratio of medians, each side's median and quartiles, the CPU, and the share
    of the step's op-limit."""

    label: str
    queries: int
    threads: int
    ours: str = "funcgraph-module"
    memory: bool = False
    """The processes' peak resident memory (medians over rounds) instead of the time."""

    def figure(self, read: Records) -> str | None:
        for record in sorted(read("peers"), key=lambda r: r["date"], reverse=True):
            rows = {f["implementation"]: f for f in record["figures"]
                    if "wall_s_median" in f and f["queries"] == self.queries
                    and f["threads"] == self.threads and f.get("malloc") == "default"}
            ours, peer = rows.get(self.ours), rows.get("learn2learn")
            if ours and peer and self.memory:
                mine, theirs = ours["peak_rss_mb_median"], peer["peak_rss_mb_median"]
                return (f"{mine:.0f} MB against learn2learn's {theirs:.0f} MB "
                        f"({mine / theirs:.2f}x; whole processes, {ours['cpu']})")
            if ours and peer:
                def spread(f: dict[str, Any]) -> str:
                    return (f"{f['wall_s_median']:.3f} s [{f['wall_s_q1']:.3f}, "
                            f"{f['wall_s_q3']:.3f}]")
                return (f"{ours['speedup_vs_learn2learn']:.2f}x: {spread(ours)} against "
                        f"learn2learn {spread(peer)} (median [quartiles], {ours['rounds']} "
                        f"rounds; {ours['cpu']}; {ours['pct_of_op_limit']:.0f}% of the step's "
                        f"op-limit)")
        return None


Entry = Peers | Runs | Settings | Versus | Edge | Darts | Study
GLANCE: tuple[tuple[Entry, str], ...] = (
    (Runs("The README's run: ProtoNet, glyphs 5-way 1-shot", ("readme",), "glyphs"), META),
    (Versus("MAML++ against ProtoNet at their defaults on patterns, a set no choice saw "
            "(5-way 1-shot, three seeds)",
            Runs("MAML++", ("confirmation-patterns",), "patterns", {"algo": "mamlpp"},
                 (0, 1, 2), steps=MAMLPP_META_STEPS),
            Runs("ProtoNet", ("confirmation-patterns",), "patterns", {"algo": "protonet"},
                 (0, 1, 2))), META),
    (Versus("MAML++ against ProtoNet at their defaults on glyphs 5-way 1-shot (three seeds)",
            Runs("MAML++", ("meta-learning",), "glyphs",
                 {"steps": None, "first-order-until": None}, (0, 1, 2), "mamlpp",
                 "5way1shot", MAMLPP_META_STEPS),
            Runs("ProtoNet", ("readme", "meta-learning"), "glyphs", {"steps": None},
                 (0, 1, 2), "protonet", "5way1shot")), META),
    (Settings("ProtoNet, MAML and MAML++ defaults on glyphs in the four standard settings "
              "(5-way and 20-way, 1-shot and 5-shot)"),
     META + "#the-four-standard-settings"),
    (Peers("One second-order MAML meta-step of your own `nn.Module` through "
           "`meta.maml(module)` against the real learn2learn 0.2.0 (`MAML.clone().adapt`): pooled "
           "conv4, 5-way 1-shot, 32 tasks, 1 query, two threads, glibc's default allocator on "
           "every side", 1, 2), META + "#against-the-real-peers"),
    (Peers("The same at 15 queries per class", 15, 2), META + "#against-the-real-peers"),
    (Peers("Peak memory of that step at 1 query", 1, 2, memory=True),
     META + "#against-the-real-peers"),
    (Edge("Export for the edge: the AOTInductor-compiled `torch.export` program against the "
          "eager model, batch 1"), "docs/results/benchmarks.md"),
    (Darts("DARTS: searched cells against random cells trained alike"),
     "docs/results/darts.md"),
    (Study("Settings search (`funcgraph tune`, Optuna): the MAML++ study that chose today's "
           "default", "tune-mamlpp-narrow"),
     META + "#settings-search-the-second-narrower-study"),
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
