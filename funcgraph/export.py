"""Ship a model to plain PyTorch: ``torch.export`` programs saved as ``.pt2`` (and ONNX).

:func:`export` wraps ``(model, params, state)`` in a small ``nn.Module`` whose parameters and
buffers carry the exact funcgraph names (``layer1.0.conv1.weight``), runs the model in eval
mode (``train=False``, no key) and exports it. The artifact needs nothing from funcgraph:

    ep = torch.export.load("model.pt2")
    y = ep.module()(x)

Data-dependent branches written with ``torch.cond`` (or :func:`funcgraph.control.cond`, which
lowers to it while exporting) stay branches in the program; a plain Python ``if`` on a tensor
value cannot be exported and raises :class:`ExportError` saying so. With
``dynamic_batch=True`` (default) dim 0 of every input is symbolic, so any batch size runs.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .errors import ExportError
from .model import Model
from .params import Params, State

METADATA_FILE = "funcgraph.json"


class ExportWrapper(nn.Module):
    """``nn.Module`` view of a bound Model: params as frozen parameters, state as buffers.

    Submodules mirror the dotted names, so ``state_dict()`` keys equal the funcgraph names.
    """

    def __init__(self, model: Model, params: Params, state: State) -> None:
        super().__init__()
        self._model = model
        self._param_names = list(params)
        self._state_names = list(state)
        _check_names({**params, **state})
        try:
            for name, t in params.items():
                self._owner(name).register_parameter(
                    name.rpartition(".")[2], nn.Parameter(t.detach().clone(), requires_grad=False)
                )
            for name, t in state.items():
                self._owner(name).register_buffer(name.rpartition(".")[2], t.detach().clone())
        except KeyError as e:  # a name component clashes with an nn.Module attribute
            raise ExportError(f"export: tensor name not usable in an nn.Module: {e}") from None

    def _owner(self, name: str) -> nn.Module:
        module: nn.Module = self
        *path, leaf = name.split(".")
        for i, part in enumerate(path):
            child = module._modules.get(part)
            if child is None:
                if part in module._parameters or part in module._buffers:
                    raise ExportError(f"export: name {name!r} nests under the tensor "
                                      f"{'.'.join(path[: i + 1])!r}")
                child = nn.Module()
                module.add_module(part, child)
            module = child
        if leaf in module._modules or leaf in module._parameters or leaf in module._buffers:
            raise ExportError(f"export: name {name!r} is used twice or also names a scope")
        return module

    def forward(self, *inputs: Tensor) -> Any:
        tensors: dict[str, Tensor] = dict(self.named_parameters())
        tensors.update(self.named_buffers())
        params = {n: tensors[n] for n in self._param_names}
        state = {n: tensors[n] for n in self._state_names}
        x = inputs[0] if len(inputs) == 1 else inputs
        y, _ = self._model.apply(params, state, x, key=None, train=False)
        return y


def _check_names(tensors: Mapping[str, Tensor]) -> None:
    for name in tensors:
        if not name or any(not part for part in name.split(".")):
            raise ExportError(f"export: bad tensor name {name!r} (empty dotted component)")


def _as_tuple(example_inputs: Tensor | Sequence[Tensor]) -> tuple[Tensor, ...]:
    inputs = (example_inputs,) if isinstance(example_inputs, Tensor) else tuple(example_inputs)
    if not inputs or not all(isinstance(t, Tensor) for t in inputs):
        raise ExportError("export: example_inputs must be a tensor or a non-empty tuple of tensors")
    return inputs


def export(
    model: Model,
    params: Params,
    state: State,
    example_inputs: Tensor | Sequence[Tensor],
    *,
    dynamic_batch: bool = True,
    path: str | Path | None = None,
) -> torch.export.ExportedProgram:
    """Export ``model`` with ``params``/``state`` baked in, in eval mode.

    Arguments:
        model, params, state: what to export (the tensors are copied into the program).
        example_inputs: the input ``x`` (or a tuple when the model takes several tensors).
        dynamic_batch: make dim 0 of every input symbolic. An example batch of 1 is repeated
            to 2 for tracing, because torch specialises size-1 dims.
        path: also save the program there (``.pt2``) with a ``funcgraph.json`` extra file
            recording the model name, input shapes and versions.
    Returns:
        The ``torch.export.ExportedProgram``; ``program.module()(x)`` runs it.
    Raises:
        ExportError: the model cannot be exported (the message carries torch's reason).
    """
    inputs = _as_tuple(example_inputs)
    wrapper = ExportWrapper(model, params, state).eval()
    dynamic: Any = None
    if dynamic_batch:
        if any(t.dim() == 0 for t in inputs):
            raise ExportError("export: dynamic_batch needs inputs with a batch dim (got a scalar)")
        inputs = tuple(torch.cat([t, t]) if t.shape[0] == 1 else t for t in inputs)
        batch = torch.export.Dim("batch", min=1)
        dynamic = (tuple({0: batch} for _ in inputs),)  # one entry: the *inputs varargs
    try:
        program = torch.export.export(wrapper, inputs, dynamic_shapes=dynamic)
    except Exception as e:  # torch raises many unrelated types; all mean "not exportable"
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        hint = ""
        if "data-dependent" in str(e) or "GuardOnDataDependent" in type(e).__name__:
            hint = " (branch on tensor values with torch.cond / funcgraph.control.cond)"
        elif "side effect" in str(e):
            hint = (" (a cond branch changes outside state, e.g. calls run('child', h); "
                    "read run.params in branches instead)")
        raise ExportError(f"export of {model.name!r} failed: {first}{hint}") from e
    if path is not None:
        save(program, path, model=model, example_inputs=inputs, dynamic_batch=dynamic_batch)
    return program


def save(
    program: torch.export.ExportedProgram,
    path: str | Path,
    *,
    model: Model | None = None,
    example_inputs: Sequence[Tensor] = (),
    dynamic_batch: bool = True,
) -> Path:
    """``torch.export.save`` plus a ``funcgraph.json`` extra file describing the artifact."""
    import funcgraph

    meta = {
        "model": None if model is None else model.name,
        "input_shapes": [list(t.shape) for t in example_inputs],
        "dynamic_batch": dynamic_batch,
        "funcgraph": funcgraph.__version__,
        "torch": torch.__version__,
    }
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(out), extra_files={METADATA_FILE: json.dumps(meta)})
    return out


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The ``funcgraph.json`` record saved with an artifact (``{}`` if absent)."""
    extra = {METADATA_FILE: ""}
    torch.export.load(str(path), extra_files=extra)
    text = extra[METADATA_FILE]
    return dict(json.loads(text)) if text else {}


def onnx_available() -> bool:
    """Whether ``onnx`` and ``onnxscript`` (needed by torch's ONNX exporter) are importable."""
    return all(importlib.util.find_spec(m) is not None for m in ("onnx", "onnxscript"))


def export_onnx(
    model: Model,
    params: Params,
    state: State,
    example_inputs: Tensor | Sequence[Tensor],
    path: str | Path,
    *,
    dynamic_batch: bool = True,
) -> Path:
    """Export to an ONNX file through ``torch.onnx.export(..., dynamo=True)``.

    Raises :class:`ExportError` when ``onnx``/``onnxscript`` are not installed.
    """
    if not onnx_available():
        raise ExportError("ONNX export needs the onnx and onnxscript packages "
                          "(pip install onnx onnxscript)")
    program = export(model, params, state, example_inputs, dynamic_batch=dynamic_batch)
    out = Path(path)
    try:
        torch.onnx.export(program, (), str(out), dynamo=True)
    except Exception as e:  # the ONNX converter raises assorted types for unsupported ops
        raise ExportError(f"ONNX export of {model.name!r} failed: {e}") from e
    return out


__all__ = [
    "METADATA_FILE",
    "ExportWrapper",
    "export",
    "export_onnx",
    "onnx_available",
    "read_metadata",
    "save",
]
