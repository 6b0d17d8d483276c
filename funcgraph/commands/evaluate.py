"""``funcgraph evaluate RUN_DIR``: score a meta-training run's checkpoint on held-out tasks."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .common import (
    CheckpointOption,
    DeviceOption,
    ImportOption,
    PrecisionOption,
    ThreadsOption,
    console,
    import_plugins,
    use_threads,
    user_errors,
)

EVALUATION_PANEL = "Evaluation"


@user_errors
def evaluate(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by meta-train.")],
    tasks: Annotated[str | None, typer.Option(
        rich_help_panel=EVALUATION_PANEL,
        help="Task spec to evaluate on (default: the run's), e.g. 5way1shot15query.")] = None,
    episodes: Annotated[int, typer.Option(
        rich_help_panel=EVALUATION_PANEL,
        min=1, max=100_000, help="Held-out tasks to average over.")] = 600,
    inner_steps_eval: Annotated[int | None, typer.Option(
        rich_help_panel=EVALUATION_PANEL,
        min=0, max=1000, help="Inner steps on each support set (default: the run's).")] = None,
    bn_running_stats: Annotated[bool | None, typer.Option(
        "--bn-running-stats/--batch-stats",
        rich_help_panel=EVALUATION_PANEL,
        help="MAML++: score each query on its own, normalised with the per-step running "
             "statistics of the adapted params, or with each batch's statistics (default: "
             "the run's).")] = None,
    checkpoint: CheckpointOption = "best",
    device: DeviceOption = "auto",
    precision: PrecisionOption = None,
    threads: ThreadsOption = 0,
    import_: ImportOption = None,
    seed: Annotated[int | None, typer.Option(
        rich_help_panel=EVALUATION_PANEL,
        min=0, max=2**31 - 1, help="Seed of the test tasks (default: the run's).")] = None,
) -> None:
    """Adapt on each held-out task's support set and report query accuracy +- 95% CI.

    A ProtoNet run holds an embedding, not a classifier: it scores tasks of any way count
    (--tasks 10way1shot on a 5-way run) by their class prototypes. Ctrl-C exits 130.

    Example: funcgraph evaluate runs/maml-glyphs-5way1shot-20260101-120000 --episodes 600
    """

    from ..runs import evaluate_run

    use_threads(threads)
    import_plugins(import_)
    if checkpoint not in ("best", "last"):
        raise typer.BadParameter(f"expected best or last, got {checkpoint!r}",
                                 param_hint="--checkpoint")
    run, tag, result = evaluate_run(run_dir, tasks=tasks, episodes=episodes,
                                    checkpoint=checkpoint, inner_steps_eval=inner_steps_eval,
                                    bn_running_stats=bn_running_stats, device=device, seed=seed,
                                    precision=None if precision is None else precision.value)
    fallback = f" (the run has no {checkpoint!r} checkpoint)" if tag != checkpoint else ""
    console.print(f"{run.path} ({tag} checkpoint{fallback}): {result}", highlight=False,
                  markup=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("evaluate")(evaluate)
