"""Early exit over your own blocks: the rows an exit is sure about stop there, the rest go on.

:func:`early_exit` runs ``blocks`` in order and gives block ``k``'s output to its head
``heads[k]`` (logits). At every block but the last, each row decides whether to continue;
only the rows that continue are gathered (``index_select``) into the next block, and every
row's logits are scattered back (``index_copy``) from the head where it stopped::

    h      = blocks[0](x)                         all B rows
    logits = heads[0](h)                          (B, classes)
    p      = 1 - max softmax(logits)              (B,) probability of continuing
             (or gates[0](h), a learned gate)
    go     = the rows that continue               see "decisions" below
    h      = blocks[1](h[go]) ...                 only the continuing rows, and so on;
                                                  the last head answers for the rows left

An exiting row costs nothing in the later blocks (a mask would compute it and throw it away).

Decisions. Without ``gates`` (the confidence rule) a row stops, in evaluation, when its exit
head's max softmax probability reaches ``threshold``. With ``gates`` (one Model per exit
mapping the block's output to a ``(rows,)`` continue probability in ``[0, 1]``) a row
continues, in evaluation, when that probability is above ``threshold``. Training samples
every decision instead: a row continues with probability ``p`` (drawn from the key, so
training needs one), every block and head trains on the rows that reach it, and
``threshold`` is not used.

The output is an :class:`ExitOutput` (``logits`` first, so a plain classification loss works
on it); :func:`early_exit_loss` also trains the exits. In evaluation a row's output does not
depend on the rest of the batch when the blocks' do not (batch norm in eval mode uses running
statistics). Shapes depend on the data, so the model runs eagerly and under ``grad``, not
under ``vmap`` or ``torch.export``; for export, two programs over the same params give the
same outputs with shapes that do not: :func:`per_sample_exits` (one sample, each decision a
``torch.cond`` whose exit branch skips the later blocks: the edge program) and
:func:`masked_exits` (any batch, every row through every block, each keeping the output of
its exit).

:func:`with_threshold` changes the threshold of a built model (same params) without
rebuilding it, e.g. to sweep the accuracy/cost trade-off after training.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import random
from ..checks import check_fraction
from ..control import cond
from ..errors import ArgumentTypeError, ConfigError, KeyMissingError, ShapeError
from ..model import Model
from ..params import Params, State
from ..random import Key
from .compose import Children, _named, composite


class ExitOutput(NamedTuple):
    """What an early-exit model returns, one row per input row.

    Attributes:
        logits: ``(B, classes)`` the logits of the head where the row stopped (the last head
            for rows that ran every block).
        exited: ``(B,)`` bool, True where the row stopped before the last block.
        continue_prob: ``(B,)`` the continue probability of the row's last decision: at the
            exit where it stopped, or at the last exit for rows that ran every block.
        exit_logits: ``(B, classes)`` the logits of the exit head of that decision; with two
            blocks, the one exit head's logits for every row.
    """

    logits: Tensor
    exited: Tensor
    continue_prob: Tensor
    exit_logits: Tensor


_OVERRIDE: ContextVar[float | None] = ContextVar("early_exit_threshold", default=None)
"""The threshold a :func:`with_threshold` model asks for. The first early exit its call runs
reads it and clears it for its own blocks and heads, whose early exits keep their thresholds."""


_FORM: ContextVar[str] = ContextVar("early_exit_form", default="eager")
"""How the first early exit a call runs computes: ``eager`` (continuing rows gathered),
``per_sample`` (one sample, decisions as ``cond``) or ``masked`` (every row, selected)."""


@contextmanager
def _form(form: str) -> Iterator[None]:
    token = _FORM.set(form)
    try:
        yield
    finally:
        _FORM.reset(token)


@contextmanager
def _override(threshold: float | None) -> Iterator[None]:
    token = _OVERRIDE.set(threshold)
    try:
        yield
    finally:
        _OVERRIDE.reset(token)


def _names(what: str, given: Sequence[Model] | Mapping[str, Model]) -> dict[str, Model]:
    """Children by name: a dict as given, a sequence as ``"<what>.0"``, ``"<what>.1"``... (the
    names an ``nn.ModuleList`` attribute called ``what`` would give)."""
    if isinstance(given, Mapping):
        return _named(f"early_exit: {what}", (given,))
    if not isinstance(given, Sequence) or isinstance(given, str):
        raise ArgumentTypeError(
            f"early_exit: {what} must be a sequence or a dict of name -> Model, got "
            f"{type(given).__name__}"
        )
    return {f"{what}.{n}": m for n, m in _named(f"early_exit: {what}", tuple(given)).items()}


def _checked_children(
    name: str,
    blocks: Sequence[Model] | Mapping[str, Model],
    heads: Sequence[Model] | Mapping[str, Model],
    gates: Sequence[Model] | Mapping[str, Model] | None,
) -> tuple[dict[str, Model], dict[str, Model], dict[str, Model]]:
    """The blocks, heads and gates by name (no gates: empty), refused unless there are two
    or more blocks, one head per block, one gate per exit and no name used twice."""
    block_models = _names("blocks", blocks)
    head_models = _names("heads", heads)
    gate_models = {} if gates is None else _names("gates", gates)
    n = len(block_models)
    if n < 2:
        raise ConfigError(f"{name}: needs at least 2 blocks (an exit sits between two), got {n}")
    if len(head_models) != n:
        raise ConfigError(f"{name}: needs one head per block ({n}), got {len(head_models)}")
    if gates is not None and len(gate_models) != n - 1:
        raise ConfigError(f"{name}: needs one gate per exit, i.e. per block but the last "
                          f"({n - 1}), got {len(gate_models)}")
    every_name = [*block_models, *head_models, *gate_models]
    twice = sorted({child for child in every_name if every_name.count(child) > 1})
    if twice:
        raise ConfigError(f"{name}: child names must differ across blocks, heads and gates; "
                          f"used twice: {twice}")
    return block_models, head_models, gate_models


def _running_order(block_models: dict[str, Model], head_models: dict[str, Model],
                   gate_models: dict[str, Model]) -> dict[str, Model]:
    """All children in the order they run: block, head(, gate) per block; the order of their
    init and keys, so the params match a module that declares them so."""
    block_names, head_names, gate_names = list(block_models), list(head_models), list(gate_models)
    children: dict[str, Model] = {}
    for k in range(len(block_names)):
        children[block_names[k]] = block_models[block_names[k]]
        children[head_names[k]] = head_models[head_names[k]]
        if gate_names and k < len(block_names) - 1:
            children[gate_names[k]] = gate_models[gate_names[k]]
    return children


@dataclass(frozen=True)
class _Exits:
    """An early exit's child names and the three programs that run them (the module
    docstring's eager, per-sample and masked forms), each a ``(run, x, threshold)`` function.

    Attributes:
        name: the model's name, in error messages.
        threshold: the threshold it was built with (a :func:`with_threshold` call overrides it).
        blocks: the block names in running order.
        heads: the head names, one per block.
        gates: the gate names, one per exit; empty for the confidence rule.
    """

    name: str
    threshold: float
    blocks: tuple[str, ...]
    heads: tuple[str, ...]
    gates: tuple[str, ...]

    @property
    def last(self) -> int:
        """The index of the last block (the one with no decision after it)."""
        return len(self.blocks) - 1

    def decide(
        self, run: Children, k: int, h: Any, logits: Tensor, threshold: float
    ) -> tuple[Tensor, Tensor]:
        """``(continue_prob, goes_on)`` at exit ``k`` for the rows of ``h``, given their logits:
        thresholded in evaluation, sampled (from the composite's own key) in training."""
        if self.gates:
            continue_prob = run(self.gates[k], h)
            if not isinstance(continue_prob, Tensor) or continue_prob.shape != logits.shape[:1]:
                got = (tuple(continue_prob.shape) if isinstance(continue_prob, Tensor)
                       else type(continue_prob).__name__)
                raise ShapeError(f"{self.name}: gate {self.gates[k]!r} must return one continue "
                                 f"probability per row, shape {tuple(logits.shape[:1])}, got {got}")
            goes_on = continue_prob > threshold
        else:
            confidence = logits.softmax(-1).amax(-1)
            continue_prob, goes_on = 1.0 - confidence, confidence < threshold
        if not run.train:
            return continue_prob, goes_on
        if run.own_key is None:
            raise KeyMissingError(
                f"{self.name}: training samples the exit decisions; call apply(..., "
                "key=funcgraph.random.key(0), train=True) or pass train=False"
            )
        key = run.own_key if k == 0 else random.fold_in(run.own_key, k)
        return continue_prob, random.uniform(key, continue_prob.shape).to(
            continue_prob.device) < continue_prob.detach()

    def eager(self, run: Children, x: Any, threshold: float) -> ExitOutput:
        """The continuing rows gathered into each next block, every row's outputs scattered
        back from where it stopped: an exiting row costs nothing in the later blocks."""
        h = run(self.blocks[0], x)
        logits = run(self.heads[0], h)
        continue_prob, goes_on = self.decide(run, 0, h, logits, threshold)
        out = ExitOutput(logits, ~goes_on, continue_prob, logits)
        among_ran = goes_on.nonzero().squeeze(1)  # the continuing rows among those that ran
        in_batch = among_ran  # and their positions in the batch
        for k in range(1, self.last + 1):
            if in_batch.numel() == 0:
                break
            h = run(self.blocks[k], h.index_select(0, among_ran))
            logits = run(self.heads[k], h)
            if k == self.last:
                return out._replace(logits=out.logits.index_copy(0, in_batch, logits))
            continue_prob, goes_on = self.decide(run, k, h, logits, threshold)
            out = ExitOutput(*(full.index_copy(0, in_batch, part) for full, part in zip(
                out, (logits, ~goes_on, continue_prob, logits), strict=True)))
            among_ran = goes_on.nonzero().squeeze(1)
            in_batch = in_batch.index_select(0, among_ran)
        return out

    def per_sample(self, run: Children, x: Any, threshold: float) -> ExitOutput:
        """One sample, each decision a :func:`funcgraph.cond`: exported, a ``torch.cond`` whose
        exit branch skips the later blocks."""
        if not isinstance(x, Tensor) or x.dim() == 0 or x.shape[0] != 1:
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ShapeError(f"{self.name}: the per-sample program takes one sample (batch 1), "
                             f"got {got}; use masked_exits for batches")
        return ExitOutput(*self._from_exit(run, 0, run(self.blocks[0], x), threshold))

    def _from_exit(self, run: Children, k: int, h: Tensor, threshold: float) -> tuple[Tensor, ...]:
        """The per-sample outputs from exit ``k`` on, given block ``k``'s output ``h``: a
        ``cond`` between stopping here and running block ``k + 1`` (and the exits after it)."""
        here = run.evaluation()  # cond branches must not change outside state
        logits = here(self.heads[k], h)
        continue_prob, goes_on = self.decide(here, k, h, logits, threshold)

        def stop(h: Tensor, logits: Tensor, p: Tensor) -> tuple[Tensor, ...]:
            """The sample exits at ``k``: this head's logits, exited."""
            return (logits.clone(), logits.new_ones(1, dtype=torch.bool), p.clone(),
                    logits.clone())

        def go_on(h: Tensor, logits: Tensor, p: Tensor) -> tuple[Tensor, ...]:
            """The sample continues: block ``k + 1``, then its exit or the last head."""
            branch = run.evaluation()
            deeper = branch(self.blocks[k + 1], h)
            if k + 1 < self.last:
                return self._from_exit(run, k + 1, deeper, threshold)
            return (branch(self.heads[k + 1], deeper),
                    logits.new_zeros(1, dtype=torch.bool), p.clone(), logits.clone())

        return tuple(cond(goes_on.reshape(()), go_on, stop, h, logits, continue_prob))

    def masked(self, run: Children, x: Any, threshold: float) -> ExitOutput:
        """Every row through every block, each row's output selected where it stopped: the
        same outputs as :meth:`eager` with fixed shapes (exportable), at the cost of the
        whole network for every row."""
        h = run(self.blocks[0], x)
        logits = run(self.heads[0], h)
        continue_prob, goes_on = self.decide(run, 0, h, logits, threshold)
        out, running = ExitOutput(logits, ~goes_on, continue_prob, logits), goes_on
        for k in range(1, self.last + 1):
            h = run(self.blocks[k], h)
            logits = run(self.heads[k], h)
            if k == self.last:
                return out._replace(logits=torch.where(running[:, None], logits, out.logits))
            continue_prob, goes_on = self.decide(run, k, h, logits, threshold)
            out = ExitOutput(torch.where(running[:, None], logits, out.logits),
                             torch.where(running, ~goes_on, out.exited),
                             torch.where(running, continue_prob, out.continue_prob),
                             torch.where(running[:, None], logits, out.exit_logits))
            running = running & goes_on
        return out

    def forward(self, run: Children, x: Any) -> ExitOutput:
        """The composite's forward: the program the call's form asks for, at the threshold a
        :func:`with_threshold` model asks for, else the built one."""
        asked, form = _OVERRIDE.get(), _FORM.get()
        if form != "eager" and run.train:
            raise ConfigError(f"{self.name}: the {form} program is for evaluation (train=False); "
                              "train the model itself")
        program = {"eager": self.eager, "per_sample": self.per_sample, "masked": self.masked}[form]
        with _override(None), _form("eager"):  # early exits inside the blocks stay eager
            return program(run, x, self.threshold if asked is None else asked)


def early_exit(
    blocks: Sequence[Model] | Mapping[str, Model],
    heads: Sequence[Model] | Mapping[str, Model],
    *,
    threshold: float,
    gates: Sequence[Model] | Mapping[str, Model] | None = None,
    name: str = "early_exit",
    **meta: Any,
) -> Model:
    """A Model running ``blocks`` in order where, after each block but the last, the rows its
    head is sure about stop and only the others go on (see the module docstring).

    Arguments:
        blocks: two or more Models run in order; block ``k + 1`` receives block ``k``'s output
            for the continuing rows only. A sequence names them ``blocks.0``, ``blocks.1``...,
            a dict by its keys.
        heads: one head per block, the last one included, mapping that block's output to
            ``(rows, classes)`` logits; the last is the final classifier (no decision after
            it). Named ``heads.0``... or by the dict's keys.
        threshold: in ``[0, 1]``. Without gates, the max softmax probability at which a row
            stops; with gates, a row continues when its gate's probability is above it.
            :func:`with_threshold` changes it on the built model.
        gates: optional, one Model per exit (``len(blocks) - 1``) mapping the block's output to
            a ``(rows,)`` continue probability: a learned decision, trained by
            :func:`early_exit_loss`. Named ``gates.0``... or by the dict's keys.
        name: the model's name, also in error messages.
        meta: extra hyperparameters recorded in ``Model.meta``.
    Returns:
        A Model mapping ``x`` to :class:`ExitOutput`. Its children (params under their names)
        come block, head(, gate) per block, the order of their init and keys.
    """
    check_fraction(name, "threshold", threshold, allow_one=True)
    block_models, head_models, gate_models = _checked_children(name, blocks, heads, gates)
    exits = _Exits(name, threshold, tuple(block_models), tuple(head_models), tuple(gate_models))
    return composite(name, _running_order(block_models, head_models, gate_models),
                     exits.forward, threshold=threshold, exits=exits.last, **meta)


def with_threshold(model: Model, threshold: float) -> Model:
    """``model`` with ``threshold`` instead of its own: same init, params and training, other
    evaluation decisions. ``model`` is one :func:`early_exit` built (or a wrapper of one that
    keeps its meta, as the factory's are); early exits inside its blocks keep their thresholds.

    The Model contract has no per-call options (``apply(..., threshold=)``), so the override
    is a new Model; rebuilding with ``early_exit(..., threshold=t)`` gives the same result
    when the blocks are at hand.

    Example: ``strict = with_threshold(model, 0.99); y, _ = strict.apply(params, state, x)``.
    """
    _check_early_exit("with_threshold", model)
    at = check_fraction("with_threshold", "threshold", threshold, allow_one=True)
    # The outermost wins: with_threshold(with_threshold(m, a), b) decides with b.
    return _within(model, lambda: _override(at if _OVERRIDE.get() is None else _OVERRIDE.get()),
                   {"threshold": at})


def _check_early_exit(fn: str, model: Model) -> None:
    """Refuse a Model that :func:`early_exit` did not build (nor a wrapper keeping its meta)."""
    if "exits" not in model.meta:
        raise ArgumentTypeError(f"{fn}: expected a Model built by funcgraph.nn.early_exit, got "
                                f"{model.name!r}")


def _within(model: Model, context: Callable[[], AbstractContextManager[None]],
            meta: dict[str, Any]) -> Model:
    """``model`` whose every call runs inside ``context()`` (entered at call time), with
    ``meta`` added: how :func:`with_threshold` and the export programs reach its forward."""

    def apply(
        params: Params, state: State, x: Any, *, key: Key | None = None, train: bool = False
    ) -> tuple[Any, State]:
        with context():
            return model.apply(params, state, x, key=key, train=train)

    return Model(model.init, apply, model.name, {**model.meta, **meta})


def _in_form(model: Model, form: str, fn: str) -> Model:
    _check_early_exit(fn, model)
    return _within(model, lambda: _form(form), {"program": form})


def per_sample_exits(model: Model) -> Model:
    """``model`` (an :func:`early_exit`) for one sample at a time in evaluation, each exit
    decision a :func:`funcgraph.cond` (``torch.cond`` under ``torch.export``): the exported
    program skips the later blocks when the sample exits, the program for the edge. Same
    params and outputs as ``model`` on a batch of one; ``x`` must have batch 1.

    Example: ``funcgraph.export.export(per_sample_exits(m), params, state, x[:1],
    dynamic_batch=False)``.
    """
    return _in_form(model, "per_sample", "per_sample_exits")


def masked_exits(model: Model) -> Model:
    """``model`` (an :func:`early_exit`) for batches in evaluation with fixed shapes: every
    row runs every block and keeps the output of the exit where it stopped. Same outputs as
    ``model`` row for row and exportable with a dynamic batch, but it computes the whole
    network for every row (the eager model skips the blocks after a row's exit)."""
    return _in_form(model, "masked", "masked_exits")


def early_exit_loss(y: ExitOutput, labels: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """Cross-entropy of the returned logits and of each row's exit head, plus the binary
    cross-entropy of the continue probability against "the exit head is wrong on this row"
    (continue only when needed): with gates it trains them, with the confidence rule it makes
    the exit heads' confidence match their accuracy.

    Metrics: ``accuracy`` (of the returned logits), ``exit_rate``, ``exit_accuracy``.
    """
    wrong = (y.exit_logits.argmax(-1) != labels).to(y.continue_prob.dtype)
    loss = (F.cross_entropy(y.logits, labels) + F.cross_entropy(y.exit_logits, labels)
            + F.binary_cross_entropy(y.continue_prob, wrong))
    metrics = {
        "accuracy": (y.logits.argmax(-1) == labels).float().mean(),
        "exit_rate": y.exited.float().mean(),
        "exit_accuracy": 1.0 - wrong.float().mean(),
    }
    return loss, metrics


__all__ = ["ExitOutput", "early_exit", "early_exit_loss", "masked_exits", "per_sample_exits",
           "with_threshold"]
