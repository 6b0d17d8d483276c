"""Export your own ``torch.nn.Module`` (batch norm included) after training it functionally.

1. convert it (``funcgraph.from_module``) and train a few steps with ``train=True``: the
   batch-norm running statistics come back as new state each step;
2. export the model with the trained params and running statistics in evaluation mode
   (``funcgraph.export.export``), where batch norm uses the running statistics, so each
   sample's output depends on that sample alone;
3. save it as a ``.pt2`` file and load it back, with funcgraph (``funcgraph.export.load``,
   which checks inputs) or with plain torch (``torch.export.load(path).module()``).

The script checks that the exported program equals the eager model at several batch sizes,
and that a sample's output is the same alone and inside a batch.

    python examples/export_own_model.py     # about 5 s
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from torch import Tensor, nn

import funcgraph as fg
from funcgraph.export import export, load
from funcgraph.train import sgd


class MyNet(nn.Module):
    """Your module: conv -> batch norm (running statistics) -> ReLU -> pooled linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4),
                                      nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(4, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None, help="where to save the .pt2")
    args = parser.parse_args(argv)

    # 1. train functionally; the running statistics are returned as state
    model = fg.from_module(MyNet())
    params, state = model.init(fg.random.key(0))
    images = fg.random.normal(fg.random.key(1), (32, 1, 8, 8))
    labels = fg.random.randint(fg.random.key(2), (32,), 0, 3)
    opt = sgd(0.1)
    opt_state = opt.init(params)

    def loss(p: fg.Params, s: fg.State) -> tuple[Tensor, fg.State]:
        logits, new_state = model.apply(p, s, images, train=True)
        return torch.nn.functional.cross_entropy(logits, labels), new_state

    for _ in range(args.steps):
        grads, state = torch.func.grad(loss, has_aux=True)(params, state)
        params, opt_state = opt.update(params, grads, opt_state)
    print(f"trained {args.steps} steps; batch norm has seen "
          f"{int(state['features.1.num_batches_tracked'])} batches")

    # 2. export in evaluation mode with the trained params and running statistics
    program = export(model, params, state, images[:4])

    # 3. save, load back, compare with the eager model
    with tempfile.TemporaryDirectory() as tmp:
        path = args.out or Path(tmp) / "my_net.pt2"
        fg.export.save(program, path, model=model, example_inputs=(images[:4],))
        for runner, how in ((load(path), "funcgraph.export.load"),
                            (torch.export.load(str(path)).module(), "torch.export.load")):
            for batch in (1, 5, 32):
                want, _ = model.apply(params, state, images[:batch])
                torch.testing.assert_close(runner(images[:batch]), want, rtol=1e-5, atol=1e-6)
            print(f"{how}: equals the eager model at batch sizes 1, 5 and 32")
    alone = program.module()(images[3:4])
    in_batch = program.module()(images)[3:4]
    torch.testing.assert_close(alone, in_batch, rtol=1e-5, atol=1e-6)
    print("sample 3 alone and inside a batch of 32: the same output (running statistics)")


if __name__ == "__main__":
    main()
