"""``funcgraph graph``: capture and print the graph a model actually executed for one input."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from .common import (
    DeviceOption,
    ImportOption,
    PlaceOption,
    console,
    import_plugins,
    parse_shape,
    user_errors,
)

if TYPE_CHECKING:
    from ..model import Model


class GraphFormat(StrEnum):
    text = "text"
    mermaid = "mermaid"
    dot = "dot"
    svg = "svg"


def model_input_shape(model: Model, given: str | None) -> tuple[int, ...]:
    """The input shape from ``--input-shape``, else the model config's ``input_shape``."""
    from ..errors import ConfigError

    if given:
        return parse_shape(given)
    recorded = model.meta.get("input_shape")
    if recorded:
        return tuple(int(d) for d in recorded)
    raise ConfigError(f"model {model.name!r} records no input shape; pass --input-shape, "
                      "e.g. --input-shape 1,1,28,28")


@user_errors
def graph(
    model: Annotated[str, typer.Option("--model", "-m",
                                       help="Registered model name or config file.")],
    input_shape: Annotated[str | None, typer.Option(
        help="Input shape with batch dim, e.g. 1,1,28,28 (default: the config's).")] = None,
    fmt: Annotated[GraphFormat, typer.Option("--format", "-f", help="Output format.")] =
        GraphFormat.text,
    seed: Annotated[int, typer.Option(min=0, max=2**31 - 1,
                                             help="Seed of params, input and model key.")] = 0,
    train: Annotated[bool, typer.Option(
        "--train/--eval", help="Train mode: stochastic depth and dropout draw from the key.")]
        = False,
    depth: Annotated[int, typer.Option(
        min=0, max=100,
        help="Collapse blocks deeper than this many name levels (0: every op).")] = 0,
    overrides: Annotated[list[str] | None, typer.Option(
        "--set", "-s", help="Model override KEY=VALUE (repeatable).")] = None,
    device: DeviceOption = "auto",
    out: Annotated[Path | None, typer.Option(help="Write here instead of printing.")] = None,
    import_: ImportOption = None,
    place: PlaceOption = None,
) -> None:
    """Run a model once on a random input and show the graph that actually executed.

    Ops are grouped by block (layer1.0.conv1); with stochastic depth (--train) or
    early exit, different --seed values show different paths.

    Example: funcgraph graph --model conv4 --set ways=5 --input-shape 1,1,28,28 --format mermaid
    """
    from .. import params as P
    from .. import random
    from ..debug import capture, render
    from ..errors import ConfigError, ShapeError
    from ..factory import parse_overrides
    from ..files import atomic_write
    from ..placement import placed_model, resolve_device
    from ..runs import resolve_model
    from ..runs.memory import check_input_sizes

    import_plugins(import_)
    dev = resolve_device(device)
    built = resolve_model(model, parse_overrides(overrides or []))
    if place is not None:
        built = placed_model(built, place)
    shape = model_input_shape(built, input_shape)
    check_input_sizes(built, shape, dev)  # refuse what cannot fit before allocating it
    root = random.key(seed)
    params, state = built.init(random.fold_in(root, 0))
    if place is None:  # a placement plan has put the params where they belong
        params, state = P.to(params, dev), P.to(state, dev)
    x = random.normal(random.fold_in(root, 1), shape).to(dev)
    key = random.fold_in(root, 2).to(dev)
    try:
        g = capture(built.apply, params, state, x, key=key, train=train)
    except RuntimeError as e:  # torch's shape/dtype complaint about this input
        reason = str(e).strip().splitlines()[0]
        raise ShapeError(f"model {built.name!r} failed on input shape {list(shape)}: {reason}")\
            from None
    text = render.render(g.collapse(depth) if depth else g, fmt.value)
    if out is None:
        console.print(text, highlight=False, markup=False, soft_wrap=True)
    else:
        try:
            atomic_write(out, (text + "\n").encode())
        except OSError as e:
            raise ConfigError(f"--out {out}: cannot write the graph ({e.strerror or e})"
                              ) from None
        console.print(f"wrote {fmt.value} graph of {len(g)} nodes to {out}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("graph")(graph)
