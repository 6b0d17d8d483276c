"""A run directory back in Python: its model with the params and state of one checkpoint.

:func:`load_run` is the one call a user needs to take a run that ``funcgraph meta-train`` or
``funcgraph train`` wrote and compute with it: the model comes from the run's
``config.json`` through :func:`~funcgraph.runs.resolve_model` (importing the ``--import``
modules the run recorded), the tensors from the checkpoint, verified against the model's
names, shapes and dtypes, as ``evaluate`` and ``export`` read them.

:meth:`LoadedRun.adapt` adapts a meta-training run to a support set of your own with the run's
own learner, exactly as ``funcgraph evaluate`` adapts to each test task (the same learner,
settings, batch-norm mode and precision, through the same code,
:class:`~funcgraph.meta.adapted.AdaptThenScore`); the :class:`AdaptedRun` it returns predicts
query inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .. import random
from ..errors import CheckpointError, ConfigError, ShapeError
from ..factory import meta_init
from ..meta import step_params
from ..meta.adapted import AdaptThenScore, Predict
from ..meta.learner import MetaLearner
from ..model import Model
from ..params import Params, State
from ..placement import cpu_threads
from ..plugins import import_recorded
from ..precision import in_precision
from ..random import Key
from ..train import Run
from ..train.checkpoint import verify_groups
from .meta_training.loop import MetaTrainConfig, scoring_learner
from .resolve import resolve_model
from .task_sources import TaskSources, sources_for


@dataclass(frozen=True)
class LoadedRun:
    """A run's model and one checkpoint's tensors: ``model.apply(params, state, x)`` runs it.

    ``checkpoint`` is the checkpoint read (``"best"`` falls back to ``"last"`` for a run that
    never validated) and ``step`` the training step it holds; ``config`` is the run's
    ``config.json``. For a meta-training run ``params`` is the learned initialisation of the
    model (a learner's own tensors, such as Meta-SGD's rates, stay in the checkpoint).
    """

    path: Path
    checkpoint: str
    step: int
    config: dict[str, Any]
    model: Model
    params: Params
    state: State

    def adapt(self, x_support: Tensor, y_support: Tensor, *,
              key: Key | None = None) -> AdaptedRun:
        """The run's model adapted to the support set ``(x_support, y_support)`` by the run's
        own learner, as ``funcgraph evaluate`` adapts to each of its test tasks: the learner
        and its evaluation settings (inner steps and rate, Meta-SGD's and MAML++'s learned
        rates, MAML++'s batch-norm rows or ``--bn-running-stats``, ProtoNet's prototypes) and
        the precision and CPU threads the run recorded, through the same code.

        Arguments:
            x_support: ``(S, *input)`` inputs in the dtype of the run's params, ``input`` the
                shape of one of the run's examples (``(C, H, W)`` for images).
            y_support: classification: ``(S,)`` int64 labels in ``[0, ways)``, every class at
                least once; regression: ``(S, D)`` targets in the inputs' dtype.
            key: the task's model key (dropout and other randomness): ``None`` uses
                ``random.key(0)`` for a model that takes keys.

        Raises:
            ConfigError: a ``train`` run (no learner: use ``model.apply``).
            ShapeError: inputs or labels of the wrong shape, dtype or range.

        Example::

            run = load_run("runs/maml-glyphs-5way1shot-20260101-120000")
            logits = run.adapt(images, labels).predict(queries)  # (Q, ways)
        """
        learner, meta_params, sources, cfg = _scoring_learner(self)
        example = sources.val(random.key(0), 1).support_x.shape[2:]
        dtype = next(iter(meta_params.values())).dtype
        check_inputs("adapt", "x_support", x_support, tuple(example), dtype)
        _check_targets(y_support, x_support, sources.kind, sources.ways)
        if not isinstance(learner.task_eval, AdaptThenScore):
            raise ConfigError(f"LoadedRun.adapt: the {learner.name} learner scores tasks "
                              "without a separate adaptation (its task_eval is no "
                              "AdaptThenScore), so it cannot predict")
        task_key = (random.key(0) if key is None else key) if learner.uses_keys else None
        if task_key is not None:
            random.check_key("LoadedRun.adapt", task_key, batch=False)
        device = x_support.device.type
        adapt = in_precision(learner.task_eval.adapt, cfg.precision, device)
        with cpu_threads(cfg.threads):  # the run's own count: rounding follows the threads
            predict = adapt(meta_params, x_support, y_support, task_key)
        return AdaptedRun(in_precision(predict, cfg.precision, device), sources.kind,
                          sources.ways if sources.kind == "classification" else None,
                          tuple(example), dtype, cfg.threads)


@dataclass(frozen=True)
class AdaptedRun:
    """A run's model adapted to one support set (:meth:`LoadedRun.adapt`).

    Attributes:
        kind: ``"classification"`` or ``"regression"``.
        ways: the classes of a classification run (``None`` for regression).
        example: the shape of one input (``(C, H, W)`` for images).
        dtype: the inputs' dtype.
        threads: the CPU threads the run recorded (0: the process's count), which
            :meth:`predict` runs with, as ``funcgraph evaluate`` scores.
    """

    adapted: Predict
    kind: str
    ways: int | None
    example: tuple[int, ...]
    dtype: torch.dtype
    threads: int = 0

    def predict(self, x_query: Tensor) -> Tensor:
        """``(Q, ways)`` logits (classification) or ``(Q, D)`` values (regression) of
        ``x_query (Q, *example)``. A model that normalises with batch statistics normalises
        the query batch as a whole, as evaluation scores a task's query set.

        Raises:
            ShapeError: ``x_query`` of the wrong shape or dtype.
        """
        check_inputs("predict", "x_query", x_query, self.example, self.dtype)
        with cpu_threads(self.threads):
            return self.adapted(x_query)


def check_inputs(fn: str, name: str, x: object, example: tuple[int, ...],
                 dtype: torch.dtype) -> None:
    """Refuse inputs that are not ``(B, *example)`` tensors of ``dtype`` with ``B >= 1``."""
    want = f"a {dtype} tensor of shape (batch, {', '.join(map(str, example))})"
    if not isinstance(x, Tensor):
        raise ShapeError(f"{fn}: {name} must be {want}, got {type(x).__name__}")
    if x.dtype != dtype or tuple(x.shape[1:]) != example or x.ndim < 1 or x.shape[0] < 1:
        raise ShapeError(f"{fn}: {name} must be {want}, got {x.dtype} {tuple(x.shape)}")


def _check_targets(y: object, x: Tensor, kind: str, ways: int) -> None:
    """Refuse support targets that do not fit ``x`` and the run's task kind."""
    n = x.shape[0]
    if kind == "classification":
        want = f"int64 labels of shape ({n},) with each of 0..{ways - 1} at least once"
        if not isinstance(y, Tensor) or y.dtype != torch.int64 or tuple(y.shape) != (n,):
            got = f"{y.dtype} {tuple(y.shape)}" if isinstance(y, Tensor) else type(y).__name__
            raise ShapeError(f"adapt: y_support must be {want}, got {got}")
        counts = torch.bincount(y.clamp(0, ways), minlength=ways + 1)
        if y.min() < 0 or y.max() >= ways or bool((counts[:ways] == 0).any()):
            raise ShapeError(f"adapt: y_support must be {want} (the run is {ways}-way), got "
                             f"labels {sorted(set(y.tolist()))}")
        return
    if (not isinstance(y, Tensor) or y.dtype != x.dtype or y.ndim != 2 or y.shape[0] != n):
        got = f"{y.dtype} {tuple(y.shape)}" if isinstance(y, Tensor) else type(y).__name__
        raise ShapeError(f"adapt: y_support must be {x.dtype} targets of shape ({n}, D), got "
                         f"{got}")


def _scoring_learner(loaded: LoadedRun
                     ) -> tuple[MetaLearner, Params, TaskSources, MetaTrainConfig]:
    """The learner ``funcgraph evaluate`` scores ``loaded``'s checkpoint with, the checkpoint's
    meta-parameters, the run's task sources and its config."""
    if "algo" not in loaded.config:
        raise ConfigError(f"LoadedRun.adapt: {loaded.path} is a train run, with no learner to "
                          "adapt with; its model.apply(params, state, x) predicts")
    cfg = MetaTrainConfig.from_json(loaded.config)
    sources = sources_for(cfg)
    device = next(iter(loaded.params.values())).device
    scorer, meta_params = scoring_learner(cfg, sources, loaded.model, Run.open(loaded.path),
                                          loaded.checkpoint, device)
    return scorer, meta_params, sources, cfg


def load_run(run_dir: str | Path, checkpoint: str = "best", *,
             device: str = "cpu") -> LoadedRun:
    """The model of the run in ``run_dir`` with the params and state of ``checkpoint``.

    Arguments:
        run_dir: a run directory of ``meta-train`` or ``train``.
        checkpoint: ``"best"`` (by validation; ``"last"`` for a run that never validated) or
            ``"last"``.
        device: where the tensors are loaded.

    Raises:
        CheckpointError: not a run directory, no such checkpoint, or tensors that do not
            match the run's model.
        ConfigError: a bad ``checkpoint`` name, or a run whose config names no model (a
            ``search`` run: train its genotype with ``funcgraph train --genotype``).

    Example::

        loaded = load_run("runs/maml-glyphs-5way1shot-20260101-120000")
        logits, _ = loaded.model.apply(loaded.params, loaded.state, images)
    """
    if checkpoint not in ("best", "last"):
        raise ConfigError(f"load_run: checkpoint must be 'best' or 'last', got {checkpoint!r}")
    run = Run.open(run_dir)
    import_recorded(run.config, run_dir)
    spec = run.config.get("model")
    if not spec:
        raise ConfigError(f"load_run: {run.path}/config.json has no 'model' entry to rebuild "
                          "the model from (a search run's result is its genotype.json: "
                          "funcgraph train --genotype)")
    model = resolve_model(spec)
    tag = checkpoint if run.has_checkpoint(checkpoint) else "last"
    if not run.has_checkpoint(tag):
        raise CheckpointError(f"load_run: {run.path} has no checkpoint (expected checkpoints/"
                              f"{checkpoint}.json)")
    groups, meta = run.load(tag, device=device)
    params, state = groups.get("params", {}), groups.get("state", {})
    if "algo" in run.config:  # the meta-initialisation: the learner's own params stay behind
        params = step_params(params, 0)  # MAML++: step 0's batch-norm copy
    expect_params, expect_state = meta_init(model)
    verify_groups(run.checkpoint_dir / tag, {"params": params, "state": state},
                  {"params": expect_params, "state": expect_state})
    return LoadedRun(run.path, tag, int(meta["step"]), dict(run.config), model, params, state)


__all__ = ["AdaptedRun", "LoadedRun", "check_inputs", "load_run"]
