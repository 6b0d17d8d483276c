"""Stochastic depth: training time per epoch and accuracy cost, against no dropping.

Time: a CIFAR-style ResNet (depth 110 by default) trained with stochastic depth in ``batch``
mode (linear decay to ``final_drop_prob = 0.5``; dropped blocks are not computed) and the same
ResNet with no dropping, in one process, steps interleaved (A B B A ...) on the same batches
and starting params. Per-epoch time is the sum of step times, so the figure of merit is the
ratio of **mean** step times (medians are printed beside it). Both wall-clock and process CPU
time are measured; on a shared machine (other jobs competing for the cores) CPU time is the
figure to trust, and with ``--threads 1`` it is the work done.

Estimated saving: the CPU time of one block's forward+backward is measured per stage (in
isolation), and ``sum_l drop_prob_l * cost_l / step_time`` estimates what skipping bodies can
save. On a CPU the first stage's blocks (largest activations) cost more than the others and
linear decay drops mostly the late blocks, so the estimate is below the ~25% the paper reports
on a GPU, where every block costs about the same.

Accuracy: ``--accuracy-steps N`` also trains both variants for N steps on the embedded glyph
classification set and reports validation accuracy (short runs: the number of steps is printed).

Run::

    python benchmarks/stochastic_depth.py --depth 110 --steps 20
    python benchmarks/stochastic_depth.py --depth 20 --steps 0 --accuracy-steps 300
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from funcgraph import random
from funcgraph.models.resnet import resnet
from funcgraph.nn.stochastic_depth import linear_decay
from funcgraph.train import adam
from funcgraph.train.supervised import (
    Batch,
    batches,
    class_split,
    evaluate_batches,
    sample_batch,
    train_step,
)


def time_steps(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Interleaved step times of the two variants: per-variant mean/median of wall-clock
    (``*_s``) and process CPU (``cpu_*_s``) seconds."""
    common = dict(num_classes=10, in_channels=3, mode="batch")
    models = {"no_drop": resnet(args.depth, final_drop_prob=0.0, **common),  # type: ignore[arg-type]
              "stochastic_depth": resnet(args.depth, final_drop_prob=args.final_drop_prob,
                                         **common)}  # type: ignore[arg-type]
    params, state = models["no_drop"].init(random.key(0))
    opt = adam(1e-3)
    steps = {name: train_step(m, opt) for name, m in models.items()}
    groups = {name: (params, state, opt.init(params)) for name in models}
    times: dict[str, list[float]] = {name: [] for name in models}
    cpu: dict[str, list[float]] = {name: [] for name in models}
    root = random.key(1)
    for i in range(args.warmup + args.steps):
        k = random.fold_in(root, i)
        kx, ky = random.split(k)
        x = random.normal(kx, (args.batch_size, 3, args.image_size, args.image_size))
        y = random.randint(ky, (args.batch_size,), 0, 10)
        order = list(models) if i % 2 == 0 else list(reversed(models))
        for name in order:
            p, s, o = groups[name]
            start, start_cpu = time.perf_counter(), time.process_time()
            p, s, o, _ = steps[name](p, s, o, (x, y), k)
            elapsed, elapsed_cpu = time.perf_counter() - start, time.process_time() - start_cpu
            groups[name] = (p, s, o)
            if i >= args.warmup:
                times[name].append(elapsed)
                cpu[name].append(elapsed_cpu)
    return {name: {"mean_s": statistics.fmean(times[name]),
                   "median_s": statistics.median(times[name]),
                   "cpu_mean_s": statistics.fmean(cpu[name]),
                   "cpu_median_s": statistics.median(cpu[name])} for name in models}


def block_costs(args: argparse.Namespace) -> list[float]:
    """Median CPU seconds of one basic block's forward+backward in each of the three stages."""
    from funcgraph.models.resnet import _body

    costs = []
    for stage in range(3):
        channels, size = 16 * 2**stage, args.image_size // 2**stage
        body = _body(channels, channels, 1)
        params, state = body.init(random.key(0))
        x = random.normal(random.key(1), (args.batch_size, channels, size, size))
        grad = torch.func.grad(lambda p, x, b=body, s=state: b.apply(p, s, x, train=True)[0]
                               .sum(), argnums=(0, 1))
        grad(params, x)
        times = []
        for _ in range(7):
            start = time.process_time()
            grad(params, x)
            times.append(time.process_time() - start)
        costs.append(statistics.median(times))
    return costs


def accuracy_cost(args: argparse.Namespace) -> dict[str, float]:
    """Validation accuracy of both variants after ``args.accuracy_steps`` steps on glyphs."""
    from funcgraph.data import load_glyphs

    ds = load_glyphs("background", image_size=28)
    train, val = class_split(ds.images, num_classes=args.classes, val_per_class=4)
    out: dict[str, float] = {}
    for name, final in (("no_drop", 0.0), ("stochastic_depth", args.final_drop_prob)):
        model = resnet(args.depth, num_classes=args.classes, in_channels=1, final_drop_prob=final)
        params, state = model.init(random.key(0))
        opt = adam(args.lr)
        opt_state = opt.init(params)
        step = train_step(model, opt)
        root = random.key(2)
        for i in range(args.accuracy_steps):
            k = random.fold_in(root, i)
            batch: Batch = sample_batch(random.fold_in(k, 0), train, args.batch_size)
            params, state, opt_state, _ = step(params, state, opt_state, batch, k)
        out[name] = evaluate_batches(model, params, state, batches(val, 256))["accuracy"]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--depth", type=int, default=110)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--final-drop-prob", type=float, default=0.5)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per variant")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per variant")
    parser.add_argument("--accuracy-steps", type=int, default=0)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    record: dict[str, object] = {"benchmark": "stochastic_depth", "depth": args.depth,
                                 "batch_size": args.batch_size, "threads": torch.get_num_threads()}
    if args.steps > 0:
        t = time_steps(args)
        base, sd = t["no_drop"], t["stochastic_depth"]
        saving = 1.0 - sd["mean_s"] / base["mean_s"]
        cpu_saving = 1.0 - sd["cpu_mean_s"] / base["cpu_mean_s"]
        print(f"ResNet-{args.depth}, batch {args.batch_size}, {args.image_size}px, "
              f"{args.steps} interleaved steps per variant, {torch.get_num_threads()} threads")
        print(f"{'variant':<18}{'wall mean':>10}{'wall median':>12}{'cpu mean':>10}"
              f"{'cpu median':>12}   (seconds per step)")
        for name, v in t.items():
            print(f"{name:<18}{v['mean_s']:>10.3f}{v['median_s']:>12.3f}{v['cpu_mean_s']:>10.3f}"
                  f"{v['cpu_median_s']:>12.3f}")
        print(f"time per epoch saved by stochastic depth: wall {saving:.1%}, cpu {cpu_saving:.1%}")
        costs = block_costs(args)
        n = (args.depth - 2) // 6
        probs = linear_decay(3 * n, args.final_drop_prob)
        best = sum(p * costs[i // n] for i, p in enumerate(probs)) / base["cpu_mean_s"]
        print("block fwd+bwd CPU ms by stage: " + ", ".join(f"{1e3 * c:.1f}" for c in costs)
              + f"; saving estimated from these costs: {best:.1%}")
        record.update(time=t, epoch_time_saving=saving, epoch_cpu_saving=cpu_saving,
                      steps=args.steps, block_cpu_s=costs, estimated_saving=best)
    if args.accuracy_steps > 0:
        acc = accuracy_cost(args)
        print(f"validation accuracy after {args.accuracy_steps} steps of batch {args.batch_size} "
              f"({args.classes} glyph classes): no_drop {acc['no_drop']:.3f}, "
              f"stochastic_depth {acc['stochastic_depth']:.3f}")
        record.update(accuracy=acc, accuracy_steps=args.accuracy_steps, classes=args.classes)
    print(json.dumps(record, sort_keys=True))


if __name__ == "__main__":
    from records import recorded  # benchmarks/records.py: --record appends a record

    recorded("stochastic_depth")(main)()
