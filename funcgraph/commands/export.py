"""``funcgraph export``: a run directory's model as a ``torch.export`` ``.pt2`` artifact."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .common import (
    CheckpointOption,
    ImportOption,
    console,
    import_plugins,
    parse_shape,
    user_errors,
)

EXPORT_PANEL = "Export"


@user_errors
def export(
    run_dir: Annotated[Path, typer.Argument(help="Run directory (config.json + checkpoints/).")],
    out: Annotated[Path, typer.Option(
        "--out", "-o", rich_help_panel=EXPORT_PANEL, help="Where to write the .pt2 file.")] =
        Path("model.pt2"),
    checkpoint: CheckpointOption = "last",
    input_shape: Annotated[str | None, typer.Option(
        rich_help_panel=EXPORT_PANEL,
        help="Example input shape with batch dim (default: what the run trained on).")] = None,
    dynamic_batch: Annotated[bool, typer.Option(
        "--dynamic-batch/--static-batch", rich_help_panel=EXPORT_PANEL,
        help="Make the batch dim symbolic.")] = True,
    onnx: Annotated[Path | None, typer.Option(
        rich_help_panel=EXPORT_PANEL,
        help="Also write an ONNX file here (needs onnx + onnxscript); the weights may go to "
             "a side file beside it, FILE.data, which the output names.")] = None,
    batch_dependent: Annotated[bool, typer.Option(
        "--batch-dependent", rich_help_panel=EXPORT_PANEL,
        help="Export a model whose outputs depend on the batch (batch norm with batch "
             "statistics) as it is, instead of refusing.")
    ] = False,
    batched_exits: Annotated[bool, typer.Option(
        "--batched-exits", rich_help_panel=EXPORT_PANEL,
        help="An early-exit model: export the masked program (any batch, every block for "
             "every row) instead of the per-sample one (batch 1, each exit a torch.cond that "
             "skips the later blocks).")] = False,
    import_: ImportOption = None,
) -> None:
    """Rebuild the run's model, load its checkpoint and export it for plain PyTorch.

    The artifact loads with torch.export.load(path).module() in a process without funcgraph.
    Its outputs are checked to be per-sample (one sample alone = the same sample in a batch);
    a model normalising with batch statistics (meta-train's conv4) is refused unless
    --batch-dependent. A ProtoNet run exports its embedding network: [N, 64] features per
    image, for prototypes of any number of classes, not class logits. An early-exit run
    exports its per-sample program (batch 1; an exit skips the later blocks) or, with
    --batched-exits, its masked batch program. A failed export is
    one error line naming RUN_DIR/export-failure.txt, where torch's whole report is.

    Example: funcgraph export runs/omniglot --out model.pt2 --checkpoint best
    """
    from ..runs import export_run

    import_plugins(import_)
    shape = parse_shape(input_shape) if input_shape is not None else None
    done = export_run(run_dir, out, checkpoint=checkpoint, input_shape=shape,
                      dynamic_batch=dynamic_batch, onnx=onnx, batch_dependent=batch_dependent,
                      batched_exits=batched_exits)
    samples = "per-sample outputs" if done.per_sample else "outputs depend on the batch"
    console.print(
        f"exported {done.model_name} ({done.checkpoint}) to {done.path}: {done.ops} ops, "
        f"{'dynamic' if done.dynamic_batch else 'static'} batch, input {list(done.input_shape)}, "
        f"{samples}, max |reloaded - eager| = {done.max_abs_error:.2e}",
        highlight=False, markup=False, soft_wrap=True,
    )
    if onnx is not None:
        side = [str(p) for p in done.onnx_files[1:]]
        beside = f" with its weights in {side[0]} (keep the two together)" if side else ""
        console.print(f"wrote ONNX to {onnx}{beside}", highlight=False, markup=False,
                      soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("export")(export)
