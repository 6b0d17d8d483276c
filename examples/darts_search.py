"""A DARTS search written out step by step with the library pieces, then the discrete network.

The CLI (``funcgraph search``) does the same with checkpoints and resume; this shows the parts:
the supernet is a Model whose params include ``arch.normal``/``arch.reduce``; a partition
splits them from the weights; each step is an architecture update on a validation batch and a
weight update on a training batch; the genotype is read off softmax(alpha).

    python examples/darts_search.py              # quick: 15 steps, 5 classes, C 4, 3 cells
    python examples/darts_search.py --full       # 30 steps, 10 classes, C 8, 5 cells
    python examples/darts_search.py --steps 60 --C 8   # explicit options win over either

The quick default takes about 15 s of CPU and shows the search working: the training loss
falls, the architecture parameters move, and the supernet classifies the validation half of
each class (images the weights never train on) well above chance; it then derives the genotype
and builds the discrete network. ``--full`` takes about 80 s of CPU. One torch thread by
default (``--threads 0`` for torch's default): on a machine that other jobs share, OpenMP
threads spin-wait for a core and two threads can be many times slower than one.
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

QUICK = {"steps": 15, "batch": 16, "C": 4, "layers": 3, "classes": 5}
FULL = {"steps": 30, "batch": 32, "C": 8, "layers": 5, "classes": 10}


def main(argv: list[str] | None = None) -> list[float]:
    """Runs the search, prints the genotype, builds the discrete network and returns the
    training losses of every step; asserts that the architecture moved, that the supernet
    beats chance on the validation half and that the network runs."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--full", action="store_true",
                        help=f"the full-size run, {FULL}; explicit options still win")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--order", choices=["first", "second"], default="first")
    parser.add_argument("--batch", type=int)
    parser.add_argument("--C", type=int, help="initial channels")
    parser.add_argument("--layers", type=int, help="cells (two of them reduce)")
    parser.add_argument("--classes", type=int)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (0: torch's default, one per core)")
    parser.set_defaults(**(FULL if parser.parse_known_args(argv)[0].full else QUICK))
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)

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
        if step % 5 == 0 or step == args.steps - 1:
            print(f"step {step:3d}  train loss {float(value):.3f}")

    moved = max(float((arch[n] - arch0[n]).abs().max()) for n in arch)
    assert moved > 0 and all(math.isfinite(v) for v in losses), (moved, losses)
    k = max(1, len(losses) // 4)
    print(f"train loss {sum(losses[:k]) / k:.3f} (first {k} steps) -> "
          f"{sum(losses[-k:]) / k:.3f} (last {k});  largest alpha change {moved:.3f}")
    with torch.no_grad():  # batch statistics, as in the search steps
        logits, _ = model.apply({**weights, **arch}, state, data.val_x, train=True)
    accuracy = float((logits.argmax(-1) == data.val_y).float().mean())
    chance = 1 / data.num_classes
    print(f"supernet accuracy on the validation half: {accuracy:.2f} (chance {chance:.2f})")
    if args.steps >= 5:  # a few steps already lift it clear of chance
        assert accuracy > 2 * chance, f"validation accuracy {accuracy:.2f}, chance {chance:.2f}"
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
