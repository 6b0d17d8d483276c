"""Stochastic depth (Huang et al., "Deep Networks with Stochastic Depth", ECCV 2016).

In training, a residual block ``y = post(shortcut(x) + body(x))`` keeps its body with
probability ``1 - drop_prob`` and otherwise reduces to ``y = post(shortcut(x))``.

Choices, and why:

- **Inverted scaling.** A kept body is scaled by ``1 / survival`` in training and evaluation
  runs the plain block ``post(shortcut(x) + body(x))``. The expectation of the training output
  (for a fixed input, over keys, before ``post``) equals the evaluation output, and evaluation
  needs no probability at all, so changing the drop probabilities over training (``warmup``)
  never changes what evaluation computes. (The paper scales by survival at inference; the two
  agree in expectation.)
- **Modes.** ``"batch"``: one draw per call; a dropped body is **not computed** (a Python
  branch on the drawn value), so training gets faster. ``"row"``: one draw per sample, the body
  runs on the whole batch and dropped rows are masked (no speed-up; lower-variance gradients).
- **Under ``vmap`` over keys** (or while exporting), ``"batch"`` mode cannot branch in Python,
  because each member has its own draw: it computes the body and selects (``torch.where``) the
  output and the body's new state per member. Results equal a loop over the keys.
- **Which blocks ran** is returned functionally in the block's state under the reserved name
  ``"ran"``: the fraction of samples whose body ran in that call (``0.`` or ``1.`` in batch
  mode, ``1.`` in evaluation). It is an output only (its input value is ignored) and it
  travels through ``serial``/``composite`` like any state, so :func:`blocks_ran` reads every
  block of a whole network from its returned state.
- **Randomness only from the key**: the draw uses the composite's own key, independent of the
  keys the body and shortcut receive.

Drop probabilities over depth: :func:`linear_decay` gives the paper's linear rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from .. import random
from ..checks import check_fraction, check_sizes
from ..control import is_batched
from ..errors import ConfigError, KeyMissingError
from ..model import Model
from ..params import Params, State
from ..random import Key
from .compose import Children, composite

Mode = Literal["batch", "row"]
RAN = "ran"
"""Reserved state name: fraction of the batch whose body ran in the last call."""
STEP = "step"
"""Reserved state name (with ``warmup``): number of training calls so far."""


def linear_decay(num_blocks: int, final_drop_prob: float = 0.5) -> list[float]:
    """Drop probability of blocks ``1..L``: ``l / L * final_drop_prob`` (the paper's rule).

    The paper writes it as survival ``p_l = 1 - l/L (1 - p_L)`` with ``p_L = 0.5`` the last
    block's *survival*; here every name is a drop probability, so the first block is dropped
    least and the last with ``final_drop_prob``.
    """
    check_sizes("linear_decay", num_blocks=num_blocks)
    check_fraction("linear_decay", "final_drop_prob", final_drop_prob)
    return [l / num_blocks * final_drop_prob for l in range(1, num_blocks + 1)]


@dataclass(frozen=True)
class Warmup:
    """A drop-probability schedule over training: the drop probability starts at
    ``start_scale * drop_prob`` and rises linearly to ``drop_prob`` over ``steps`` training
    calls, then stays. Survival 0.9 -> 0.8 is ``drop_prob=0.2, Warmup(steps, 0.5)``.

    The count of training calls lives in the block's state (``"step"``), so it checkpoints,
    resumes and vmaps with the rest of the state.
    """

    steps: int
    start_scale: float = 0.0

    def __post_init__(self) -> None:
        check_sizes("Warmup", steps=self.steps)
        check_fraction("Warmup", "start_scale", self.start_scale, allow_one=True)

    def scale(self, step: Tensor) -> Tensor:
        """The drop-probability multiplier after ``step`` training calls (a float tensor)."""
        frac = (step.to(torch.float32) / self.steps).clamp(max=1.0)
        return self.start_scale + (1.0 - self.start_scale) * frac


def stochastic_depth(
    body: Model,
    drop_prob: float,
    *,
    shortcut: Model | None = None,
    post: Model | None = None,
    mode: Mode = "batch",
    warmup: Warmup | None = None,
    name: str = "stochastic_depth",
) -> Model:
    """A residual block ``post(shortcut(x) + b * body(x) / survival)`` with ``b`` drawn in training.

    Arguments:
        body: the residual branch; params under ``"body."``.
        drop_prob: probability in ``[0, 1)`` that the body is skipped in a training call (see
            :func:`linear_decay` for a whole network).
        shortcut: the skip path (``None``: identity); params under ``"shortcut."``.
        post: applied after the sum (``relu`` in a ResNet); params under ``"post."``.
        mode: ``"batch"`` (one draw per call, a dropped body is not computed) or ``"row"``
            (one draw per sample).
        warmup: optional schedule of the drop probability over training calls.
    Apply:
        ``x (B, ...)`` -> ``y``; training with ``drop_prob > 0`` needs a ``key``. The new state
        holds ``"ran"`` (see the module docstring) and, with ``warmup``, ``"step"``.

    Example::

        block = stochastic_depth(serial(conv2d(16, 16, 3, padding=1), relu()), 0.2, post=relu())
        y, state = block.apply(params, state, x, key=funcgraph.random.key(0), train=True)
        ran = blocks_ran(state)   # {"": tensor(1.)} or {"": tensor(0.)}
    """
    check_fraction("stochastic_depth", "drop_prob", drop_prob)
    if mode not in ("batch", "row"):
        raise ConfigError(f"stochastic_depth: mode must be 'batch' or 'row', got {mode!r}")
    children = {"body": body}
    if shortcut is not None:
        children["shortcut"] = shortcut
    if post is not None:
        children["post"] = post

    def own_init(key: Key) -> tuple[Params, State]:
        state = {RAN: torch.ones(())}
        if warmup is not None:
            state[STEP] = torch.zeros((), dtype=torch.int64)
        return {}, state

    def survival(run: Children) -> Tensor | float:
        if warmup is None:
            return 1.0 - drop_prob
        step = run.new_state[STEP]
        run.new_state[STEP] = step + 1
        return 1.0 - drop_prob * warmup.scale(step)

    def forward(run: Children, x: Tensor) -> Tensor:
        skip = run("shortcut", x) if shortcut is not None else x
        if not run.train or drop_prob == 0.0:
            out = skip + run("body", x)
            ran: Tensor = torch.ones((), device=x.device)
        else:
            if run.own_key is None:
                raise KeyMissingError(
                    f"{name}: training mode needs a key to draw which blocks run; call "
                    "apply(..., key=funcgraph.random.key(0), train=True) or pass train=False"
                )
            keep_prob = survival(run)
            if mode == "row":
                u = random.uniform(run.own_key, (x.shape[0],)).to(x.device)
                keep = u < keep_prob  # (B,)
                branch = run("body", x)
                scale = keep.to(branch.dtype).reshape(-1, *([1] * (branch.dim() - 1)))
                out = skip + branch * scale / keep_prob
                ran = keep.to(torch.float32).mean()
            else:
                keep = random.uniform(run.own_key, ()).to(x.device) < keep_prob  # ()
                out = _batch_draw(run, x, skip, keep, keep_prob)
                ran = keep.to(torch.float32)
        run.new_state[RAN] = ran
        return run("post", out) if post is not None else out

    return composite(name, children, forward, own_init=own_init, drop_prob=drop_prob,
                     mode=mode)


def _batch_draw(run: Children, x: Tensor, skip: Tensor, keep: Tensor,
                keep_prob: Tensor | float) -> Tensor:
    """``skip + body(x) / keep_prob`` if ``keep`` else ``skip``: a Python branch when the draw
    is one value, a select of output and body state when it varies across a ``vmap``."""
    if not (is_batched(keep) or torch.compiler.is_compiling()):
        return skip + run("body", x) / keep_prob if bool(keep) else skip
    before = {n: t for n, t in run.new_state.items() if n.startswith("body.")}
    branch = run("body", x)
    for n, old in before.items():
        run.new_state[n] = torch.where(keep, run.new_state[n], old)
    return skip + torch.where(keep, branch / keep_prob, torch.zeros_like(branch))


def blocks_ran(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The reserved ``"ran"`` entries of every stochastic-depth block in a returned state, by
    block name (``{"layer1.0": tensor(1.), ...}``; ``""`` for a block that is the whole model)."""
    out: dict[str, Tensor] = {}
    for n, t in state.items():
        if n == RAN:
            out[""] = t
        elif n.endswith("." + RAN):
            out[n[: -len(RAN) - 1]] = t
    return out


def ran_metrics(state: Mapping[str, Tensor]) -> dict[str, Any]:
    """Summary metrics of :func:`blocks_ran`: ``blocks_ran`` (sum: blocks whose body ran,
    averaged over samples) and ``blocks`` (their number); empty without stochastic blocks."""
    ran = blocks_ran(state)
    if not ran:
        return {}
    return {"blocks_ran": float(sum(float(t.float().mean()) for t in ran.values())),
            "blocks": len(ran)}


__all__ = ["RAN", "STEP", "Warmup", "blocks_ran", "linear_decay", "ran_metrics",
           "stochastic_depth"]
