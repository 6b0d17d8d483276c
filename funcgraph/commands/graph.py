"""``funcgraph graph``: capture and print the graph a model actually executed for one input."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from .common import (
    MODEL_PANEL,
    DeviceOption,
    ImportOption,
    PlaceOption,
    SeedOption,
    console,
    import_plugins,
    parse_shape,
    user_errors,
)

OUTPUT_PANEL = "Output"


class GraphFormat(StrEnum):
    text = "text"
    mermaid = "mermaid"
    dot = "dot"
    svg = "svg"


@user_errors
def graph(
    model: Annotated[str, typer.Option(
        "--model", "-m", rich_help_panel=MODEL_PANEL,
        help="Registered model name or config file.")],
    input_shape: Annotated[str | None, typer.Option(
        rich_help_panel=MODEL_PANEL,
        help="Input shape with batch dim, e.g. 1,1,28,28 (default: the config's).")] = None,
    overrides: Annotated[list[str] | None, typer.Option(
        "--set", "-s", rich_help_panel=MODEL_PANEL,
        help="Model override KEY=VALUE (repeatable).")] = None,
    seed: SeedOption = 0,
    train: Annotated[bool, typer.Option(
        "--train/--eval", rich_help_panel=MODEL_PANEL,
        help="Train mode: stochastic depth and dropout draw from the key.")] = False,
    import_: ImportOption = None,
    fmt: Annotated[GraphFormat, typer.Option(
        "--format", "-f", rich_help_panel=OUTPUT_PANEL, help="Output format.")] =
        GraphFormat.text,
    depth: Annotated[int, typer.Option(
        min=0, max=100, rich_help_panel=OUTPUT_PANEL,
        help="Collapse blocks deeper than this many name levels (0: every op).")] = 0,
    out: Annotated[Path | None, typer.Option(
        rich_help_panel=OUTPUT_PANEL, help="Write here instead of printing.")] = None,
    device: DeviceOption = "auto",
    place: PlaceOption = None,
) -> None:
    """Run a model once on a random input and show the graph that actually executed.

    Ops are grouped by block (layer1.0.conv1); with stochastic depth (--train) or
    early exit, different --seed values show different paths.

    Example: funcgraph graph --model conv4 --set ways=5 --input-shape 1,1,28,28 --format mermaid
    """
    from ..debug import render
    from ..errors import ConfigError
    from ..factory import parse_overrides
    from ..files import atomic_write
    from ..runs.graph import capture_model_graph

    import_plugins(import_)
    g = capture_model_graph(
        model, input_shape=parse_shape(input_shape) if input_shape else None, seed=seed,
        train=train, overrides=parse_overrides(overrides or []), device=device, place=place)
    text = render.render(g.collapse(depth) if depth else g, fmt.value)
    if out is None:
        console.print(text, highlight=False, markup=False, soft_wrap=True)
        return
    try:
        atomic_write(out, (text + "\n").encode())
    except OSError as e:
        raise ConfigError(f"--out {out}: cannot write the graph ({e.strerror or e})") from None
    console.print(f"wrote {fmt.value} graph of {len(g)} nodes to {out}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("graph")(graph)
