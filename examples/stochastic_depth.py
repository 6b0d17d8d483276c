"""Stochastic depth as a keyed, pure combinator: which blocks run is drawn from the key, a
dropped block is not computed, evaluation equals the mean of training over keys.

Run: python examples/stochastic_depth.py            (ResNet-20, about 5 s of CPU)

One torch thread by default (``--threads 0`` for torch's default): on a machine that other
jobs share, OpenMP threads spin-wait for a core and two threads can be many times slower
than one.
"""

from __future__ import annotations

import argparse
import time

import torch

from funcgraph import Model, nn, random
from funcgraph.models.resnet import resnet
from funcgraph.nn.stochastic_depth import blocks_ran, stochastic_depth


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--depth", type=int, default=20)
    parser.add_argument("--steps", type=int, default=6, help="timed forward+backward passes")
    parser.add_argument("--keys", type=int, default=4000, help="keys for the Monte Carlo mean")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (0: torch's default, one per core)")
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    # 1. Which blocks run: a pure function of the key, returned in the state.
    model = resnet(args.depth, num_classes=10, in_channels=3)
    params, state = model.init(random.key(0))
    x = random.normal(random.key(1), (16, 3, 32, 32))
    for step in range(3):
        _, new_state = model.apply(params, state, x, key=random.fold_in(random.key(2), step),
                                   train=True)
        ran = "".join("#" if float(v) else "." for v in blocks_ran(new_state).values())
        print(f"step {step}: blocks run {ran}  (# ran, . skipped; later blocks drop more)")

    # 2. Skipped blocks are not computed: time training passes against no dropping.
    plain = resnet(args.depth, num_classes=10, in_channels=3, final_drop_prob=0.0)

    def cpu_seconds(m: Model, i: int) -> float:
        k = random.fold_in(random.key(3), i)
        start = time.process_time()  # CPU time: meaningful even when other jobs share the cores
        torch.func.grad(lambda p: m.apply(p, state, x, key=k, train=True)[0].sum())(params)
        return time.process_time() - start

    cpu_seconds(model, -1), cpu_seconds(plain, -1)  # warm-up: first calls allocate
    sd_time = sum(cpu_seconds(model, i) for i in range(args.steps))
    plain_time = sum(cpu_seconds(plain, i) for i in range(args.steps))
    print(f"{args.steps} training passes: stochastic depth {sd_time:.2f} s CPU, "
          f"no dropping {plain_time:.2f} s CPU ({1 - sd_time / plain_time:.0%} less)")

    # 3. Evaluation = expectation of training (inverted scaling), checked over many keys.
    block = stochastic_depth(nn.serial(nn.linear(8, 8, dtype=torch.float64), nn.tanh()), 0.5)
    bp, bs = block.init(random.key(4))
    v = random.normal(random.key(5), (2, 8), dtype=torch.float64)
    keys = random.split(random.key(6), args.keys)
    ys, _ = torch.func.vmap(lambda k: block.apply(bp, bs, v, key=k, train=True))(keys)
    y_eval, _ = block.apply(bp, bs, v)
    sem = float((ys.std(0) / args.keys**0.5).max())
    print(f"|mean over {args.keys} keys - eval| = {float((ys.mean(0) - y_eval).abs().max()):.4f}"
          f" (standard error {sem:.4f})")


if __name__ == "__main__":
    main()
