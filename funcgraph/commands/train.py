"""``funcgraph train``: supervised training of a model on embedded data, with the run machinery
meta-train uses (progress, validation, atomic checkpoints, metrics, resume, Ctrl-C safe)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .common import (
    MODEL_PANEL,
    RUN_OPTIONS_NOT_IN_CONFIG,
    named_options,
    show_plan,
    user_errors,
)
from .run_options import RunOptions, echo, resumed, run_options

TRAINING_PANEL = "Training"

_NETWORK = ("model", "data", "loss")  # --model, --genotype, --set: compared whole
OPTION_FIELDS: dict[str, tuple[str, ...]] = {
    "model": _NETWORK, "genotype": _NETWORK, "set_": _NETWORK}
"""Options whose config fields have other names (the others set the field of their own
name); a ``--resume`` takes the fields of the options named beside it."""

NOT_IN_CONFIG: dict[str, str] = {
    **RUN_OPTIONS_NOT_IN_CONFIG,
    "device": "where the run runs; each checkpoint records the device type",
    "place": "where each param lives (a placement plan); the values are the same",
}
"""Options that set no config field, each with why its value needs no record."""


@user_errors
@run_options()
def train(
    ctx: typer.Context,
    model: Annotated[str, typer.Option(
        rich_help_panel=MODEL_PANEL,
        help="resnet-sd (ResNet with stochastic depth, glyphs), early-exit (adaptive CNN, "
             "glyphs), rnn (LSTM, digit-sum sequences), or a funcgraph.factory config file "
             "or name (trained on glyphs).")] = "resnet-sd",
    genotype: Annotated[Path | None, typer.Option(
        rich_help_panel=MODEL_PANEL,
        help="Train the discrete DARTS network of this genotype.json on glyphs "
             "(funcgraph.nas.network_from_genotype; --set C=16 --set layers=8).")] = None,
    steps: Annotated[int | None, typer.Option(
        min=1, max=10**7, rich_help_panel=TRAINING_PANEL,
        help="Training steps (default per model: resnet-sd 300, early-exit 400, rnn 600).")
    ] = None,
    batch_size: Annotated[int | None, typer.Option(
        min=1, max=100_000, rich_help_panel=TRAINING_PANEL, help="Examples per step.")] = None,
    lr: Annotated[float | None, typer.Option(
        min=0.0, rich_help_panel=TRAINING_PANEL,
        help="Adam learning rate (cosine-annealed to 0).")] = None,
    validate_every: Annotated[int | None, typer.Option(
        min=0, max=10**7, rich_help_panel=TRAINING_PANEL,
        help="Validate every N steps (default: 4 times per run; 0: only at the end).")
    ] = None,
    *,
    run: RunOptions,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", rich_help_panel=MODEL_PANEL,
        help="Model hyperparameter (--set depth=56, --set mode=row) or data option "
             "(--set data.classes=20, --set data.max_length=20); repeatable.")] = None,
) -> None:
    """Train a classifier, validate it, checkpoint, and print the final validation accuracy.

    --resume --out RUN continues the run with its recorded options and thread count;
    --steps may grow and --threads change, any other option named beside them must match
    the run's.

    Example: funcgraph train --model resnet-sd --set depth=20 --steps 300
    """
    from dataclasses import asdict

    from .. import distributed
    from ..factory import parse_overrides
    from ..placement import resolve_device
    from ..runs import TrainConfig, fit, train_config
    from ..runs.train import plan_fit

    recorded = run.start()
    if genotype is not None and not genotype.is_file():
        raise typer.BadParameter(f"{genotype}: no such genotype file", param_hint="--genotype")
    cfg = train_config(model, genotype=str(genotype) if genotype else None,
                       sets=parse_overrides(set_ or []), steps=steps, batch_size=batch_size,
                       lr=lr, seed=run.seed, validate_every=validate_every,
                       precision="float32" if run.precision is None else run.precision,
                       threads=run.threads)
    if recorded is not None:  # the run's own options, and those named here (checked)
        cfg = resumed(TrainConfig.from_json(recorded), named_options(ctx), asdict(cfg),
                      OPTION_FIELDS, NOT_IN_CONFIG)
    if run.dry_run:
        plan = plan_fit(cfg, resolve_device(run.device), place=run.place)
        show_plan(cfg.to_json(), [f"parameters: {plan.parameters:,}",
                                  f"memory: {plan.memory}", "dry run: nothing written"])
        return
    env = run.join()
    out = run.run_dir(f"train-{'genotype' if genotype else Path(model).stem}", env)
    with distributed.joined(env):
        fit(cfg, out, resume=run.resume, device=run.device, env=env, echo=echo,
            tensorboard=run.tensorboard, place=run.place)


def register(app: typer.Typer) -> None:
    app.command("train")(train)
