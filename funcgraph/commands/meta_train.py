"""``funcgraph meta-train``: meta-train a few-shot learner and score it on held-out tasks."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from ..data.registry import dataset_help, image_size_help
from ..meta.registry import algorithm_help, defaults_help, recipe_help
from .common import (
    DATA_PANEL,
    MODEL_PANEL,
    RUN_OPTIONS_NOT_IN_CONFIG,
    DataRootOption,
    named_options,
    show_plan,
    user_errors,
)
from .run_options import RunOptions, echo, resumed, run_options

if TYPE_CHECKING:
    from ..runs import MetaTrainConfig
    from ..runs.task_sources import TaskSources

TASKS_PANEL = "Tasks"
ALGORITHM_PANEL = "Algorithm"
META_STEP_PANEL = "Meta-step"
SPECIFIC_PANEL = "Reptile, MAML++ and iMAML"
EVAL_PANEL = "Validation and test"

MetaOptimizer = Literal["adam", "sgd"]
StrategyChoice = Literal["auto", "measure", "loop", "threads", "vmap"]


class InnerOptimizer(StrEnum):
    """An enum, not a ``Literal``: ``Literal["sgd", "adam"] | None`` is the cached
    ``MetaOptimizer | None`` (a Literal compares as a set), which lists adam first."""

    sgd = "sgd"
    adam = "adam"

OPTION_FIELDS: dict[str, tuple[str, ...]] = {
    "episodes": ("test_episodes",), "setting": ("settings",), "compile_": ("compile",),
    "model": ("model",), "set_": ("model",)}
"""Options whose config fields have other names (the others set the field of their own
name); a ``--resume`` takes the fields of the options named beside it."""

NOT_IN_CONFIG: dict[str, str] = {
    **RUN_OPTIONS_NOT_IN_CONFIG,
    "device": "where the run runs; each checkpoint records the device type, and a strategy "
              "chosen for another type is chosen again",
    "place": "where each param lives (a placement plan); the values are the same",
}
"""Options that set no config field, each with why its value needs no record."""


def _algorithm_default(panel: str, text: str, field: str, **bounds: Any) -> Any:
    """An option whose default is each algorithm's own value of ``field``, which its help
    cites (:func:`~funcgraph.meta.registry.defaults_help`)."""
    return typer.Option(rich_help_panel=panel, help=f"{text} (default {defaults_help(field)}).",
                        **bounds)


def _recipe_default(panel: str, text: str, default: str, field: str, **bounds: Any) -> Any:
    """An option whose default is ``default`` unless the algorithm's recipe sets ``field``
    (the recipes its help cites: :func:`~funcgraph.meta.registry.recipe_help`)."""
    return typer.Option(rich_help_panel=panel,
                        help=f"{text} (default {default}; {recipe_help(field)}).", **bounds)


@user_errors
@run_options()
def meta_train(
    ctx: typer.Context,
    tasks: Annotated[str | None, typer.Option(
        rich_help_panel=TASKS_PANEL,
        help="Task spec: 5way1shot, 20way5shot, 5way1shot15query (sinusoid: 10shot). "
             "Validation and test use it; training uses --train-queries queries per class.")
    ] = None,
    algo: Annotated[str | None, typer.Option(
        rich_help_panel=ALGORITHM_PANEL,
        help=f"Meta-learning algorithm: {algorithm_help()} (default: protonet on image "
             "datasets, maml on sinusoid); or one of your own, registered with "
             "funcgraph.meta.register_algorithm in a module given to --import.")] = None,
    dataset: Annotated[str, typer.Option(
        rich_help_panel=DATA_PANEL,
        help=f"The tasks' dataset: {dataset_help()}; or one of your own, registered with "
             "funcgraph.data.register_dataset in a module given to --import.")
    ] = "glyphs",
    data_root: DataRootOption = None,
    image_size: Annotated[int | None, typer.Option(
        rich_help_panel=DATA_PANEL,
        min=8, max=512, help=f"Resize images to this square size (default: the dataset's: "
                             f"{image_size_help()}).")] = None,
    meta_batch: Annotated[int | None, _recipe_default(
        META_STEP_PANEL, "Tasks per meta-step", "32", "meta_batch", min=1, max=100_000)] = None,
    steps: Annotated[int | None, _recipe_default(
        META_STEP_PANEL, "Meta-steps", "500", "steps", min=1, max=10**7)] = None,
    inner_steps: Annotated[int | None, _algorithm_default(
        ALGORITHM_PANEL, "Inner SGD steps in meta-training", "inner_steps", min=0, max=1000)
    ] = None,
    inner_steps_eval: Annotated[int | None, _algorithm_default(
        ALGORITHM_PANEL, "Inner SGD steps at validation and test", "eval_steps", min=0,
        max=1000)] = None,
    inner_lr: Annotated[float | None, typer.Option(
        rich_help_panel=ALGORITHM_PANEL,
        help=f"Inner learning rate (default {defaults_help('inner_lr')}; sinusoid 0.01).")
    ] = None,
    meta_lr: Annotated[float | None, _recipe_default(
        META_STEP_PANEL, "Adam learning rate of the meta-step", "0.003", "meta_lr")] = None,
    first_order: Annotated[bool, typer.Option(
        "--first-order", rich_help_panel=ALGORITHM_PANEL,
        help="Drop the second-order term (first-order MAML).")] = False,
    remat: Annotated[bool, typer.Option(
        "--remat", rich_help_panel=ALGORITHM_PANEL,
        help="Memory-saving second order: recompute each inner step's graph in the backward "
             "pass (same meta-gradient). MAML, Meta-SGD, ANIL.")] = False,
    cosine_meta_lr: Annotated[bool | None, typer.Option(
        "--cosine-meta-lr/--constant-meta-lr",
        rich_help_panel=META_STEP_PANEL,
        help="Cosine-anneal the meta learning rate to 0 (default: on for mamlpp).")] = None,
    linear_meta_lr: Annotated[bool | None, typer.Option(
        "--linear-meta-lr",
        rich_help_panel=META_STEP_PANEL,
        help="Anneal the meta learning rate linearly to 0 (Reptile's outer step size).")
    ] = None,
    meta_optimizer: Annotated[MetaOptimizer | None, typer.Option(
        rich_help_panel=META_STEP_PANEL,
        help="Optimiser of the meta-step (default adam; reptile's recipe: sgd).")] = None,
    inner_optimizer: Annotated[InnerOptimizer | None, typer.Option(
        rich_help_panel=SPECIFIC_PANEL,
        help="Reptile: optimiser of the inner loop (adam: betas (0, 0.999), fresh per task).")
    ] = None,
    inner_minibatches: Annotated[bool | None, typer.Option(
        "--inner-minibatches/--inner-full-batch",
        rich_help_panel=SPECIFIC_PANEL,
        help="Reptile: each inner step fits one example of every class (cycling through the "
             "task; the default) or all of the task's examples at once.")] = None,
    msl_anneal_steps: Annotated[int | None, typer.Option(
        rich_help_panel=SPECIFIC_PANEL,
        min=1, max=10**7, help="MAML++: meta-steps over which the multi-step loss anneals "
                               "towards the last inner step (default: 28.63% of "
                               "--steps).")] = None,
    first_order_until: Annotated[int | None, typer.Option(
        rich_help_panel=SPECIFIC_PANEL,
        min=0, max=10**7, help="MAML++: first-order meta-gradients before this meta-step "
                               f"(derivative-order annealing; default "
                               f"{defaults_help('first_order_until')}).")] = None,
    bn_running_stats: Annotated[bool, typer.Option(
        "--bn-running-stats",
        rich_help_panel=SPECIFIC_PANEL,
        help="MAML++: validate and test with per-step batch-norm running statistics (each "
             "query scored on its own) instead of each batch's statistics.")] = False,
    imaml_lambda: Annotated[float | None, _algorithm_default(
        SPECIFIC_PANEL, "iMAML: the proximal regulariser's strength", "lam")] = None,
    cg_steps: Annotated[int | None, _algorithm_default(
        SPECIFIC_PANEL, "iMAML: conjugate-gradient steps at most", "cg_steps", min=1, max=1000)
    ] = None,
    cg_tol: Annotated[float | None, _algorithm_default(
        SPECIFIC_PANEL, "iMAML: stop CG at this relative residual", "cg_tol")] = None,
    train_queries: Annotated[int | None, _recipe_default(
        TASKS_PANEL, "Query examples per class in meta-training", "1", "train_queries", min=1,
        max=1000)] = None,
    rotate: Annotated[bool | None, typer.Option(
        "--rotate/--no-rotate", rich_help_panel=TASKS_PANEL,
        help="Add 90/180/270-degree rotated classes to training (MAML protocol; default: "
             "on for mamlpp).")] = None,
    strategy: Annotated[StrategyChoice, typer.Option(
        rich_help_panel=ALGORITHM_PANEL,
        help="Run tasks in a loop, on threads (one per --threads) or vmapped; auto: the "
             "measured default for the device and task size; measure: time each.")
    ] = "auto",
    max_memory: Annotated[str | None, typer.Option(
        rich_help_panel=ALGORITHM_PANEL,
        help="Bound the meta-step's estimated peak (2GiB, 800MiB): vmap maps fewer tasks "
             "at a time; scoring runs one task at a time where several would not fit.")
    ] = None,
    compile_: Annotated[bool | None, typer.Option(
        "--compile/--no-compile", rich_help_panel=ALGORITHM_PANEL,
        help="Compile the whole meta-gradient with torch.compile (first step: about a "
             "minute on a CPU; docs/meta-learning.md).")
    ] = None,
    validate_every: Annotated[int | None, typer.Option(
        rich_help_panel=EVAL_PANEL,
        min=0, max=10**7, help="Validate every N steps (0: never).")] = None,
    val_episodes: Annotated[int | None, typer.Option(
        rich_help_panel=EVAL_PANEL,
        min=1, max=100_000, help="Validation tasks per validation (default 200).")] = None,
    episodes: Annotated[int, typer.Option(
        min=1, max=100_000, rich_help_panel=EVAL_PANEL,
        help="Held-out test tasks at the end.")] = 600,
    *,
    run: RunOptions,
    model: Annotated[str | None, typer.Option(
        rich_help_panel=MODEL_PANEL,
        help="A model config file or name for funcgraph.factory (default: conv4 / MLP).")
    ] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", rich_help_panel=MODEL_PANEL,
        help="Override a model hyperparameter: --set hidden=32 (repeatable).")] = None,
    setting: Annotated[list[str] | None, typer.Option(
        "--setting", rich_help_panel=ALGORITHM_PANEL,
        help="A setting without an option of its own (a plugin algorithm's field): "
             "--setting temperature=0.5 (repeatable; JSON, else text).")] = None,
) -> None:
    """Meta-train on N-way K-shot tasks, validate, checkpoint, and report held-out accuracy.

    --resume --out RUN continues the run as recorded; --steps, --threads and --compile
    may change (docs/runs.md).

    Example: funcgraph meta-train --tasks 5way1shot
    """
    from dataclasses import replace

    from .. import distributed
    from ..factory import parse_overrides
    from ..factory.config import parse_value
    from ..runs import MetaTrainConfig, default_config, meta_train
    from ..runs.memory import parse_bytes
    from ..runs.meta_training.loop import model_config
    from ..runs.task_sources import sources_for

    recorded = run.start()
    options = dict(
        tasks=tasks, data_root=str(data_root) if data_root is not None else None,
        image_size=image_size, meta_batch=meta_batch, steps=steps, inner_steps=inner_steps,
        inner_steps_eval=inner_steps_eval, inner_lr=inner_lr, meta_lr=meta_lr,
        first_order=first_order or None, remat=remat or None, train_queries=train_queries,
        cosine_meta_lr=cosine_meta_lr, linear_meta_lr=linear_meta_lr,
        meta_optimizer=meta_optimizer, inner_minibatches=inner_minibatches,
        inner_optimizer=None if inner_optimizer is None else inner_optimizer.value,
        msl_anneal_steps=msl_anneal_steps,
        first_order_until=first_order_until, bn_running_stats=bn_running_stats or None,
        imaml_lambda=imaml_lambda, cg_steps=cg_steps, cg_tol=cg_tol, rotate=rotate,
        strategy=strategy, precision=run.precision,
        max_memory=None if max_memory is None else parse_bytes("--max-memory", max_memory),
        compile=compile_, threads=run.threads, validate_every=validate_every,
        val_episodes=val_episodes, test_episodes=episodes, seed=run.seed,
        settings={k: parse_value(v) for k, v in parse_overrides(
            setting or [], option="--setting").items()} or None,
    )
    named = named_options(ctx)
    if recorded is None:
        cfg = default_config(algo, dataset, **options)
    else:  # the run's own options, and those named here (the run directory checks them)
        cfg = resumed(MetaTrainConfig.from_json(recorded), named,
                      {"algo": algo, "dataset": dataset, **options}, OPTION_FIELDS,
                      {*NOT_IN_CONFIG, "model", "set_"})  # the model: below
    overrides = parse_overrides(set_ or [])
    # A run with --nproc re-runs this command under torchrun before any data is built.
    env = None if run.dry_run else run.join()
    sources = sources_for(cfg)
    if recorded is None or named & {"model", "set_"}:
        cfg = replace(cfg, model=model_config(cfg.algo, sources, factory=model,
                                              overrides=overrides))
    if env is None:
        _show_dry_run(cfg, sources, run)
        return
    out = run.run_dir(f"{cfg.algo}-{cfg.dataset}-{cfg.tasks}", env)
    with distributed.joined(env):
        meta_train(cfg, out, resume=run.resume, device=run.device, sources=sources, env=env,
                   echo=echo, tensorboard=run.tensorboard, place=run.place)


def _show_dry_run(cfg: MetaTrainConfig, sources: TaskSources, run: RunOptions) -> None:
    """``--dry-run``: plan the run (:func:`~funcgraph.runs.meta_training.loop.plan_meta_train`),
    time one meta-step, and print the resolved config, the sizes and the time it would take."""
    from ..placement import resolve_device
    from ..runs.meta_training.loop import estimate_step_seconds, plan_meta_train

    dev = resolve_device(run.device)
    plan = plan_meta_train(cfg, sources, dev, place=run.place)
    seconds, measured = estimate_step_seconds(plan.cfg, plan, sources, dev)
    show_plan(plan.cfg.to_json(), [
        f"parameters: {plan.parameters:,}", f"memory: {plan.memory}",
        *([plan.memory_note] if plan.memory_note else []),
        f"time: about {seconds:.3g} s per meta-step, {seconds * plan.cfg.steps / 60:.3g} "
        f"min for {plan.cfg.steps:,} steps (one step measured on {measured} task(s), "
        "scaled; validation not included)",
        "dry run: nothing written"])


def register(app: typer.Typer) -> None:
    app.command("meta-train")(meta_train)
