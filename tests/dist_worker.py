"""A tiny data-parallel meta-learning job, run as one process per rank by test_distributed.py.

Each step: the shared step key gives 32 regression tasks; this rank takes its slice, computes
the mean MAML meta-gradient (one inner SGD step) over its tasks, all-reduces it, and applies
an Adam update. Rank 0 writes metrics and checkpoints; the final params go to --out/final.
"""

import argparse
import os
import sys

import torch

from funcgraph import distributed, random
from funcgraph.errors import DistributedError
from funcgraph.train import LoopConfig, Run, adam, run_loop, save_checkpoint

TASKS = 32


def task_loss(params, key):
    kx, kw, kq = random.split(key, 3)
    w_true = random.normal(kw, (3, 1), dtype=torch.float64)
    xs = random.normal(kx, (5, 3), dtype=torch.float64)
    xq = random.normal(kq, (5, 3), dtype=torch.float64)

    def loss(p, x):
        return (torch.tanh(x @ p["w"] + p["b"]) - x @ w_true).square().mean()

    g = torch.func.grad(loss)(params, xs)
    adapted = {n: params[n] - 0.1 * g[n] for n in params}
    return loss(adapted, xq)


def meta_grad(params, keys):
    grads = [torch.func.grad(task_loss)(params, k) for k in keys]
    return {n: torch.stack([g[n] for g in grads]).mean(0) for n in params}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--die-rank", type=int, default=-1)
    ap.add_argument("--die-at", type=int, default=-1)
    ap.add_argument("--timeout", type=float, default=90.0)
    args = ap.parse_args()
    env = distributed.init("gloo", timeout_s=args.timeout)
    run = Run.create(args.out, {"tasks": TASKS, "steps": args.steps}, resume=args.resume,
                     env=env)
    opt = adam(0.05)
    params = {"w": torch.zeros(3, 1, dtype=torch.float64), "b": torch.zeros(1, dtype=torch.float64)}
    groups = {"params": params, "opt": opt.init(params)}
    start = 0
    if args.resume:
        groups, meta = run.load("last")
        start = meta["step"]
    root = random.key(7)

    def step_fn(step, g):
        if env.rank == args.die_rank and step == args.die_at:
            os._exit(17)
        keys = distributed.rank_keys(random.fold_in(root, step), TASKS, env)
        grads = distributed.all_reduce_mean(meta_grad(g["params"], keys), env)
        new_params, new_opt = opt.update(g["params"], grads, g["opt"])
        distributed.assert_in_sync(new_params, env, step)
        return {"params": new_params, "opt": new_opt}, {}

    cfg = LoopConfig(total_steps=args.steps, checkpoint_every=1, show_progress=False,
                     write=env.is_main)
    try:
        groups = run_loop(run, groups, step_fn, cfg, start_step=start)
    except DistributedError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if env.is_main:
        save_checkpoint(os.path.join(args.out, "final"), {"params": groups["params"]}, {})
    distributed.shutdown(env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
