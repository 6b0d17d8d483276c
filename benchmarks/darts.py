"""DARTS on the CPU proxy: search cost per mode, and searched vs random architectures.

Three parts, each printing a table and one JSON line per row:

``python benchmarks/darts.py cost [--steps 4]``
    Search-step cost of first order, second order (exact hypergradient), second order
    (finite difference) and partial channels (PC-DARTS, k=4, first order) on the default proxy.
    Each mode runs in a fresh subprocess (so peak memory is its own): one warm-up step, then
    ``--steps`` timed steps. Reported: CPU seconds per step (``time.process_time``, robust to
    other processes sharing the cores), wall seconds per step, the peak resident set size
    (``ru_maxrss``) above the RSS before the first step, and the default search's time
    extrapolated from the CPU cost. Ratios are against first order in the same run.

``python benchmarks/darts.py accuracy [--search-dir DIR] [--train-steps 200] [--seeds 2]``
    Runs the default search (or reuses the genotype in ``DIR``), samples three random
    architectures from the same space, trains each discrete network from scratch with the
    same budget on held-out glyph classes (the evaluation split: characters the search never
    saw, train half / test half) and reports test accuracy, mean over ``--seeds`` training
    seeds, searched vs the mean of the random ones.

``python benchmarks/darts.py protocol RUN_OR_GENOTYPE... [--random 8] [--train-steps 200]``
    The evaluation protocol (docs/darts.md): the searched genotypes (genotype.json files or
    search run directories) and ``--random`` random genotypes of the same space
    (``random_genotype(key(100 + i))``, ``--space`` for a space file) are retrained with the
    same budget and seeds on the held-out classes, as ``accuracy`` does; printed are the
    random cells' distribution (mean, std, min, max, seed-to-seed sd) and each searched
    cell's accuracy and percentile among them, drawn to ``--plot`` (PNG).

Both ``accuracy`` and ``protocol`` keep every (genotype, budget, seed, data) accuracy in one
JSON cache file (``--cache``), so a rerun trains only what is new.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from funcgraph import random
from funcgraph.errors import FuncgraphError
from funcgraph.files import atomic_write
from funcgraph.model import Model
from funcgraph.nas import (
    PRIMITIVES,
    BilevelConfig,
    Genotype,
    SearchConfig,
    SearchData,
    build_search_model,
    epoch_batches,
    is_arch,
    load_space,
    make_search_step,
    network_from_genotype,
    random_genotype,
    supernet_accuracy,
)
from funcgraph.params import partition
from funcgraph.runs import class_halves, run_search
from funcgraph.train import cosine_lr, sgd

MODES: dict[str, dict[str, Any]] = {
    "first": {"bilevel": BilevelConfig(order="first")},
    "second-exact": {"bilevel": BilevelConfig(order="second", hypergradient="exact")},
    "second-fd": {"bilevel": BilevelConfig(order="second", hypergradient="finite-difference")},
    "partial-k4": {"bilevel": BilevelConfig(order="first"), "partial_channels": 4},
}


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def cost_one(mode: str, steps: int) -> dict[str, Any]:
    """Time ``steps`` search steps of ``mode`` in this process (after one warm-up step)."""
    data = class_halves()
    cfg = SearchConfig(**MODES[mode])
    model = build_search_model(cfg, data)
    params, state = model.init(random.key(0))
    arch, weights = partition(params, is_arch)
    b = cfg.bilevel
    groups = {"weights": weights, "arch": arch, "state": state,
              "opt_w": b.weight_optimizer().init(weights), "opt_a": b.arch_optimizer().init(arch)}
    per_epoch, batch = epoch_batches(data, cfg.batch_size, cfg.seed)
    total = cfg.epochs * per_epoch
    step = make_search_step(model, cfg, batch, total)
    base = _rss_mb()
    groups, _ = step(0, groups)
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(1, steps + 1):
        groups, _ = step(i, groups)
    cpu_s = (time.process_time() - cpu) / steps
    wall_s = (time.perf_counter() - wall) / steps
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"mode": mode, "cpu_s_per_step": cpu_s, "wall_s_per_step": wall_s,
            "peak_rss_above_base_mb": peak - base, "peak_rss_mb": peak,
            "threads": torch.get_num_threads(), "default_steps": total,
            "default_search_cpu_min": cpu_s * total / 60}


def cost(steps: int) -> None:
    rows = []
    for mode in MODES:
        out = subprocess.run([sys.executable, __file__, "_cost_one", mode, str(steps)],
                             check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    base = rows[0]
    print(f"{'mode':<14}{'cpu s/step':>11}{'x first':>9}{'wall s/step':>12}"
          f"{'peak MB':>9}{'x first':>9}{'search min':>11}")
    for r in rows:
        r["cpu_ratio"] = r["cpu_s_per_step"] / base["cpu_s_per_step"]
        r["mem_ratio"] = r["peak_rss_above_base_mb"] / base["peak_rss_above_base_mb"]
        print(f"{r['mode']:<14}{r['cpu_s_per_step']:>11.2f}{r['cpu_ratio']:>9.2f}"
              f"{r['wall_s_per_step']:>12.2f}{r['peak_rss_above_base_mb']:>9.0f}"
              f"{r['mem_ratio']:>9.2f}{r['default_search_cpu_min']:>11.1f}")
    for r in rows:
        print(json.dumps({"bench": "darts_cost", **r}))


def train_discrete(model: Model, data: SearchData, *, steps: int, seed: int,
                   batch_size: int = 32, lr: float = 0.05) -> float:
    """Train from scratch (SGD momentum 0.9, wd 3e-4, cosine) on ``train_*``; test accuracy on
    ``val_*``. The same budget for every architecture."""
    params, state = model.init(random.key(seed))
    opt = sgd(lr, momentum=0.9, weight_decay=3e-4)
    opt_state = opt.init(params)
    n = data.train_x.shape[0]
    root = random.fold_in(random.key(seed), 7)

    def loss(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> Any:
        logits, new_state = model.apply(p, state, x, train=True)
        return F.cross_entropy(logits, y), new_state

    for i in range(steps):
        idx = random.permutation(random.fold_in(root, i), n)[:batch_size]
        g, state = torch.func.grad(loss, has_aux=True)(params, data.train_x[idx],
                                                      data.train_y[idx])
        params, opt_state = opt.update(params, g, opt_state, lr=cosine_lr(lr, i, steps))
    return supernet_accuracy(model, params, state, data.val_x, data.val_y)


@dataclass(frozen=True)
class Budget:
    """What every architecture gets when it is retrained: the discrete network's size, the
    training steps and the held-out data (the dataset's test split: classes the search never
    saw, glyphs' evaluation alphabets, each class's images halved into train and test),
    trained once per seed."""

    dataset: str = "glyphs"
    train_steps: int = 200
    classes: int = 20
    seeds: int = 2
    C: int = 8
    layers: int = 5
    batch_size: int = 32
    lr: float = 0.05
    image_size: int = 16

    def cache_key(self, genotype: Genotype, seed: int) -> str:
        """Canonical JSON of everything one training's accuracy depends on: the genotype, the
        budget, the seed and the data settings (the number of seeds is not among them)."""
        return json.dumps({
            "genotype": genotype.to_dict(), "seed": seed, "C": self.C, "layers": self.layers,
            "train_steps": self.train_steps, "batch_size": self.batch_size, "lr": self.lr,
            "data": {"dataset": self.dataset, "split": "test", "classes": self.classes,
                     "image_size": self.image_size, "seed": 0},
        }, sort_keys=True, separators=(",", ":"))


def _train_job(job: tuple[dict[str, Any], Budget, int]) -> float:
    """One (architecture, seed) training, single-threaded: its held-out test accuracy."""
    torch.set_num_threads(1)
    genotype, budget, seed = job
    held_out = class_halves(budget.dataset, split="test", num_classes=budget.classes,
                            image_size=budget.image_size)
    model = network_from_genotype(Genotype.from_dict(genotype), C=budget.C,
                                  layers=budget.layers, num_classes=held_out.num_classes,
                                  in_channels=int(held_out.train_x.shape[1]))
    return train_discrete(model, held_out, steps=budget.train_steps, seed=seed,
                          batch_size=budget.batch_size, lr=budget.lr)


def _read_cache(cache: Path) -> dict[str, float]:
    return json.loads(cache.read_text()) if cache.exists() else {}


def trained_accuracies(genotypes: Mapping[str, Genotype], budget: Budget, cache: Path,
                       workers: int) -> dict[str, list[float]]:
    """Test accuracy of every genotype at every seed ``0 .. budget.seeds - 1``, training only
    what the JSON ``cache`` (``Budget.cache_key -> accuracy``) lacks, ``workers`` at a time
    (1: in this process). The cache is rewritten after each training, so an interrupted run
    keeps what it finished and concurrent runs sharing the file keep each other's results."""
    keys = {(name, seed): budget.cache_key(g, seed)
            for name, g in genotypes.items() for seed in range(budget.seeds)}
    known = _read_cache(cache)
    todo = {key: (genotypes[name].to_dict(), budget, seed)
            for (name, seed), key in keys.items() if key not in known}
    pool = ProcessPoolExecutor(max_workers=workers) if workers > 1 and len(todo) > 1 else None
    try:
        results = (pool.map if pool else map)(_train_job, todo.values())
        for key, acc in zip(todo, results, strict=True):
            known = {**_read_cache(cache), key: acc}
            atomic_write(cache, (json.dumps(known, indent=1) + "\n").encode())
    finally:
        if pool:
            pool.shutdown(cancel_futures=True)
    return {name: [known[keys[name, seed]] for seed in range(budget.seeds)]
            for name in genotypes}


def random_genotypes(n: int, primitives: Sequence[str] = PRIMITIVES) -> dict[str, Genotype]:
    """The random baselines: ``random{i}`` drawn from ``key(100 + i)`` in the same space."""
    return {f"random{i}": random_genotype(random.key(100 + i), primitives=primitives)
            for i in range(n)}


def accuracy_bench(search_dir: Path, budget: Budget, workers: int, archs: list[str],
                   cache: Path) -> None:
    genotype_path = search_dir / "genotype.json"
    search_s = None
    if not genotype_path.exists() and (not archs or "searched" in archs):
        result = run_search(search_dir, class_halves(), SearchConfig(), show_progress=False)
        search_s = result.seconds
    candidates = random_genotypes(3)
    if not archs or "searched" in archs:
        candidates = {"searched": Genotype.load(genotype_path), **candidates}
    if archs:
        trained_accuracies({n: g for n, g in candidates.items() if n in archs}, budget, cache,
                           workers)
        return
    accs = trained_accuracies(candidates, budget, cache, workers)
    rows: list[dict[str, Any]] = [
        {"arch": name, "test_acc": statistics.fmean(accs[name]), "per_seed": accs[name],
         "skips_normal": g.skips("normal"), "genotype": g.to_dict()}
        for name, g in candidates.items()]
    searched_acc = float(rows[0]["test_acc"])
    rand = statistics.fmean(float(r["test_acc"]) for r in rows[1:])
    print(f"{'arch':<10}{'test acc':>9}  per seed")
    for r in rows:
        print(f"{r['arch']:<10}{r['test_acc']:>9.3f}  {[round(a, 3) for a in r['per_seed']]}")
    print(f"{'random mean':<10}{rand:>9.3f}   searched - random mean: {searched_acc - rand:+.3f}")
    for r in rows:
        print(json.dumps({"bench": "darts_accuracy", "train_steps": budget.train_steps,
                          "classes": budget.classes, **r}))
    print(json.dumps({"bench": "darts_accuracy_summary", "searched": searched_acc,
                      "random_mean": rand, "difference": searched_acc - rand,
                      "train_steps": budget.train_steps, "seeds": budget.seeds,
                      "classes": budget.classes, "search_seconds": search_s}))


def searched_genotypes(paths: Sequence[Path],
                       primitives: Sequence[str] = PRIMITIVES) -> dict[str, Genotype]:
    """``{label: genotype}`` for genotype.json files or search run directories (their
    ``genotype.json``); a label is the run directory's name (or the file's stem), made unique."""
    out: dict[str, Genotype] = {}
    for path in paths:
        file = path / "genotype.json" if path.is_dir() else path
        label = file.parent.name if file.name == "genotype.json" else file.stem
        label = label if label not in out else f"{label}-{len(out)}"
        out[label] = Genotype.load(file, primitives=primitives)
    return out


def percentile(value: float, population: Sequence[float]) -> float:
    """Percentile rank of ``value`` among ``population``: the share below it, ties counted
    half (50 = the random cells' median, 100 = better than every one)."""
    below = sum(p < value for p in population)
    ties = sum(p == value for p in population)
    return 100.0 * (below + 0.5 * ties) / len(population)


def distribution(accs: Mapping[str, list[float]], searched: Sequence[str]) -> dict[str, Any]:
    """The protocol's figures from per-seed accuracies: each architecture's mean over seeds,
    the random cells' mean, std (n - 1), min, max and seed-to-seed sd (pooled within cells),
    and each searched cell's accuracy and percentile among the random cells."""
    mean = {name: statistics.fmean(a) for name, a in accs.items()}
    rand = [mean[n] for n in accs if n not in searched]
    spread = [statistics.variance(a) for n, a in accs.items() if n not in searched and len(a) > 1]
    return {
        "random": {"n": len(rand), "mean": statistics.fmean(rand),
                   "std": statistics.stdev(rand) if len(rand) > 1 else 0.0,
                   "min": min(rand), "max": max(rand),
                   "seed_sd": statistics.fmean(spread) ** 0.5 if spread else None},
        "searched": [{"arch": n, "test_acc": mean[n], "percentile": percentile(mean[n], rand)}
                     for n in searched],
        "test_acc": mean,
    }


def plot_distribution(path: Path, summary: Mapping[str, Any], title: str) -> None:
    """PNG: the random cells' accuracies as a box with every cell as a dot, and a labelled
    line per searched cell."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    searched = {s["arch"] for s in summary["searched"]}
    rand = [a for n, a in summary["test_acc"].items() if n not in searched]
    fig, ax = plt.subplots(figsize=(7, 3.2), constrained_layout=True)
    ax.boxplot(rand, orientation="horizontal", widths=0.5, showfliers=False,
               medianprops={"color": "black"})
    jitter = [1 + 0.12 * ((i * 0.618) % 1 - 0.5) for i in range(len(rand))]
    ax.scatter(rand, jitter, color="tab:blue", zorder=3, label=f"random cells (n={len(rand)})")
    for i, s in enumerate(summary["searched"]):
        ax.axvline(s["test_acc"], color=f"C{i + 3}", linewidth=2,
                   label=f"{s['arch']}: {s['test_acc']:.3f} (percentile {s['percentile']:.1f})")
    ax.set_yticks([])
    ax.set_xlabel("held-out test accuracy (mean over seeds)")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="lower left", fontsize=8, bbox_to_anchor=(0, 1.12), ncol=2, frameon=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def protocol(paths: Sequence[Path], budget: Budget, *, n_random: int, cache: Path, plot: Path,
             workers: int, primitives: Sequence[str] = PRIMITIVES) -> dict[str, Any]:
    """The evaluation protocol: retrain the searched genotypes and ``n_random`` random ones of
    the same space with the same budget and seeds, score all on held-out classes, print the
    distribution (table, then JSON lines) and draw it to ``plot``; returns the summary."""
    searched = searched_genotypes(paths, primitives)
    candidates = {**searched, **random_genotypes(n_random, primitives)}
    accs = trained_accuracies(candidates, budget, cache, workers)
    summary = distribution(accs, list(searched))
    r = summary["random"]
    title = (f"{budget.dataset}: {budget.train_steps} steps x {budget.seeds} seeds, "
             f"C={budget.C}, {budget.layers} cells, {budget.classes} held-out classes")
    print(f"protocol: {len(candidates)} architectures, {title}")
    print(f"{'arch':<16}{'kind':<10}{'test acc':>9}{'percentile':>12}  per seed")
    pct = {s["arch"]: s["percentile"] for s in summary["searched"]}
    for name, a in accs.items():
        kind = "searched" if name in searched else "random"
        rank = f"{pct[name]:>12.1f}" if name in pct else f"{'':>12}"
        print(f"{name:<16}{kind:<10}{summary['test_acc'][name]:>9.3f}{rank}  "
              f"{[round(x, 3) for x in a]}")
    seed_sd = "" if r["seed_sd"] is None else f"; seed-to-seed sd {r['seed_sd']:.3f}"
    print(f"random cells (n={r['n']}): mean {r['mean']:.3f}, std {r['std']:.3f}, "
          f"min {r['min']:.3f}, max {r['max']:.3f}{seed_sd}")
    for name, a in accs.items():
        row = {"bench": "darts_protocol", "arch": name,
               "kind": "searched" if name in searched else "random",
               "test_acc": summary["test_acc"][name], "per_seed": a,
               "genotype": candidates[name].to_dict()}
        print(json.dumps({**row, **({"percentile": pct[name]} if name in pct else {})}))
    plot_distribution(plot, summary, title)
    print(json.dumps({"bench": "darts_protocol_summary", "random": r,
                      "searched": summary["searched"], "budget": asdict(budget),
                      "space": list(primitives), "plot": str(plot)}))
    return summary


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text}")
    return value


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_cost_one":
        print(json.dumps(cost_one(sys.argv[2], int(sys.argv[3]))))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="part", required=True)
    c = sub.add_parser("cost", help="search-step cost and peak memory per mode")
    c.add_argument("--steps", type=int, default=4)
    a = sub.add_parser("accuracy", help="searched vs random architectures")
    a.add_argument("--search-dir", type=Path, default=Path("runs/bench-darts-search"))
    a.add_argument("--archs", default="", help="train only these (comma-separated, e.g. "
                   "random0,random1) into the cache and stop; default: all, then report")
    pr = sub.add_parser("protocol", help="searched cells against the distribution of random "
                        "cells of the same space, same budget and seeds")
    pr.add_argument("searched", type=Path, nargs="*",
                    help="genotype.json files or search run directories")
    pr.add_argument("--random", type=_positive, default=8, help="random cells (key(100 + i))")
    pr.add_argument("--space", type=Path, default=None,
                    help="search space file (funcgraph.nas.load_space); default: DARTS' ops")
    pr.add_argument("--plot", type=Path, default=Path("runs/bench-darts-protocol.png"),
                    help="PNG of the distribution")
    for part in (a, pr):
        part.add_argument("--train-steps", type=_positive, default=200)
        part.add_argument("--seeds", type=_positive, default=2, help="training seeds per cell")
        part.add_argument("--dataset", default="glyphs",
                          help="the held-out classes' dataset (its test split)")
        part.add_argument("--classes", type=_positive, default=20,
                          help="held-out classes to classify (the dataset's test split)")
        part.add_argument("--channels", "-C", type=_positive, default=8,
                          help="initial cell width")
        part.add_argument("--layers", type=_positive, default=5, help="cells in the network")
        part.add_argument("--workers", type=_positive, default=2,
                          help="trainings run in parallel (1: in this process)")
        part.add_argument("--cache", type=Path, default=Path("runs/bench-darts-cache.json"),
                          help="JSON file of per-(genotype, budget, seed, data) accuracies, "
                          "reused by later runs")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.part == "cost":
        cost(args.steps)
        return
    budget = Budget(dataset=args.dataset, train_steps=args.train_steps, classes=args.classes,
                    seeds=args.seeds, C=args.channels, layers=args.layers)
    try:
        if args.part == "accuracy":
            archs = [a for a in args.archs.split(",") if a]
            accuracy_bench(args.search_dir, budget, args.workers, archs, args.cache)
        else:
            space = PRIMITIVES if args.space is None else load_space(args.space)
            protocol(args.searched, budget, n_random=args.random, cache=args.cache,
                     plot=args.plot, workers=args.workers, primitives=space)
    except FuncgraphError as e:  # a bad path, space or genotype: one line, no traceback
        sys.exit(f"darts.py {args.part}: {e}")


if __name__ == "__main__":
    from records import recorded  # benchmarks/records.py: --record appends a record

    recorded("darts")(main)()
