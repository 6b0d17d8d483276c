"""What ``funcgraph export RUN_DIR`` runs: a run's model, checkpoint loaded, as a ``.pt2`` file.

The model comes from the run's ``config.json`` through :func:`~funcgraph.runs.resolve_model`
and the example input's shape from what the run trained on (:func:`run_input_shape`), so a run
directory exports with no other option. The artifact is reloaded and compared with the eager
model before the command reports success.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .. import random
from ..errors import ConfigError, ExportError
from ..export import (
    batch_coupling,
    export,
    export_onnx,
    onnx_available,
    onnx_files,
    read_metadata,
)
from ..factory import meta_init
from ..files import atomic_write
from ..meta import step_params
from ..model import Model
from ..nn import masked_exits, per_sample_exits
from ..plugins import import_recorded
from ..train import Run
from ..train.checkpoint import verify_groups
from .resolve import resolve_model


def run_input_shape(model: Model, config: Mapping[str, Any]) -> tuple[int, ...]:
    """One example input's shape ``(1, ...)`` for the run ``config`` describes: the run's or
    the model config's ``input_shape``, else what it trained on (a meta-train run's
    ``in_channels`` and ``image_size`` or an MLP's ``in_features``, a ``train`` run's glyph
    size)."""
    for given in (config.get("input_shape"), model.meta.get("input_shape")):
        if given:
            return tuple(int(d) for d in given)
    spec = config.get("model", {})
    if isinstance(spec, Mapping) and "in_channels" in spec and "image_size" in spec:
        size = int(spec["image_size"])
        return (1, int(spec["in_channels"]), size, size)
    if isinstance(spec, Mapping) and "in_features" in spec:  # an MLP: (batch, features)
        return (1, int(spec["in_features"]))
    data = config.get("data", {})
    if isinstance(data, Mapping) and data.get("name") == "glyphs":
        size = int(data.get("image_size", 28))
        return (1, 1, size, size)
    raise ConfigError(f"model {model.name!r}: the run records no input shape; pass "
                      "--input-shape, e.g. --input-shape 1,1,28,28")


@dataclass(frozen=True)
class Exported:
    """An exported run: what was written and how closely the reloaded artifact matches."""

    model_name: str
    checkpoint: str
    path: Path
    input_shape: tuple[int, ...]
    ops: int
    max_abs_error: float
    per_sample: bool
    onnx_files: tuple[Path, ...] = ()
    dynamic_batch: bool = True


FAILURE_FILE = "export-failure.txt"
"""Where a failed export of a run leaves torch's whole report (often pages of generated graph
code), inside the run directory, so the error itself stays one line."""


def export_run(
    run_dir: str | Path,
    out: str | Path,
    *,
    checkpoint: str = "last",
    input_shape: Sequence[int] | None = None,
    dynamic_batch: bool = True,
    onnx: str | Path | None = None,
    batch_dependent: bool = False,
    batched_exits: bool = False,
) -> Exported:
    """Export the run in ``run_dir`` at ``checkpoint`` to ``out`` (and to ``onnx`` if given).

    Everything is checked before a file is written: the run, its model, the checkpoint, the
    input shape, that ``out`` and ``onnx`` are not directories, that the outputs are
    per-sample (see :func:`funcgraph.export.export`; ``batch_dependent=True`` exports a
    batch-dependent model as it is) and, for ``onnx``, that the ONNX exporter is installed.
    A failed export is one :class:`ExportError` line that names :data:`FAILURE_FILE` in the
    run directory, where torch's whole report is written.

    An early-exit model (:func:`funcgraph.nn.early_exit`) exports as its per-sample program
    (:func:`~funcgraph.nn.per_sample_exits`: batch 1, each exit a ``torch.cond`` that skips the
    later blocks), or with ``batched_exits`` as its masked program
    (:func:`~funcgraph.nn.masked_exits`: any batch, every block for every row).
    """
    for option, path, name in (("--out", out, "model.pt2"), ("--onnx", onnx, "model.onnx")):
        if path is not None and Path(path).is_dir():
            raise ExportError(f"{option} {path} is a directory; name the file to write, e.g. "
                              f"{Path(path) / name}")
    if onnx is not None and not onnx_available():
        raise ExportError("--onnx needs the onnx and onnxscript packages "
                          "(pip install onnx onnxscript); nothing was written")
    run = Run.open(run_dir)
    import_recorded(run.config, run_dir)
    spec = run.config.get("model")
    if not spec:
        raise ConfigError(f"{run_dir}/config.json has no 'model' entry to rebuild the model from")
    model = resolve_model(spec)
    if batched_exits and "exits" not in model.meta:
        raise ConfigError(f"--batched-exits: {model.name!r} has no early exits")
    if "exits" in model.meta:
        model = masked_exits(model) if batched_exits else per_sample_exits(model)
        dynamic_batch = dynamic_batch and batched_exits  # the per-sample program takes one
    expect_params, expect_state = meta_init(model)
    groups, _ = run.load(checkpoint)
    if "algo" in run.config:  # the meta-initialisation: the learner's own params stay behind
        groups["params"] = step_params(groups.get("params", {}), 0)  # MAML++: step 0's norms
    verify_groups(run.checkpoint_dir / checkpoint, groups,
                  {"params": expect_params, "state": expect_state})
    params, state = groups.get("params", {}), groups.get("state", {})
    shape = tuple(input_shape) if input_shape is not None else run_input_shape(model, run.config)
    if model.meta.get("program") == "per_sample" and shape[0] != 1:
        raise ConfigError(f"--input-shape {','.join(map(str, shape))}: the per-sample program "
                          "of an early-exit model takes one sample (batch 1); pass "
                          "--batched-exits for the masked batch program")
    x = random.normal(random.key(0), shape)
    if not batch_dependent and (coupling := batch_coupling(model, params, state, (x,))):
        raise ExportError(batch_remedy(run.config, model.name, coupling))
    try:
        program = export(model, params, state, x, dynamic_batch=dynamic_batch, path=out,
                         batch_dependent=batch_dependent)
    except ExportError as e:
        raise _reported(e, run.path) from None
    expected, _ = model.apply(params, state, x, train=False)
    got = torch.export.load(str(out)).module()(x)
    err = max((a.double() - b.double()).abs().max().item() for a, b in zip(
        torch.utils._pytree.tree_leaves(expected), torch.utils._pytree.tree_leaves(got),
        strict=True))  # as float64: bool outputs (an early exit's exited) compare too
    ops = sum(1 for n in program.graph.nodes if n.op == "call_function")
    written: tuple[Path, ...] = ()
    if onnx is not None:
        try:
            export_onnx(model, params, state, x, onnx, dynamic_batch=dynamic_batch,
                        batch_dependent=True)  # checked above: the program's own export
        except ExportError as e:
            raise _reported(e, run.path) from None
        written = tuple(onnx_files(onnx))
    per_sample = read_metadata(out).get("per_sample") is True
    return Exported(model.name, checkpoint, Path(out), shape, ops, err, per_sample, written,
                    dynamic_batch)


def batch_remedy(config: Mapping[str, Any], model_name: str, coupling: float) -> str:
    """The refusal of a run whose model's outputs depend on the batch, naming the remedy the
    run's commands accept: ``--batch-dependent`` (a meta-learner's conv4 normalises each task's
    images together, at training and at evaluation alike, and keeps no running statistics to
    export instead)."""
    head = (f"export of {model_name!r}: its outputs depend on the batch (a sample alone and "
            f"beside another differ by up to {coupling:.2g}): batch norm uses batch statistics")
    algo = config.get("algo")
    if not isinstance(algo, str):
        return (f"{head}; pass --batch-dependent to export it as it is, or train with batch "
                "norm's running statistics for a per-sample program")
    return (f"{head}, as {algo} evaluates (each task's images normalised together); pass "
            "--batch-dependent to export it so, and feed a task's support and query images "
            "as one batch")


def _reported(error: ExportError, run_dir: Path) -> ExportError:
    """``error`` (one line); where torch's report is its cause, that report is written to
    :data:`FAILURE_FILE` in the run directory and the line names it."""
    cause = error.__cause__
    if cause is None or not str(cause).strip():
        return error
    report = run_dir / FAILURE_FILE
    notes = "".join(f"\n{note}\n" for note in getattr(cause, "__notes__", []))
    atomic_write(report, (f"{error}\n\n{type(cause).__name__}: {cause}\n{notes}").encode())
    return ExportError(f"{error} (torch's full report: {report})")


__all__ = ["FAILURE_FILE", "Exported", "export_run", "run_input_shape"]
