"""What ``funcgraph evaluate`` runs: a meta-training run's checkpoint scored on held-out tasks."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from .. import random
from ..errors import CheckpointError, ConfigError
from ..meta import EvalResult, evaluate, resolve_strategy
from ..placement import resolve_device
from ..plugins import import_recorded
from ..precision import resolve_precision
from ..train import Run
from .memory import check_task_sizes
from .meta_train import (
    MetaTrainConfig,
    build_learner,
    evaluation_learner,
    init_params,
    run_model,
    task_size,
)
from .task_sources import task_sources


def evaluate_run(
    run_dir: str | Path,
    *,
    tasks: str | None = None,
    episodes: int = 600,
    checkpoint: str = "best",
    inner_steps_eval: int | None = None,
    bn_running_stats: bool | None = None,
    device: str = "cpu",
    seed: int | None = None,
    precision: str | None = None,
) -> tuple[Run, str, EvalResult]:
    """Score the run in ``run_dir`` on held-out tasks (the run's spec unless ``tasks``).

    ``inner_steps_eval`` and ``bn_running_stats`` (MAML++: score each query on its own with
    per-step running statistics instead of the query batch's own) override the run's
    settings; neither changes what was trained. ``precision`` (``float32``, ``bf16`` or
    ``auto``) overrides the precision the run trained in.

    Returns ``(run, checkpoint tag scored, result)``: ``"best"`` falls back to ``"last"`` for a
    run that never validated, and the caller says which one it got.
    """
    run = Run.open(run_dir)
    import_recorded(run.config, run_dir)
    cfg = MetaTrainConfig.from_json(run.config)
    changes: dict[str, Any] = {}
    if tasks is not None:
        changes["tasks"] = tasks
    if inner_steps_eval is not None:
        if cfg.algo == "protonet":
            raise ConfigError("--inner-steps-eval: a protonet run adapts by class prototypes, "
                              "with no inner steps to set")
        changes["inner_steps_eval"] = inner_steps_eval
    if bn_running_stats is not None:
        changes["bn_running_stats"] = bn_running_stats
    dev = resolve_device(device)
    if precision is not None:
        changes["precision"] = resolve_precision(precision, dev)[0]
    cfg = replace(cfg, **changes)
    sources = task_sources(cfg.dataset, spec=cfg.tasks, data_root=cfg.data_root,
                           image_size=cfg.image_size)
    model_ways = cfg.model.get("ways")
    if model_ways is not None and model_ways != sources.ways:
        raise ConfigError(f"--tasks {cfg.tasks}: the model's head has {model_ways} ways")
    model = run_model(cfg)
    check_task_sizes(model, cfg, sources, dev)  # from shapes, before a task is sampled
    learner = build_learner(cfg, sources, model)
    template = init_params(cfg, learner, model)
    tag = checkpoint if run.has_checkpoint(checkpoint) else "last"
    if not run.has_checkpoint(tag):
        raise CheckpointError(f"{run.path}: no checkpoint to evaluate (expected checkpoints/"
                              f"{checkpoint}.json)")
    params = run.load(tag, expect={"params": template}, device=str(dev))[0]["params"]
    key = random.fold_in(random.key(cfg.seed if seed is None else seed), -3)
    scorer = evaluation_learner(cfg, learner, params, sources, dev)
    result = evaluate(scorer, params, sources.test, key=key, episodes=episodes,
                      strategy=resolve_strategy("auto", dev,
                                                examples_per_task=task_size(sources.test)),
                      device=dev, precision=cfg.precision)
    run.log({"kind": "evaluate", "step": cfg.steps, "checkpoint": tag, "tasks": cfg.tasks,
             **result.as_record()})
    return run, tag, result


__all__ = ["evaluate_run"]
