"""DARTS on the CPU proxy: search cost per mode, and searched vs random architectures.

Two parts, each printing a table and one JSON line per row:

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
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from funcgraph import random
from funcgraph.model import Model
from funcgraph.nas import (
    BilevelConfig,
    Genotype,
    SearchConfig,
    SearchData,
    build_search_model,
    epoch_batches,
    is_arch,
    make_search_step,
    network_from_genotype,
    random_genotype,
    supernet_accuracy,
)
from funcgraph.params import partition
from funcgraph.runs import glyph_halves, run_search
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
    data = glyph_halves()
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


def _train_job(job: tuple[dict[str, Any], int, int, int, int, int]) -> float:
    """One (architecture, seed) training in a worker process (single-threaded)."""
    torch.set_num_threads(1)
    genotype, c, layers, steps, seed, classes = job
    # characters the search never saw
    held_out = glyph_halves(split="evaluation", num_classes=classes)
    model = network_from_genotype(Genotype.from_dict(genotype), C=c, layers=layers,
                                  num_classes=held_out.num_classes)
    return train_discrete(model, held_out, steps=steps, seed=seed)


def accuracy_bench(search_dir: Path, train_steps: int, seeds: int, workers: int,
                   archs: list[str], cache: Path, classes: int) -> None:
    cfg = SearchConfig()
    genotype_path = search_dir / "genotype.json"
    search_s = None
    if not genotype_path.exists() and (not archs or "searched" in archs):
        result = run_search(search_dir, glyph_halves(), cfg, show_progress=False)
        search_s = result.seconds
    candidates = {f"random{i}": random_genotype(random.key(100 + i)) for i in range(3)}
    if not archs or "searched" in archs:
        candidates = {"searched": Genotype.load(genotype_path), **candidates}
    jobs = [(name, g, seed) for name, g in candidates.items() for seed in range(seeds)]
    cache.mkdir(parents=True, exist_ok=True)

    def cached(g: Genotype, seed: int) -> Path:
        digest = hashlib.sha256(g.to_json().encode()).hexdigest()[:12]
        return cache / (f"{digest}-C{cfg.C}-L{cfg.layers}-steps{train_steps}-classes{classes}"
                        f"-seed{seed}.json")

    todo = [(name, g, seed) for name, g, seed in jobs
            if (name in archs or not archs) and not cached(g, seed).exists()]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        done = pool.map(_train_job, [(g.to_dict(), cfg.C, cfg.layers, train_steps, seed,
                                      classes) for _, g, seed in todo])
        for (_, g, seed), acc in zip(todo, done, strict=True):
            cached(g, seed).write_text(json.dumps({"test_acc": acc}))
    if archs:
        return
    accs = [json.loads(cached(g, seed).read_text())["test_acc"] for _, g, seed in jobs]
    rows: list[dict[str, Any]] = []
    for name, g in candidates.items():
        mine = [a for (n, _, _), a in zip(jobs, accs, strict=True) if n == name]
        rows.append({"arch": name, "test_acc": sum(mine) / len(mine), "per_seed": mine,
                     "skips_normal": g.skips("normal"), "genotype": g.to_dict()})
    searched_acc = float(rows[0]["test_acc"])
    rand = sum(float(r["test_acc"]) for r in rows[1:]) / 3
    print(f"{'arch':<10}{'test acc':>9}  per seed")
    for r in rows:
        print(f"{r['arch']:<10}{r['test_acc']:>9.3f}  {[round(a, 3) for a in r['per_seed']]}")
    print(f"{'random mean':<10}{rand:>9.3f}   searched - random mean: {searched_acc - rand:+.3f}")
    for r in rows:
        print(json.dumps({"bench": "darts_accuracy", "train_steps": train_steps,
                          "classes": classes, **r}))
    print(json.dumps({"bench": "darts_accuracy_summary", "searched": searched_acc,
                      "random_mean": rand, "difference": searched_acc - rand,
                      "train_steps": train_steps, "seeds": seeds, "classes": classes,
                      "search_seconds": search_s}))


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
    a.add_argument("--train-steps", type=int, default=200)
    a.add_argument("--seeds", type=int, default=2)
    a.add_argument("--workers", type=int, default=2, help="trainings run in parallel")
    a.add_argument("--archs", default="", help="train only these (comma-separated, e.g. "
                   "random0,random1) into the cache and stop; default: all, then report")
    a.add_argument("--classes", type=int, default=20,
                   help="held-out characters to classify (evaluation split)")
    a.add_argument("--cache", type=Path, default=Path("runs/bench-darts-cache"),
                   help="per-(architecture, seed) accuracies, reused by later runs")
    args = parser.parse_args()
    if args.part == "cost":
        cost(args.steps)
    else:
        archs = [a for a in args.archs.split(",") if a]
        accuracy_bench(args.search_dir, args.train_steps, args.seeds, args.workers, archs,
                       args.cache, args.classes)


if __name__ == "__main__":
    main()
