"""A meta-learner written from scratch (not a wrapper of maml): a ridge-regression head.

R2-D2 (Bertinetto et al., 2019, "Meta-learning with differentiable closed-form solvers")
embeds a task's support images, fits a ridge-regression classifier on them in closed form,
and scores the queries with it; the meta-gradient flows through the solve into the
embedding. No inner gradient steps: the solve is the adaptation. Everything a
:class:`funcgraph.meta.MetaLearner` must be (the contract in docs/design.md, "Adding an
algorithm") is here in one screen:

* ``task_grad(meta_params, task) -> (grads, loss, metric)`` and ``task_eval(meta_params,
  task) -> (loss, metric)``, pure functions of one task that ``vmap`` can map (no Python
  branch on a tensor value, nothing mutated), with a gradient for every meta-param name;
* ``init`` (model params -> meta-params; here the identity), the ``objective``, the typed
  ``settings``, ``uses_keys`` and ``model`` from :func:`funcgraph.meta.binding.check_apply`,
  which also takes an ``nn.Module`` or a Model as the built-in learners do.

Registered as ``ridge``, so the command line trains it too::

    funcgraph meta-train --import own_learner --algo ridge --setting penalty=0.5 --set ways=null

(run from examples/, or with examples/ on PYTHONPATH; ``ways=null`` drops conv4's head, so the
ridge head sits on the 64-wide embedding as ProtoNet's prototypes do).

    python examples/own_learner.py               # a few seconds of CPU once glyphs are cached
    python examples/own_learner.py --steps 300
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import funcgraph as fg
from funcgraph.checks import check_int, check_rate
from funcgraph.meta import MetaLearner, Task, TaskInfo, objective, register_algorithm
from funcgraph.meta.binding import check_apply
from funcgraph.meta.learner import call, query_key, support_keys, task_grad_of
from funcgraph.meta.registry import algorithm_names
from funcgraph.meta.settings import Settings
from funcgraph.params import Params


@dataclass(frozen=True)
class RidgeSettings(Settings):
    """``penalty``: the ridge penalty (> 0); ``scale``: the logits' temperature (> 0)."""

    OWNER = "ridge"
    penalty: float = 1.0
    scale: float = 10.0

    def check(self) -> None:
        check_rate(self.OWNER, "penalty", self.penalty)
        check_rate(self.OWNER, "scale", self.scale)


def ridge(embed: Any, *, ways: int, settings: RidgeSettings = RidgeSettings()) -> MetaLearner:
    """The learner over an embedding ``embed`` (a function, Model or ``nn.Module``)."""
    checked = check_apply(embed, "ridge")
    check_int("ridge", "ways", ways, minimum=2)
    penalty, scale = settings.penalty, settings.scale

    def task_loss(meta_params: Params, task: Task) -> tuple[Tensor, Tensor]:
        sx, sy, qx, qy = task
        z_s = call(checked.apply, meta_params, sx, support_keys(task.key, 1)[0]).flatten(1)
        z_q = call(checked.apply, meta_params, qx, query_key(task.key)).flatten(1)
        # One-hot by comparison: F.one_hot reads the labels' maximum, which vmap cannot.
        targets = (sy[:, None] == torch.arange(ways, device=sy.device)).to(z_s.dtype)
        # The dual form: an (n, n) system for n support images, cheaper than (d, d) when the
        # embedding is wider than the support set.
        gram = z_s @ z_s.T + penalty * torch.eye(z_s.shape[0], dtype=z_s.dtype, device=z_s.device)
        weights = z_s.T @ torch.linalg.solve(gram, targets)  # (d, ways)
        logits = scale * (z_q @ weights)
        return F.cross_entropy(logits, qy), (logits.argmax(-1) == qy).to(z_q.dtype).mean()

    return MetaLearner("ridge", init=lambda p: dict(p), task_grad=task_grad_of(task_loss),
                       task_eval=task_loss, objective=objective("classification"),
                       settings=settings, uses_keys=checked.uses_keys, model=checked.model)


def build_ridge(apply: Any, settings: RidgeSettings, info: TaskInfo) -> MetaLearner:
    """The registry's builder: the run's bound model and the tasks' ways."""
    assert info.ways is not None  # kinds=("classification",): the run checks it
    return ridge(apply, ways=info.ways, settings=settings)


if "ridge" not in algorithm_names():  # importing twice (tests, --import) registers once
    register_algorithm("ridge", settings=RidgeSettings, build=build_ridge,
                       kinds=("classification",),
                       summary="ridge-regression head solved on each task's support set (R2-D2)")


class Embedding(nn.Module):
    """Your embedding: a tiny CNN for 16x16 glyphs, 32 features."""

    def __init__(self, hidden: int = 16) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, hidden, 3, stride=2, padding=1), nn.BatchNorm2d(hidden), nn.ReLU(),
            nn.Conv2d(hidden, hidden, 3, stride=2, padding=1), nn.BatchNorm2d(hidden), nn.ReLU(),
            nn.AdaptiveAvgPool2d(2), nn.Flatten())

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


def main(argv: list[str] | None = None) -> tuple[float, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--meta-batch", type=int, default=4)
    parser.add_argument("--episodes", type=int, default=25)
    args = parser.parse_args(argv)

    trainer = fg.meta.MetaTrainer(ridge(Embedding(), ways=5))
    state = trainer.init(fg.random.key(0))
    held_out = fg.meta.tasks("glyphs", "5way1shot", split="test", batch=args.episodes,
                             count=1, image_size=16)
    before = trainer.evaluate(state, held_out)
    for tasks in fg.meta.tasks("glyphs", "5way1shot5query", batch=args.meta_batch,
                               count=args.steps, image_size=16):
        state, _ = trainer.step(state, tasks)
    after = trainer.evaluate(state, held_out)
    print(f"ridge head, held-out 5-way 1-shot: {before} before, {after} after {state.step} "
          "meta-steps")
    return before.mean, after.mean


if __name__ == "__main__":
    main()
