"""A DARTS search written out step by step with the library pieces, then the discrete network.

The CLI (``funcgraph search``) does the same with checkpoints and resume; this shows the parts:
the supernet is a Model whose params include ``arch.normal``/``arch.reduce``; a partition
splits them from the weights; each step is an architecture update on a validation batch and a
weight update on a training batch; the genotype is read off softmax(alpha).

    python examples/darts_search.py [--steps 30] [--order first|second] [--C 8] [--layers 5]
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F

from funcgraph import random
from funcgraph.nas import (
    BilevelConfig,
    arch_gradient,
    arch_weights,
    derive_genotype,
    is_arch,
    network_from_genotype,
    search_network,
)
from funcgraph.params import Params, partition
from funcgraph.runs import class_halves
from funcgraph.train import cosine_lr


def main(argv: list[str] | None = None) -> list[float]:
    """Runs the search, prints the genotype, builds the discrete network and returns the
    training losses of every step; asserts that the architecture moved and the network runs."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--order", choices=["first", "second"], default="first")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--C", type=int, default=8, help="initial channels")
    parser.add_argument("--layers", type=int, default=5, help="cells (two of them reduce)")
    parser.add_argument("--classes", type=int, default=10)
    args = parser.parse_args(argv)

    data = class_halves(num_classes=args.classes)
    model = search_network(args.C, args.layers, data.num_classes)
    params, state = model.init(random.key(0))
    arch, weights = partition(params, is_arch)
    arch0 = arch
    cfg = BilevelConfig(order=args.order)
    w_opt, a_opt = cfg.weight_optimizer(), cfg.arch_optimizer()
    w_state, a_state = w_opt.init(weights), a_opt.init(arch)

    def loss(w: Params, a: Params, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        logits, _ = model.apply({**w, **a}, state, batch[0], train=True)
        return F.cross_entropy(logits, batch[1])

    n = data.train_x.shape[0]
    losses: list[float] = []
    for step in range(args.steps):
        k_train, k_val = random.split(random.fold_in(random.key(1), step))
        ti = random.permutation(k_train, n)[: args.batch]
        vi = random.permutation(k_val, n)[: args.batch]
        train = (data.train_x[ti], data.train_y[ti])
        val = (data.val_x[vi], data.val_y[vi])
        lr = cosine_lr(cfg.w_lr, step, args.steps, min_lr=cfg.w_lr_min)
        g_arch = arch_gradient(loss, weights, arch, train, val, config=cfg, opt_state=w_state,
                               lr=lr)
        arch, a_state = a_opt.update(arch, g_arch, a_state)
        g_w, value = torch.func.grad_and_value(loss)(weights, arch, train)
        weights, w_state = w_opt.update(weights, g_w, w_state, lr=lr)
        losses.append(float(value))
        if step % 10 == 0 or step == args.steps - 1:
            print(f"step {step:3d}  train loss {float(value):.3f}")

    moved = max(float((arch[n] - arch0[n]).abs().max()) for n in arch)
    assert moved > 0 and all(math.isfinite(v) for v in losses), (moved, losses)
    genotype = derive_genotype(arch_weights(arch))
    print("genotype:", genotype.to_json())
    final = network_from_genotype(genotype, C=args.C, layers=args.layers,
                                  num_classes=data.num_classes)
    p, s = final.init(random.key(2))
    logits, _ = final.apply(p, s, data.val_x[:4])
    size = sum(t.numel() for t in p.values())
    print(f"discrete network: {size} params, logits {tuple(logits.shape)}")
    assert logits.shape == (4, data.num_classes) and bool(logits.isfinite().all())
    return losses


if __name__ == "__main__":
    main()
