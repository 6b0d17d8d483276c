"""``funcgraph export``: a run directory's model as a ``torch.export`` ``.pt2`` artifact."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .common import console, user_errors


@user_errors
def export(
    run_dir: Annotated[Path, typer.Argument(help="Run directory (config.json + checkpoints/).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the .pt2 file.")] =
        Path("model.pt2"),
    checkpoint: Annotated[str, typer.Option(help="Checkpoint tag: last or best.")] = "last",
    input_shape: Annotated[str | None, typer.Option(
        help="Example input shape with batch dim (default: the run's or model's).")] = None,
    dynamic_batch: Annotated[bool, typer.Option(
        "--dynamic-batch/--static-batch", help="Make the batch dim symbolic.")] = True,
    onnx: Annotated[Path | None, typer.Option(
        help="Also write an ONNX file here (needs onnx + onnxscript).")] = None,
) -> None:
    """Rebuild the run's model, load its checkpoint and export it for plain PyTorch.

    The artifact loads with torch.export.load(path).module() in a process without funcgraph.

    Example: funcgraph export runs/omniglot --out model.pt2 --checkpoint best
    """
    import torch

    from .. import random
    from ..errors import ConfigError
    from ..export import export as export_program
    from ..export import export_onnx
    from ..factory import meta_init
    from ..train.run import Run
    from .graph import model_input_shape, resolve_model

    run = Run.open(run_dir)
    spec = run.config.get("model")
    if not spec:
        raise ConfigError(f"{run_dir}/config.json has no 'model' entry to rebuild the model from")
    model = resolve_model(spec)
    expect_params, expect_state = meta_init(model)
    groups, _ = run.load(checkpoint, expect={"params": expect_params, "state": expect_state})
    params, state = groups.get("params", {}), groups.get("state", {})
    shape = model_input_shape(model, input_shape, run.config.get("input_shape"))
    x = random.normal(random.key(0), shape)
    program = export_program(model, params, state, x, dynamic_batch=dynamic_batch, path=out)
    expected, _ = model.apply(params, state, x, train=False)
    got = torch.export.load(str(out)).module()(x)
    err = max((a - b).abs().max().item() for a, b in zip(
        torch.utils._pytree.tree_leaves(expected), torch.utils._pytree.tree_leaves(got),
        strict=True))
    ops = sum(1 for n in program.graph.nodes if n.op == "call_function")
    console.print(
        f"exported {model.name} ({checkpoint}) to {out}: {ops} ops, "
        f"{'dynamic' if dynamic_batch else 'static'} batch, input {list(shape)}, "
        f"max |reloaded - eager| = {err:.2e}",
        highlight=False,
    )
    if onnx is not None:
        export_onnx(model, params, state, x, onnx, dynamic_batch=dynamic_batch)
        console.print(f"wrote ONNX to {onnx}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("export")(export)
