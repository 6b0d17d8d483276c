"""funcgraph's max-pool (``nn.max_pool``) against torch's ``F.max_pool2d`` inside transforms.

Inside ``vmap`` a convolution with per-task weights returns an NCHW activation (channels-last
cannot be asked for there), and torch's CPU max-pool searches its windows far slower on NCHW
than on channels-last. ``nn.max_pool`` searches them on a channels-last copy outside autograd
and gathers the maxima: the same values and gradients (checked here, exactly, before timing).

Timed, interleaved over ``--reps`` repetitions (medians, CPU seconds of this process), on the
output of a vmapped 3x3 convolution (``--tasks`` tasks of ``--images`` images, ``--channels``
channels, ``--size`` pixels square), 2x2 pooling:

* ``forward``: the pool alone under ``vmap``;
* ``second order``: a MAML-like step through conv and pool, ``vmap(grad(outer))`` where
  ``outer`` takes a gradient step on the per-task weights and scores the adapted ones.

    OMP_NUM_THREADS=1 python benchmarks/max_pool.py --record
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import grad, vmap

from funcgraph import nn

POOLS: dict[str, Callable[[Tensor, int], Tensor]] = {
    "torch F.max_pool2d": F.max_pool2d, "funcgraph nn.max_pool": nn.max_pool}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tasks", type=int, default=16)
    p.add_argument("--images", type=int, default=10)
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--size", type=int, default=28)
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args()
    torch.manual_seed(0)
    x = torch.randn(args.tasks, args.images, 3, args.size, args.size)
    w = torch.randn(args.tasks, args.channels, 3, 3, 3) / 3

    def conv(v: Tensor, weight: Tensor) -> Tensor:
        return F.conv2d(v, weight, padding=1)

    activation = vmap(conv)(x, w)

    def loss(weight: Tensor, v: Tensor, pool: Any) -> Tensor:
        return pool(conv(v, weight), 2).pow(2).mean()

    def outer(weight: Tensor, v: Tensor, pool: Any) -> Tensor:
        return loss(weight - 0.1 * grad(loss)(weight, v, pool), v, pool)

    cases: dict[str, Callable[[Any], Tensor]] = {
        "forward": lambda pool: vmap(lambda a: pool(a, 2))(activation),
        "second order": lambda pool: vmap(grad(outer), in_dims=(0, 0, None))(w, x, pool),
    }
    for case, run in cases.items():
        want, got = (run(pool) for pool in POOLS.values())
        if not torch.equal(want, got):
            raise SystemExit(f"{case}: nn.max_pool differs from F.max_pool2d")
        times: dict[str, list[float]] = {name: [] for name in POOLS}
        for _ in range(args.reps + 1):  # the first round warms up
            for name, pool in POOLS.items():
                start = time.process_time()
                run(pool)
                times[name].append(time.process_time() - start)
        medians = {name: statistics.median(t[1:]) for name, t in times.items()}
        base = medians["torch F.max_pool2d"]
        for name, seconds in medians.items():
            print(json.dumps({"case": case, "pool": name, "ms": round(1e3 * seconds, 2),
                              "speedup_vs_torch": round(base / seconds, 3),
                              "threads": torch.get_num_threads(), "config": vars(args)}))


if __name__ == "__main__":
    from records import recorded  # benchmarks/records.py: --record appends a record

    recorded("max_pool")(main)()
