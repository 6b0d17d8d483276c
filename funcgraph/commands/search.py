"""``funcgraph search``: DARTS architecture search on image classification."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from ..data.registry import dataset_help
from .common import (
    DATA_PANEL,
    RUN_OPTIONS_NOT_IN_CONFIG,
    DataRootOption,
    named_options,
    show_plan,
    user_errors,
)
from .run_options import RunOptions, echo, run_options

SEARCH_PANEL = "Search"
REMEDIES_PANEL = "Collapse remedies"
NETWORK_PANEL = "Network"

Order = Literal["first", "second"]
EdgeOrder = Literal["input", "strength"]
Hypergradient = Literal["exact", "finite-difference"]
Select = Literal["argmax", "perturbation"]

OPTION_FIELDS: dict[str, tuple[str, ...]] = {
    "order": ("bilevel.order",), "hypergradient": ("bilevel.hypergradient",),
    "model": ("C", "layers", "nodes", "multiplier", "stem_multiplier", "arch_init_scale"),
    "channels": ("C",), "dataset": ("data",), "classes": ("data",), "image_size": ("data",),
    "space": ("primitives",)}
"""Options whose ``config.json`` keys have other names (``bilevel.order``: a key of the
nested ``bilevel`` entry); the others set the key of their own name. A ``--resume`` rebuilds
the config from the options and the run directory refuses one that differs (``--steps``,
``--epochs`` and ``--threads`` may change)."""

NOT_IN_CONFIG: dict[str, str] = {
    **RUN_OPTIONS_NOT_IN_CONFIG,
    "data_root": "the folder a dataset is read from; the data's name (dataset, classes, image "
                 "size) is recorded",
    "device": "where the run runs; each checkpoint records the config it ran",
}
"""Options that set no ``config.json`` key, each with why its value needs no record."""


@user_errors
@run_options(threads=1, without=("precision", "place"))
def search(
    ctx: typer.Context,
    epochs: Annotated[int, typer.Option(rich_help_panel=SEARCH_PANEL, min=1, max=10_000,
                                                 help="Search epochs over the train half.")] = 10,
    steps: Annotated[int | None, typer.Option(
        rich_help_panel=SEARCH_PANEL,
        min=1, max=10**7,
        help="Total steps (overrides --epochs; an epoch is a pass over the train half).")
    ] = None,
    order: Annotated[Order, typer.Option(
        rich_help_panel=SEARCH_PANEL,
        help="Architecture gradient: first (current weights) or second (through one unrolled "
             "weight step).")] = "first",
    hypergradient: Annotated[Hypergradient, typer.Option(
        rich_help_panel=SEARCH_PANEL,
        help="Second order only: exact (torch.func vjp) or the paper's finite difference.")
    ] = "exact",
    partial_channels: Annotated[int, typer.Option(
        rich_help_panel=SEARCH_PANEL,
        min=1, max=64, help="PC-DARTS: send 1/k of the channels through the mixed ops (k=4 in the "
                    "paper; 1 = plain DARTS).")] = 1,
    skip_cap: Annotated[int | None, typer.Option(
        rich_help_panel=REMEDIES_PANEL,
        min=0, max=8, help="At most this many skip connections per derived cell (P-DARTS uses 2).")
    ] = None,
    stop_skips: Annotated[int, typer.Option(
        rich_help_panel=REMEDIES_PANEL,
        min=0, max=8, help="Collapse guard: stop when the normal cell derives this many skip "
                    "connections (DARTS+ uses 2; 0 disables).")] = 4,
    warmup_epochs: Annotated[int, typer.Option(
        rich_help_panel=REMEDIES_PANEL,
        min=0, max=10_000, help="Remedy (PC-DARTS, P-DARTS): the first N epochs update the "
                                "weights only; below the number of epochs.")] = 0,
    beta_reg: Annotated[float, typer.Option(
        rich_help_panel=REMEDIES_PANEL,
        min=0.0, max=1e6, help="Remedy (beta-DARTS): Beta-Decay regularisation of alpha, its "
                               "weight rising linearly from 0 to this value (0 = off).")] = 0.0,
    aux_skip: Annotated[bool, typer.Option(
        "--aux-skip", rich_help_panel=REMEDIES_PANEL,
        help="Remedy (DARTS-): an auxiliary skip on every stride-1 edge, its coefficient "
             "decaying linearly from 1 to 0.")] = False,
    edge_normalization: Annotated[bool, typer.Option(
        "--edge-normalization", rich_help_panel=REMEDIES_PANEL,
        help="Remedy (PC-DARTS): learnt edge weights per node; edges are chosen by "
             "softmax(alpha) x edge weight.")
    ] = False,
    stop_stable: Annotated[int, typer.Option(
        rich_help_panel=REMEDIES_PANEL,
        min=0, max=10_000, help="Remedy (DARTS+): stop when the derived genotype has been the "
                                "same for N consecutive epoch ends (0 disables; N >= 2).")] = 0,
    select: Annotated[Select, typer.Option(
        rich_help_panel=REMEDIES_PANEL,
        help="The final genotype: perturbation (DARTS-PT, on the validation half; above "
             "random cells on both proxies, docs/results/darts.md) or argmax (DARTS' "
             "derivation).")] = "perturbation",
    edge_order: Annotated[EdgeOrder, typer.Option(
        rich_help_panel=SEARCH_PANEL,
        help="How genotype.json lists a node's two edges: input (lower input first) or "
             "strength (stronger edge first, as DARTS' code does); the same cell.")
    ] = "input",
    model: Annotated[str | None, typer.Option(
        rich_help_panel=NETWORK_PANEL,
        help="The network around the cells: a funcgraph.factory config file or name whose "
             "model is a darts_search supernet, giving some of c, layers, steps (nodes per "
             "cell), multiplier, stem_multiplier and arch_init_scale (default: DARTS' cells, "
             "-C 8, --layers 5).")] = None,
    channels: Annotated[int | None, typer.Option(
        "-C", "--channels", rich_help_panel=NETWORK_PANEL, min=2, max=512,
        help="Initial cell width C (default 8; or c in --model, not both).")] = None,
    layers: Annotated[int | None, typer.Option(
        rich_help_panel=NETWORK_PANEL,
        min=3, max=64, help="Cells in the supernet (default 5; or layers in --model, not "
                            "both).")] = None,
    batch_size: Annotated[int, typer.Option(
        min=1, max=4096, rich_help_panel=SEARCH_PANEL, help="Images per batch.")] = 32,
    dataset: Annotated[str, typer.Option(
        rich_help_panel=DATA_PANEL,
        help=f"The images' dataset (a classification one: {dataset_help()}); its train "
             "split's classes, each class's images halved into weights and architecture.")
    ] = "glyphs",
    data_root: DataRootOption = None,
    classes: Annotated[int, typer.Option(rich_help_panel=DATA_PANEL, min=2, max=10_000,
                                         help="Classes to classify, spread evenly over the "
                                              "split.")] = 20,
    image_size: Annotated[int, typer.Option(
        rich_help_panel=DATA_PANEL,
        min=8, max=64, help="Image resolution (a multiple of 4).")] = 16,
    space: Annotated[Path | None, typer.Option(
        rich_help_panel=NETWORK_PANEL,
        help="A search space file: {\"primitives\": [\"sep_conv_3x3\", ...]} naming built-in "
             "ops or ops registered by an --import module (default: DARTS' eight).")] = None,
    *,
    run: RunOptions,
) -> None:
    """Search a DARTS cell on image classification, glyphs by default (train half fits
    weights, validation half the architecture); writes genotype.json, alpha_history.jsonl
    and alphas.png to --out.

    Example: funcgraph search --epochs 10 --order second --out runs/darts
    Example: funcgraph search --model examples/configs/darts_search.toml --out runs/three-nodes
    Example: funcgraph search --dataset rgb-shapes --seed 1 --out runs/darts-rgb

    --resume --out RUN continues the run with its thread count unless --threads is named
    (--steps, --epochs and --threads may change; the other options must match the run's).

    Then: funcgraph train --genotype runs/darts/genotype.json
    """
    from .. import distributed, random
    from ..nas import BilevelConfig, SearchConfig, load_space
    from ..params import count
    from ..placement import resolve_device
    from ..runs import class_halves, run_search
    from ..runs.search_plan import network_fields, plan_search

    named = named_options(ctx)  # a resume keeps the run's count unless --threads is named
    threads = run.threads if not run.resume or "threads" in named else 0
    run.start(threads=threads)

    bilevel = BilevelConfig(order=order, hypergradient=hypergradient)
    cfg = SearchConfig(**network_fields(model, channels=channels, layers=layers),
                       epochs=epochs, steps=steps,
                       batch_size=batch_size, partial_channels=partial_channels,
                       skip_cap=skip_cap, stop_skips=stop_skips or None, seed=run.seed,
                       bilevel=bilevel,
                       primitives=load_space(space) if space is not None else None,
                       warmup_epochs=warmup_epochs, beta_reg=beta_reg, aux_skip=aux_skip,
                       edge_normalization=edge_normalization, stop_stable=stop_stable,
                       select=select, edge_order=edge_order)
    data = class_halves(dataset, num_classes=classes, image_size=image_size,
                        data_root=data_root)
    if run.dry_run:
        plan = plan_search(data, cfg, device=resolve_device(run.device))
        params, _ = plan.model.init(random.key(run.seed))
        show_plan(plan.config, [f"parameters: {count(params):,} "
                                "(supernet, architecture included)",
                                f"steps: {plan.total} ({plan.per_epoch} per epoch)",
                                "dry run: nothing written"])
        return
    env = run.join()
    dev = resolve_device(run.device)
    out = run.run_dir(f"search-{dataset}", env)
    if env.is_main:
        echo(f"searching on {data.name}: {data.train_x.shape[0]} train / "
             f"{data.val_x.shape[0]} validation images, {order} order, "
             f"device {dev}, {env.world_size} process(es)")
    with distributed.joined(env):
        result = run_search(out, data, cfg, resume=run.resume, device=dev, env=env,
                            tensorboard=run.tensorboard, threads=threads)
    if not env.is_main:
        return
    g = result.genotype
    echo(f"normal: {[list(e) for e in g.normal]}")
    echo(f"reduce: {[list(e) for e in g.reduce]}")
    stop = {"collapse_guard": " (stopped early by the collapse guard)",
            "stop_stable": f" (stopped early: genotype stable for {stop_stable} epoch ends)"
            }.get(result.stop_reason or "", "")
    echo(f"{result.steps_done} steps in {result.seconds:.0f} s{stop}; supernet validation "
         f"accuracy {result.val_acc:.3f}; skip connections normal {g.skips('normal')}, "
         f"reduce {g.skips('reduce')}")
    echo(f"wrote {result.path / 'genotype.json'}, alpha_history.jsonl, alphas.png")


def register(app: typer.Typer) -> None:
    app.command("search")(search)
