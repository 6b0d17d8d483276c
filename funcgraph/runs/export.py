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
from ..export import export, export_onnx, onnx_available
from ..factory import meta_init
from ..model import Model
from ..train import Run
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


def export_run(
    run_dir: str | Path,
    out: str | Path,
    *,
    checkpoint: str = "last",
    input_shape: Sequence[int] | None = None,
    dynamic_batch: bool = True,
    onnx: str | Path | None = None,
) -> Exported:
    """Export the run in ``run_dir`` at ``checkpoint`` to ``out`` (and to ``onnx`` if given).

    Everything is checked before a file is written: the run, its model, the checkpoint, the
    input shape and, for ``onnx``, that the ONNX exporter is installed.
    """
    if onnx is not None and not onnx_available():
        raise ExportError("--onnx needs the onnx and onnxscript packages "
                          "(pip install onnx onnxscript); nothing was written")
    run = Run.open(run_dir)
    spec = run.config.get("model")
    if not spec:
        raise ConfigError(f"{run_dir}/config.json has no 'model' entry to rebuild the model from")
    model = resolve_model(spec)
    expect_params, expect_state = meta_init(model)
    groups, _ = run.load(checkpoint, expect={"params": expect_params, "state": expect_state})
    params, state = groups.get("params", {}), groups.get("state", {})
    shape = tuple(input_shape) if input_shape is not None else run_input_shape(model, run.config)
    x = random.normal(random.key(0), shape)
    program = export(model, params, state, x, dynamic_batch=dynamic_batch, path=out)
    expected, _ = model.apply(params, state, x, train=False)
    got = torch.export.load(str(out)).module()(x)
    err = max((a - b).abs().max().item() for a, b in zip(
        torch.utils._pytree.tree_leaves(expected), torch.utils._pytree.tree_leaves(got),
        strict=True))
    ops = sum(1 for n in program.graph.nodes if n.op == "call_function")
    if onnx is not None:
        export_onnx(model, params, state, x, onnx, dynamic_batch=dynamic_batch)
    return Exported(model.name, checkpoint, Path(out), shape, ops, err)


__all__ = ["Exported", "export_run", "run_input_shape"]
