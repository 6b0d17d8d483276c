"""See what a dynamic network actually ran: executed graphs of a stochastic-depth ResNet.

Evaluation runs every block; in training each key drops a different set of residual bodies,
and ``diff`` of two captures names them. Also prints the slowest ops of one forward pass.

Run: python examples/inspect_graph.py [--depth 20] [--mermaid graph.mmd]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from funcgraph import random
from funcgraph.debug import capture, diff, render, trace
from funcgraph.models.resnet import resnet


@dataclass(frozen=True)
class Seen:
    """What the example measured: op counts of the eval graph and of two training draws, and
    the residual bodies each draw ran alone."""

    eval_ops: int
    train_ops: tuple[int, int]
    only_a: tuple[str, ...]
    only_b: tuple[str, ...]


def main(argv: list[str] | None = None) -> Seen:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--depth", type=int, default=20, help="ResNet depth, 6n + 2")
    parser.add_argument("--mermaid", type=Path, help="also write the eval graph as Mermaid")
    args = parser.parse_args(argv)

    model = resnet(args.depth, num_classes=10, in_channels=3, width=8)
    params, state = model.init(random.key(0))
    x = random.normal(random.key(1), (2, 3, 16, 16))

    full = capture(model.apply, params, state, x)
    print(f"eval graph: {len(full)} ops; by stage:")
    print(render.text(full.collapse(1)))

    a = capture(model.apply, params, state, x, key=random.key(10), train=True)
    b = capture(model.apply, params, state, x, key=random.key(11), train=True)
    d = diff(a, b)
    print("\ntrain, key 10 vs key 11:")
    print("  blocks that ran only with key 10:", list(d.blocks_only_a) or "none")
    print("  blocks that ran only with key 11:", list(d.blocks_only_b) or "none")
    print(f"  ops only in one of them: {len(d.only_a)} / {len(d.only_b)}")

    # Evaluation runs every block; a training draw runs a subset, so never more ops.
    assert len(a) <= len(full) and len(b) <= len(full), (len(full), len(a), len(b))
    assert set(d.blocks_only_a).isdisjoint(d.blocks_only_b)
    assert bool(d.only_a) == bool(d.blocks_only_a) and bool(d.only_b) == bool(d.blocks_only_b)

    t = trace(model.apply)(params, state, x)
    total: dict[str, float] = {}
    for r in t.ops:
        total[r.op] = total.get(r.op, 0.0) + r.elapsed_s
    print(f"\nslowest op kinds of one eval forward ({len(t)} ops):")
    for op, seconds in sorted(total.items(), key=lambda kv: -kv[1])[:5]:
        print(f"  {op:<28} {seconds * 1e3:8.3f} ms")

    if args.mermaid is not None:
        args.mermaid.write_text(render.mermaid(full.collapse(2)) + "\n")
        print(f"\nwrote {args.mermaid}")
    return Seen(len(full), (len(a), len(b)), tuple(d.blocks_only_a), tuple(d.blocks_only_b))


if __name__ == "__main__":
    main()
