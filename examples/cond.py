"""Data-dependent branching as a pure function: ``funcgraph.cond`` in eager code, under ``grad``,
under ``vmap`` (a batched predicate runs both branches) and in a ``torch.export`` program.

Run: python examples/cond.py
"""

from __future__ import annotations

import argparse

import torch

from funcgraph import random
from funcgraph.control import double_or_halve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-export", action="store_true", help="skip torch.export (~2 s)")
    args = parser.parse_args(argv)

    x = random.normal(random.key(0), (4,))
    print("x                    ", x.tolist())
    print("eager   double_or_halve", double_or_halve(x).tolist())
    grad = torch.func.grad(lambda v: double_or_halve(v).sum())(x)
    print("grad of sum          ", grad.tolist(), "(2 where the sum > 0, else 0.5)")
    rows = torch.stack([x.abs(), -x.abs()])  # one row takes each branch
    print("vmap over rows       ", torch.func.vmap(double_or_halve)(rows).tolist())
    if not args.no_export:

        class Seed(torch.nn.Module):
            def forward(self, v: torch.Tensor) -> torch.Tensor:
                return double_or_halve(v)

        program = torch.export.export(Seed(), (x,))
        ops = sorted({str(n.target) for n in program.graph.nodes if n.op == "call_function"})
        print("exported graph ops   ", ops)
        for v in (x.abs(), -x.abs()):
            assert torch.allclose(program.module()(v), double_or_halve(v))
        print("exported program agrees with eager on both branches")


if __name__ == "__main__":
    main()
