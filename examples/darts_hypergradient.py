"""Exact second-order DARTS hypergradient vs the paper's finite-difference approximation.

Builds a small supernet on glyph halves, takes one batch of each half, and compares the
architecture gradient three ways: first order, second order exact (torch.func vjp through the
unrolled weight step) and second order by the paper's central difference at a few radii.

    python examples/darts_hypergradient.py [--C 4] [--layers 3] [--batch 16] [--dtype float64]
                                           [--threads 1]

The defaults are small so that it runs in well under a minute on a CPU: the exact
hypergradient differentiates through a whole supernet step (second order through every mixed
op) and each finite difference costs two more gradients. One torch thread by default: on a
machine that other jobs share, OpenMP threads spin-wait for a core and two threads can be
many times slower than one.

What it prints: the first-order gradient's cosine to the exact hypergradient, and the
relative error of the paper's central difference at each radius. At the paper's radius 0.01
it is far off, and smaller radii can get worse before the error falls to rounding: a
difference quotient that grows as the radius shrinks is a function that is not smooth at
that scale (ReLU and max-pool kinks lie close to these weights along the direction, and a
difference across a kink measures its jump). Below the kinks it converges to the exact
value, which is the check that the exact one is right; the example asserts it at the
smallest radius in float64 (tests/test_examples.py runs it, and tests/test_nas_bilevel.py
makes the same comparison on a tiny supernet).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from funcgraph import random
from funcgraph.nas import (
    BilevelConfig,
    first_order_gradient,
    hypergradient,
    is_arch,
    search_network,
)
from funcgraph.params import Params, partition
from funcgraph.runs import class_halves


def flat(g: Params) -> torch.Tensor:
    return torch.cat([g[n].flatten() for n in sorted(g)])


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Prints the comparison and returns each method's relative error to the exact gradient
    (``"first"``, ``"fd 1e-07"``, ...); asserts that the smallest radius matches it."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--C", type=int, default=4, help="initial channels")
    parser.add_argument("--layers", type=int, default=3, help="cells (two of them reduce)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float64")
    parser.add_argument("--radii", default="1e-2,1e-4,1e-6,1e-7,1e-8",
                        help="finite-difference radii, comma-separated")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (0: torch's default, one per core)")
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)

    data = class_halves(num_classes=args.classes)
    model = search_network(args.C, args.layers, data.num_classes)
    params, state = model.init(random.key(0))
    params = {n: t.to(dtype) for n, t in params.items()}
    state = {n: t.to(dtype) if t.is_floating_point() else t for n, t in state.items()}
    arch, weights = partition(params, is_arch)

    def loss(w: Params, a: Params, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        logits, _ = model.apply({**w, **a}, state, batch[0], train=True)
        return F.cross_entropy(logits, batch[1])

    # a spread of classes in each batch (the halves are sorted by class)
    pick = torch.linspace(0, len(data.train_y) - 1, args.batch).long()
    train = (data.train_x[pick].to(dtype), data.train_y[pick])
    val = (data.val_x[pick].to(dtype), data.val_y[pick])
    cfg = BilevelConfig()
    opt = cfg.weight_optimizer()
    opt_state = opt.init(weights)
    lr = cfg.w_lr

    t = time.perf_counter()
    exact = flat(hypergradient(loss, weights, arch, train, val, optimizer=opt,
                               opt_state=opt_state, lr=lr))
    print(f"exact second order: |g| = {exact.norm():.4g}  ({time.perf_counter() - t:.1f} s)")
    first = flat(first_order_gradient(loss, weights, arch, val))
    cos = F.cosine_similarity(first, exact, dim=0)
    print(f"first order:        |g| = {first.norm():.4g}  cosine to exact {cos:.4f}")
    errors = {"first": float((first - exact).norm() / exact.norm())}
    for radius in (float(r) for r in args.radii.split(",")):
        approx = flat(hypergradient(loss, weights, arch, train, val, optimizer=opt,
                                    opt_state=opt_state, lr=lr, method="finite-difference",
                                    fd_radius=radius))
        rel = (approx - exact).norm() / exact.norm()
        cos = F.cosine_similarity(approx, exact, dim=0)
        print(f"finite difference radius {radius:g}: relative error {rel:.2e}, cosine {cos:.6f}")
        errors[f"fd {radius:g}"] = float(rel)
    smallest = min(float(r) for r in args.radii.split(","))
    if dtype == torch.float64 and smallest <= 1e-6:
        # Below the kinks the difference quotient converges to the exact hypergradient.
        assert errors[f"fd {smallest:g}"] < 1e-4, (
            f"finite difference at {smallest:g} is {errors[f'fd {smallest:g}']:.2e} from exact")
    return errors


if __name__ == "__main__":
    main()
