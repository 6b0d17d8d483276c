"""Your module at funcgraph's speed: one MAML meta-step of conv4 written as a plain ``nn.Module``
(``funcgraph.models.conv4.conv4_module``, a custom forward over ``Conv2d`` / ``BatchNorm2d`` /
``F.relu`` / ``F.max_pool2d``) through ``maml(module)``, against funcgraph's own
``maml(bind(conv4(...)))``, same params, same tasks, same run.

Rows: funcgraph's conv4 (the baseline of the ratios); the module through ``maml(module)``, whose
``from_module`` rewrites its chains onto funcgraph's layers; and the same module with
``from_module(module, fuse=False)``, its own forward through ``functional_call``. The
meta-gradients are compared before timing; timings are interleaved (one step of each row per
repetition) and the table shows medians. Prints a table and JSON lines.

    python benchmarks/own_module_step.py --reps 7
    python benchmarks/own_module_step.py --variant strided --strategy loop
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from funcgraph import bind, from_module, random
from funcgraph.allocator import keep_freed_memory
from funcgraph.meta import Task, maml, mean_task_grads
from funcgraph.meta.learner import TaskGradFn
from funcgraph.models import conv4
from funcgraph.models.conv4 import conv4_module
from funcgraph.params import Params


def make_tasks(args: argparse.Namespace) -> Task:
    k = random.split(random.key(args.seed), 2)
    n, t = args.ways, args.meta_batch
    sx = random.uniform(k[0], (t, n * args.shots, 1, 28, 28))
    qx = random.uniform(k[1], (t, n * args.queries, 1, 28, 28))
    sy = torch.arange(n).repeat_interleave(args.shots).expand(t, -1).contiguous()
    qy = torch.arange(n).repeat_interleave(args.queries).expand(t, -1).contiguous()
    return Task(sx, sy, qx, qy)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ways", type=int, default=5)
    p.add_argument("--shots", type=int, default=1)
    p.add_argument("--queries", type=int, default=1)
    p.add_argument("--meta-batch", type=int, default=32)
    p.add_argument("--inner-steps", type=int, default=1)
    p.add_argument("--inner-lr", type=float, default=0.4)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--variant", choices=("pool", "strided"), default="pool")
    p.add_argument("--strategy", choices=("auto", "loop", "vmap"), default="auto",
                   help="mean_task_grads' strategy (auto: what meta-train runs)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: torch's, the number of cores)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall: perf_counter; cpu: process CPU time (robust on a shared machine)")
    p.add_argument("--malloc", choices=("keep", "default"), default="keep",
                   help="keep: funcgraph.allocator.keep_freed_memory(), as the training "
                        "commands run; default: glibc as is")
    args = p.parse_args()
    if args.malloc == "keep" and not keep_freed_memory():
        raise SystemExit("--malloc keep: this C library has no glibc mallopt")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    clock = time.perf_counter if args.clock == "wall" else time.process_time

    model = conv4(args.ways, hidden=args.hidden, variant=args.variant)
    params, state = model.init(random.key(args.seed))
    module = conv4_module(args.ways, hidden=args.hidden, variant=args.variant)
    settings = {"inner_steps": args.inner_steps, "inner_lr": args.inner_lr}
    fused = maml(module, **settings)
    assert fused.model is not None and fused.model.meta["rewritten"], fused.model
    rows: dict[str, TaskGradFn] = {
        "conv4 (funcgraph's)": maml(bind(model, state), **settings).task_grad,
        "maml(module)": fused.task_grad,
        "maml(from_module(module, fuse=False))": maml(from_module(module, fuse=False),
                                                      **settings).task_grad,
    }
    tasks = make_tasks(args)

    def grads_of(task_grad: TaskGradFn) -> Params:
        return mean_task_grads(task_grad, params, tasks, strategy=args.strategy)[0]

    want = grads_of(rows["conv4 (funcgraph's)"])
    for name, task_grad in rows.items():
        got = grads_of(task_grad)
        diff = torch.cat([(got[n] - want[n]).flatten() for n in want]).norm()
        err = float(diff / torch.cat([w.flatten() for w in want.values()]).norm())
        print(json.dumps({"check": name, "rel_grad_diff_vs_conv4": err}))
        if err > 1e-3:
            raise SystemExit(f"{name}: meta-gradient differs from conv4's ({err:.2e})")

    times: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.reps):
        for name, task_grad in rows.items():
            start = clock()
            grads_of(task_grad)
            times[name].append(clock() - start)
    base = statistics.median(times["conv4 (funcgraph's)"])
    print(f"\nconv4-{args.variant} hidden {args.hidden}, {args.ways}-way {args.shots}-shot "
          f"{args.queries} query, meta-batch {args.meta_batch}, {args.inner_steps} second-order "
          f"inner step(s), strategy {args.strategy}; threads {torch.get_num_threads()}; "
          f"malloc {args.malloc}; median of {args.reps}, {args.clock} clock")
    print(f"{'row':40s} {'s/step':>8s} {'/ conv4':>8s}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:40s} {med:8.3f} {med / base:8.3f}")
        print(json.dumps({"row": name, "s_per_step": med, "ratio_vs_conv4": med / base,
                          "times": ts, "config": vars(args)}))


if __name__ == "__main__":
    main()
