"""``funcgraph model check|list``: validate a model config and show its layers."""

from __future__ import annotations

from typing import Annotated

import typer

from . import help_layout
from .common import MODEL_PANEL, ImportOption, console, import_plugins, parse_shape, user_errors

model_app = typer.Typer(
    help="Model configs: check one (layers, shapes, parameter counts) or list what is available.",
    no_args_is_help=True,
    cls=help_layout.Group,
)

SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", rich_help_panel=MODEL_PANEL,
                 help="Override a variable or config path: --set hidden=128 (repeatable; "
                      "values are JSON literals or plain strings)."),
]


@user_errors
def check(
    config: Annotated[str, typer.Argument(help="A config file (.json/.toml/.yaml), a shipped "
                                               "config name or a registered model.")],
    set_: SetOption = None,
    input_shape: Annotated[
        str | None,
        typer.Option("--input-shape", rich_help_panel=MODEL_PANEL,
                     help="Input shape with batch dim, e.g. 1,1,28,28 (replaces the config's "
                          "input_shape)."),
    ] = None,
    import_: ImportOption = None,
) -> None:
    """Build a model config on meta tensors and print layer, output shape and parameter count.

    Example: funcgraph model check examples/configs/mlp.json --set hidden=128
    """
    from rich.table import Table

    from ..factory import check_model, parse_overrides
    from ..factory.build import fmt_shape

    import_plugins(import_)
    shape = parse_shape(input_shape) if input_shape is not None else None
    built = check_model(config, parse_overrides(set_ or []), input_shape=shape)
    table = Table(title=f"{built.model.name}  input {fmt_shape(built.input_shape)}")
    table.add_column("layer")
    table.add_column("type")
    table.add_column("output shape")
    table.add_column("params", justify="right")
    for row in built.rows:
        table.add_row("  " * row.depth + (row.module or "(model)"), row.type,
                      fmt_shape(row.output_shape), f"{row.params:,}")
    table.add_section()
    table.add_row("total", "", fmt_shape(built.output_shape), f"{built.total_params:,}")
    console.print(table)


@user_errors
def list_(import_: ImportOption = None) -> None:
    """List the layer types a config may use and the shipped reference configs.

    Example: funcgraph model list --import my_layers
    """
    import_plugins(import_)
    from rich.markup import escape
    from rich.table import Table

    from ..factory import shipped_configs
    from ..factory.registry import layer_types

    table = Table(title=escape("layer types: (inferred) required [optional] | slots"))
    table.add_column("type")
    table.add_column("params")
    table.add_column("summary")
    for name, (params, summary) in layer_types().items():
        table.add_row(name, escape(params), escape(summary))
    console.print(table)
    console.print("shipped configs: " + (", ".join(shipped_configs()) or "(none)"))


def register(app: typer.Typer) -> None:
    model_app.command("check")(check)
    model_app.command("list")(list_)
    app.add_typer(model_app, name="model")
