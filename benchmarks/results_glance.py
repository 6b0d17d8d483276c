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


def _measured_at(record: dict[str, Any], figure: dict[str, Any], queries: int, conv4: str,
                 threads: int | None) -> bool:
    """Whether a ``meta_step`` figure row was measured at ``queries`` queries per class on
    conv4's ``conv4`` variant (records before ``--variant`` existed are the pooled one) with
    ``threads`` CPU threads (the command's ``OMP_NUM_THREADS``; ``None``: any)."""
    config = figure.get("config", {})
    given = re.match(r"OMP_NUM_THREADS=(\d+) ", record["command"])
    return bool(config.get("queries") == queries and config.get("variant", "pool") == conv4
                and (threads is None or (given is not None and int(given[1]) == threads)))


@dataclass(frozen=True)
class Speed:
    """One meta-step's speed-up: funcgraph's fastest variant (among those named ``ours``, or
    all float32 ones) over the row named exactly ``against`` in the newest ``meta_step``
    record that has both at ``queries`` queries per class."""

    label: str
    queries: int
    against: str
    ours: tuple[str, ...] = ()
    conv4: str = "pool"
    """conv4's variant in the record's config (``--variant``)."""
    threads: int | None = None
    """The record's CPU threads (``None``: any)."""

    def figure(self, read: Records) -> str | None:
        for record in sorted(read("meta_step"), key=lambda r: r["date"], reverse=True):
            rows = {f["variant"]: f["s_per_step"] for f in record["figures"]
                    if "variant" in f and _measured_at(record, f, self.queries, self.conv4,
                                                       self.threads)}
            other = rows.get(self.against)
            # unless named: funcgraph's conv4 in float32
            ours = {v: s for v, s in rows.items() if v.startswith("funcgraph") and (
                v in self.ours if self.ours else not {"bf16", "module"} & set(v.split("+")[1:]))}
            if other and ours:
                best = min(ours, key=ours.__getitem__)
                return f"{other / ours[best]:.2f}x ({best.removeprefix('funcgraph ')})"
        return None


@dataclass(frozen=True)
class Split:
    """Where the speed-up of funcgraph's variant ``ours`` at ``queries`` comes from: conv4's
    rewrites (the baseline on funcgraph's conv4) and the engine (the rest), from the newest
    ``meta_step`` record that splits it."""

    label: str
    queries: int
    ours: str
    conv4: str = "pool"
    """conv4's variant in the record's config (``--variant``)."""
    threads: int | None = None
    """The record's CPU threads (``None``: any)."""

    def figure(self, read: Records) -> str | None:
        for record in sorted(read("meta_step"), key=lambda r: r["date"], reverse=True):
            for f in record["figures"]:
                if f.get("split_of") == self.ours and any(
                        _measured_at(record, g, self.queries, self.conv4, self.threads)
                        for g in record["figures"]):
                    return (f"{f['speedup_vs_baseline']:.2f}x = {f['rewrites']:.2f}x from "
                            f"conv4's rewrites * {f['machinery']:.2f}x from the engine")
        return None


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


GLANCE: tuple[tuple[Runs | Speed | Split | Settings, str], ...] = (
    (Runs("The README's run: ProtoNet, glyphs 5-way 1-shot", ("readme",), "glyphs"), META),
    (Runs("MAML++ default, glyphs (`meta-train --tasks 5way1shot --algo mamlpp`, seed 0)",
          ("meta-learning",), "glyphs", {"algo": "mamlpp", "steps": None, "seed": "0"},
          steps=MAMLPP_META_STEPS), META),
    (Runs("ProtoNet default, glyphs 5-way 1-shot, three seeds", ("readme", "meta-learning"),
          "glyphs", {"steps": None}, (0, 1, 2), "protonet", "5way1shot"), META),
    (Runs("MAML++ default, glyphs 5-way 1-shot, three seeds", ("meta-learning",), "glyphs",
          {"steps": None, "first-order-until": None}, (0, 1, 2), "mamlpp", "5way1shot",
          MAMLPP_META_STEPS), META),
    (Runs("The previous MAML++ default (1,596 steps), glyphs 5-way 1-shot, three seeds",
          ("meta-learning",), "glyphs", {"steps": None, "first-order-until": None}, (0, 1, 2),
          "mamlpp", "5way1shot", 1596), META),
    (Runs("The previous MAML++ default (1,596 steps) on the confirmation set (rgb-shapes "
          "28 px, not tuned on but seen by the choice of that default; seed 0)",
          ("confirmation",), "rgb-shapes 28px", {"algo": "mamlpp", "steps": None, "seed": "0"},
          steps=1596), META),
    (Runs("ProtoNet default on the confirmation set", ("confirmation",), "rgb-shapes 28px",
          {"algo": "protonet", "steps": None}, (0, 1, 2)), META),
    (Runs("MAML default on the confirmation set", ("confirmation",), "rgb-shapes 28px",
          {"algo": "maml", "steps": None}, (0, 1, 2)), META),
    (Runs("MAML++ default on the fresh confirmation set (patterns, seen by no choice)",
          ("confirmation-patterns",), "patterns", {"algo": "mamlpp"}, (0, 1, 2),
          steps=MAMLPP_META_STEPS), META),
    (Runs("The previous MAML++ default (1,596 steps) on patterns", ("confirmation-patterns",),
          "patterns", {"algo": "mamlpp"}, (0, 1, 2), steps=1596), META),
    (Runs("ProtoNet default on patterns", ("confirmation-patterns",), "patterns",
          {"algo": "protonet"}, (0, 1, 2)), META),
    (Runs("MAML default on patterns", ("confirmation-patterns",), "patterns",
          {"algo": "maml", "steps": None}, (0, 1, 2)), META),
    (Runs("MAML at about the MAML++ default's CPU time on glyphs (`--steps 2200`, seed 0)",
          ("meta-learning",), "glyphs", {"algo": "maml", "steps": "2200", "seed": "0"}), META),
    (Runs("MAML at about the MAML++ default's CPU time on patterns (`--steps 2200`)",
          ("confirmation-patterns",), "patterns", {"algo": "maml", "steps": "2200"}, (0, 1, 2)),
     META),
    (Runs("MAML at about the previous MAML++ default's CPU time on patterns (`--steps 1300`)",
          ("confirmation-patterns",), "patterns", {"algo": "maml", "steps": "1300"}, (0, 1, 2)),
     META),
    (Runs("MAML at about the previous MAML++ default's CPU time on the confirmation set "
          "(`--steps 1600`)",
          ("confirmation",), "rgb-shapes 28px", {"algo": "maml", "steps": "1600"}, (0, 1, 2)),
     META),
    (Settings("ProtoNet, MAML and MAML++ defaults on glyphs in the four standard settings "
              "(5-way and 20-way, 1-shot and 5-shot)"),
     META + "#the-four-standard-settings"),
    (Speed("One MAML meta-step (conv4, 32 tasks, one thread, CPU time), 15 queries per class: "
           "speed-up over a clone-and-adapt loop",
           15, "baseline (clone-and-adapt loop)", threads=1), META),
    (Speed("At 15 queries, the same conv4 written as a plain `nn.Module`, "
           "`meta.maml(module)`", 15, "baseline (clone-and-adapt loop)",
           ("funcgraph auto+module",), threads=1), META),
    (Speed("At 15 queries in bfloat16 (`precision=\"bf16\"`; the record's AMD EPYC: AVX-512 BF16, "
           "no AMX)", 15, "baseline (clone-and-adapt loop)", ("funcgraph auto+bf16",),
           threads=1), META),
    (Speed("The same meta-step: speed-up over `higher`", 15,
           "higher (innerloop_ctx, installed)", threads=1), META),
    (Speed("The same at 1 query per class (meta-train's default query count)",
           1, "baseline (clone-and-adapt loop)", threads=1), META),
    (Split("At 1 query, funcgraph's conv4 (`strategy=\"auto\"`: vmap, 16 tasks at a time): "
           "the model's part and the engine's", 1, "funcgraph auto", threads=1), META),
    (Speed("At 1 query, the same conv4 written as a plain `nn.Module`, `meta.maml(module)`",
           1, "baseline (clone-and-adapt loop)", ("funcgraph auto+module",), threads=1), META),
    (Speed("At 1 query, `maml(module)` with the meta-step compiled (`compile=True`)",
           1, "baseline (clone-and-adapt loop)", ("funcgraph vmap+module+compile",),
           threads=1), META),
    (Speed("The pooled conv4 step at two threads, wall clock, 1 query: `maml(module)`", 1,
           "baseline (clone-and-adapt loop)", ("funcgraph auto+module",), threads=2), META),
    (Speed("The same at two threads, 15 queries: `maml(module)`", 15,
           "baseline (clone-and-adapt loop)", ("funcgraph auto+module",), threads=2), META),
    (Speed("The same at two threads, 15 queries: funcgraph's conv4, float32", 15,
           "baseline (clone-and-adapt loop)", threads=2), META),
    (Speed("meta-train's own default step (strided conv4, 1 query, two threads, "
           "`strategy=\"auto\"`)", 1, "baseline (clone-and-adapt loop)", ("funcgraph auto",),
           "strided", threads=2), META),
    (Speed("The same strided conv4 as a plain `nn.Module`, `meta.maml(module)`", 1,
           "baseline (clone-and-adapt loop)", ("funcgraph auto+module",), "strided",
           threads=2), META),
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
