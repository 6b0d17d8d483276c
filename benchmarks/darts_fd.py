"""The paper's finite-difference hypergradient against the exact one, on DARTS' ops and on
smooth ones.

Second-order DARTS differentiates the validation loss through one unrolled weight step,
``d/da L_val(w'(a), a)``. funcgraph computes it exactly (``hypergradient(method="exact")``: a
``torch.func.vjp`` through the inner gradient) or as the paper does
(``"finite-difference"``): the mixed second derivative ``grad_a grad_w L_train . v`` as a
central difference of ``grad_a L_train`` between ``w +- eps v``, ``eps = radius / ||v||``.
A central difference is accurate to O(radius^2) only where the function is smooth over the
interval; a ReLU that changes sign or a max pool whose argmax moves between ``w+`` and ``w-``
puts a kink inside it.

For each op set and each radius, on one fresh float64 supernet and one pair of batches of
glyph halves (``epoch_batches``' first step), through the same ``arch_gradient`` the search
step calls (``BilevelConfig.paper()``, second order):

- ``fd_max``: max-abs error of the finite-difference hypergradient / max-abs exact entry;
- ``fd_l2``: its relative L2 error, ``||fd - exact|| / ||exact||``;
- ``cd``: a central difference of the unrolled validation loss itself,
  ``(f(a + r d) - f(a - r d)) / 2r`` with ``f(a) = L_val(w'(a), a)`` and ``d`` a random unit
  direction over the architecture logits, against the exact hypergradient's directional
  derivative ``exact . d``: ``|cd - exact . d| / |exact . d|``. It checks the exact value
  with a difference taken in architecture space.

Op sets: ``darts``, DARTS' eight ops (ReLU, max pool); ``smooth``, the same supernet with
every ReLU a SiLU (the candidate ops' and the cells' input preprocessing, which no search
space reaches) and, in the max pool's column, an average pool (followed by the same
non-affine batch norm the search puts after a built-in pool).

    OMP_NUM_THREADS=1 python benchmarks/darts_fd.py [--C 4] [--layers 5] [--batch 16]
                                                    [--radii 1e-1,1e-2,1e-3,1e-4] [--record]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from funcgraph import Model, random
from funcgraph.nas import (
    PRIMITIVES,
    BilevelConfig,
    ImageBatch,
    Primitive,
    arch_gradient,
    epoch_batches,
    is_arch,
    search_network,
    unrolled_weights,
)
from funcgraph.nas.ops import avg_pool_3x3
from funcgraph.nn import batch_norm, serial
from funcgraph.params import Params, partition
from funcgraph.params import to as params_to

D = torch.float64
RADII = (1e-1, 1e-2, 1e-3, 1e-4)


def smooth_pool(c: int, stride: int) -> Model:
    """An average pool and a non-affine batch norm: what the search builds for a built-in
    pool (``funcgraph.nas.mixed.search_op``), as a user op for the max pool's column."""
    return serial(avg_pool_3x3(stride), batch_norm(c, affine=False))


SPACES: dict[str, Sequence[Primitive]] = {
    "darts": PRIMITIVES,
    "smooth": [("smooth.avg_pool_3x3", smooth_pool) if name == "max_pool_3x3" else name
               for name in PRIMITIVES],
}


class SiLUForReLU(TorchFunctionMode):
    """Inside it, every ``F.relu`` / ``torch.relu`` call is ``F.silu``: the cells' input
    preprocessing (ReLU-conv-BN, the factorized reduce) is not a candidate op, so only a
    mode at torch's function level changes its activation. It composes with torch.func."""

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        if func in (F.relu, torch.relu):
            return F.silu(args[0])
        return func(*args, **(kwargs or {}))


@contextmanager
def activation(space: str) -> Iterator[None]:
    with SiLUForReLU() if space == "smooth" else nullcontext():
        yield


def flat(g: Params) -> Tensor:
    return torch.cat([g[n].flatten() for n in sorted(g)])


def measure(space: str, train: ImageBatch, val: ImageBatch, *, C: int, layers: int,
            num_classes: int, radii: Sequence[float] = RADII, seed: int = 0
            ) -> list[dict[str, Any]]:
    """One row per radius for the op set ``space`` (``"darts"`` or ``"smooth"``) on a fresh
    float64 supernet of ``C`` and ``layers`` at key ``seed``: the finite-difference
    hypergradient's errors (``fd_max``, ``fd_l2``) and the unrolled loss's central
    difference's (``cd``) against the exact hypergradient, as the module docstring says."""
    model = search_network(C, layers, num_classes, in_channels=int(train[0].shape[1]),
                           primitives=SPACES[space])
    params, state = model.init(random.key(seed))
    params, state = params_to(params, dtype=D), params_to(state, dtype=D)
    arch, weights = partition(params, is_arch)
    train = (train[0].to(D), train[1])
    val = (val[0].to(D), val[1])

    def loss(w: Params, a: Params, batch: ImageBatch) -> Tensor:
        logits, _ = model.apply({**w, **a}, state, batch[0], train=True)
        return F.cross_entropy(logits, batch[1])

    cfg = BilevelConfig.paper(order="second")
    opt_state = cfg.weight_optimizer().init(weights)

    def second_order(**method: Any) -> Tensor:
        return flat(arch_gradient(loss, weights, arch, train, val,
                                  config=dataclasses.replace(cfg, **method),
                                  opt_state=opt_state, lr=cfg.w_lr))

    def unrolled_loss(a: Params) -> float:
        w2 = unrolled_weights(loss, weights, a, train, optimizer=cfg.weight_optimizer(),
                              opt_state=opt_state, lr=cfg.w_lr)
        return float(loss(w2, a, val))

    names = sorted(arch)
    d = {n: random.normal(random.fold_in(random.key(seed + 1), i), arch[n].shape, dtype=D)
         for i, n in enumerate(names)}
    norm = math.sqrt(sum(float(t.square().sum()) for t in d.values()))
    d = {n: t / norm for n, t in d.items()}  # a unit direction over every logit

    rows = []
    with activation(space):
        exact = second_order(hypergradient="exact")
        directional = float(exact @ flat(d))
        for r in radii:
            fd = second_order(hypergradient="finite-difference", fd_radius=r)
            plus = unrolled_loss({n: arch[n] + r * d[n] for n in names})
            minus = unrolled_loss({n: arch[n] - r * d[n] for n in names})
            cd = (plus - minus) / (2 * r)
            rows.append({
                "ops": space, "radius": r,
                "fd_max": float((fd - exact).abs().max() / exact.abs().max()),
                "fd_l2": float((fd - exact).norm() / exact.norm()),
                "cd": abs(cd - directional) / abs(directional),
                "exact_max_abs": float(exact.abs().max()), "exact_dot_d": directional,
                "C": C, "layers": layers, "batch": int(train[1].shape[0]),
            })
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--C", type=int, default=4, help="initial channels")
    parser.add_argument("--layers", type=int, default=5, help="cells (two of them reduce)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--radii", default=",".join(f"{r:g}" for r in RADII),
                        help="radii, comma-separated")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from funcgraph.runs import class_halves

    data = class_halves(num_classes=args.classes)
    _, batches = epoch_batches(data, args.batch, args.seed)
    train, val = batches(0)
    radii = [float(r) for r in args.radii.split(",")]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), float64, "
          f"C={args.C}, {args.layers} cells, batch {args.batch}, {args.classes} glyph classes")
    print(f"{'ops':>7} {'radius':>7} {'fd max-abs':>11} {'fd L2':>9} {'loss cd':>9}")
    rows = []
    for space in SPACES:
        start = time.process_time()
        got = measure(space, train, val, C=args.C, layers=args.layers,
                      num_classes=data.num_classes, radii=radii, seed=args.seed)
        cpu = time.process_time() - start
        for row in got:
            row["cpu_s"] = round(cpu, 1)
            print(f"{row['ops']:>7} {row['radius']:>7g} {row['fd_max']:>11.3g} "
                  f"{row['fd_l2']:>9.3g} {row['cd']:>9.2g}")
            print(json.dumps(row))
        rows += got
    return rows


if __name__ == "__main__":
    from records import recorded  # benchmarks/records.py: --record appends a record

    recorded("darts_fd")(main)()
