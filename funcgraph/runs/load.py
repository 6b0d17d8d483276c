"""A run directory back in Python: its model with the params and state of one checkpoint.

:func:`load_run` is the one call a user needs to take a run that ``funcgraph meta-train`` or
``funcgraph train`` wrote and compute with it: the model comes from the run's
``config.json`` through :func:`~funcgraph.runs.resolve_model` (importing the ``--import``
modules the run recorded), the tensors from the checkpoint, verified against the model's
names, shapes and dtypes, as ``evaluate`` and ``export`` read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, ConfigError
from ..factory import meta_init
from ..meta import step_params
from ..model import Model
from ..params import Params, State
from ..plugins import import_recorded
from ..train import Run
from ..train.checkpoint import verify_groups
from .resolve import resolve_model


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


__all__ = ["LoadedRun", "load_run"]
