"""Find where a NaN/Inf is born: ``finite_check`` names the first op and your source line.

A cross-entropy written as ``log(softmax(z))`` underflows to ``log(0) = -inf`` for confident
logits; the finite check stops at that ``log`` (in the forward, or in the backward under
``torch.func.grad``), and ``log_softmax`` fixes it.

Run: python examples/inspect_nan.py
"""

from __future__ import annotations

import torch

from funcgraph import nn, random
from funcgraph.debug import NonFiniteError, finite_check

model = nn.serial({"fc1": nn.linear(4, 16), "act": nn.relu(), "fc2": nn.linear(16, 3)})


def naive_loss(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    z, _ = model.apply(params, {}, x)
    p = torch.softmax(z, dim=1)
    return -torch.log(p[torch.arange(len(y)), y]).mean()  # underflows for confident logits


def stable_loss(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    z, _ = model.apply(params, {}, x)
    return torch.nn.functional.cross_entropy(z, y)


def main() -> None:
    params, _ = model.init(random.key(0))
    params = {n: t * 40 for n, t in params.items()}  # an over-confident network
    x = random.normal(random.key(1), (8, 4)) * 10
    y = random.randint(random.key(2), (8,), 0, 3)
    print("naive loss:", naive_loss(params, x, y).item())
    try:
        with finite_check():
            torch.func.grad(naive_loss)(params, x, y)
    except NonFiniteError as e:
        print("finite_check:", e)
    with finite_check():
        grads = torch.func.grad(stable_loss)(params, x, y)
    print("stable loss:", stable_loss(params, x, y).item(),
          "| all gradients finite:", all(bool(g.isfinite().all()) for g in grads.values()))


if __name__ == "__main__":
    main()
