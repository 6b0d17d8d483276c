"""MAML on your own ``torch.nn.Module``, batch norm included, the short way: four funcgraph
names.

1. ``fg.meta.maml(module)``: the learner converts the module and binds it for training itself
   (batch norm on each task's own batch statistics, as in MAML);
2. ``fg.meta.MetaTrainer(learner)``: Adam at MAML's meta learning rate over one frozen state
   record; ``init(key)`` draws the params, ``step`` is one meta-step, ``evaluate`` scores
   held-out tasks with a 95% interval;
3. ``fg.meta.tasks("glyphs", "5way1shot", ...)``: meta-batches of a named data set (here its
   16x16 images), drawn inside from a seed; the held-out ones come from the evaluation
   alphabets, which meta-training never sees;
4. ``fg.random.key(0)``: the one key, from which the params come.

The long path, with every piece in hand (keys, optimiser, strategy), is
``examples/maml_own_module.py``; docs/meta-learning.md says when to take it.

    python examples/maml_short.py                  # a few seconds of CPU once the glyphs
    python examples/maml_short.py --steps 500      # are generated and cached
"""

from __future__ import annotations

import argparse

from torch import Tensor, nn

import funcgraph as fg


class Net(nn.Module):
    """Your module: a tiny CNN for 16x16 glyphs, batch norm with running statistics included."""

    def __init__(self, ways: int = 5, hidden: int = 16) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, hidden, 3, stride=2, padding=1), nn.BatchNorm2d(hidden), nn.ReLU(),
            nn.Conv2d(hidden, hidden, 3, stride=2, padding=1), nn.BatchNorm2d(hidden), nn.ReLU(),
            nn.Flatten(), nn.Linear(hidden * 4 * 4, ways))  # (B, hidden, 4, 4) -> (B, ways)

    def forward(self, x: Tensor) -> Tensor:  # x: (B, 1, 16, 16)
        return self.net(x)


def main(argv: list[str] | None = None) -> tuple[float, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--meta-batch", type=int, default=4)
    parser.add_argument("--episodes", type=int, default=25)
    args = parser.parse_args(argv)

    # --- the user code ------------------------------------------------------------------
    learner = fg.meta.maml(Net())                       # second order, inner rate 0.5
    trainer = fg.meta.MetaTrainer(learner)
    state = trainer.init(fg.random.key(0))
    held_out = fg.meta.tasks("glyphs", "5way1shot", split="test", batch=args.episodes,
                             count=1, image_size=16)
    before = trainer.evaluate(state, held_out)
    train = fg.meta.tasks("glyphs", "5way1shot1query", batch=args.meta_batch,
                          count=args.steps, image_size=16)
    for tasks in train:
        state, metrics = trainer.step(state, tasks)
    after = trainer.evaluate(state, held_out)
    # -------------------------------------------------------------------------------------

    print(f"held-out 5-way 1-shot {before} before, {after} after {state.step} meta-steps "
          f"(last meta-batch: query loss {float(metrics.loss):.3f})")
    assert after.mean > before.mean, "meta-training must raise the held-out accuracy"
    return before.mean, after.mean


if __name__ == "__main__":
    main()
