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


def main() -> tuple[str, bool]:
    """Returns the finite check's message for the naive loss and whether the stable loss's
    gradients are all finite; asserts what the example shows."""
    params, _ = model.init(random.key(0))
    params = {n: t * 40 for n, t in params.items()}  # an over-confident network
    x = random.normal(random.key(1), (8, 4)) * 10
    y = random.randint(random.key(2), (8,), 0, 3)
    print("naive loss:", naive_loss(params, x, y).item())
    message = ""
    try:
        with finite_check():
            torch.func.grad(naive_loss)(params, x, y)
    except NonFiniteError as e:
        message = str(e)
        print("finite_check:", e)
    assert message.startswith("aten.log ") and "naive_loss" in message, (
        f"the finite check must stop at the log in naive_loss, said {message!r}")
    with finite_check():
        grads = torch.func.grad(stable_loss)(params, x, y)
    finite = all(bool(g.isfinite().all()) for g in grads.values())
    print("stable loss:", stable_loss(params, x, y).item(), "| all gradients finite:", finite)
    assert finite, "log_softmax (inside cross_entropy) keeps every gradient finite"
    return message, finite


if __name__ == "__main__":
    main()
