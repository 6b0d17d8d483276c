"""The saved ``.pt2`` artifact: its ``funcgraph.json`` record, and loading it with input checks.

:func:`save` writes a program with a record of the model, its input specs (shape, ``null``
where a dim is dynamic, and dtype), whether each sample's output was checked to be its own, and
the versions. :func:`load` returns a :class:`CheckedModule`, which checks every input against
the program's input specs (:class:`InputSpec`, read from its graph by :func:`input_specs`)
before running, so a wrong input is an :class:`~funcgraph.errors.ExportError` naming the
artifact, the input, the expected shape and dtype and what it got.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import ExportError
from ..model import Model

METADATA_FILE = "funcgraph.json"


def save(
    program: torch.export.ExportedProgram,
    path: str | Path,
    *,
    model: Model | None = None,
    example_inputs: Sequence[Tensor] = (),
    dynamic_batch: bool = True,
    per_sample: bool | None = None,
) -> Path:
    """``torch.export.save`` plus a ``funcgraph.json`` extra file describing the artifact: the
    model name, the traced input shapes, the input specs (``"inputs"``: per input its
    ``shape``, ``null`` where a dim is dynamic, and ``dtype``), whether each sample's output
    was checked to be its own (``per_sample``: ``null`` when unchecked) and the versions."""
    import funcgraph

    meta = {
        "model": None if model is None else model.name,
        "input_shapes": [list(t.shape) for t in example_inputs],
        "inputs": [{"shape": list(spec.shape), "dtype": _dtype_name(spec.dtype)}
                   for spec in input_specs(program)],
        "dynamic_batch": dynamic_batch,
        "per_sample": per_sample,
        "funcgraph": funcgraph.__version__,
        "torch": torch.__version__,
    }
    out = Path(path)
    if out.is_dir():
        raise ExportError(f"save: path {out} is a directory; name a file, e.g. "
                          f"{out / 'model.pt2'}")
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(out), extra_files={METADATA_FILE: json.dumps(meta)})
    return out


def _load(path: str | Path) -> tuple[torch.export.ExportedProgram, dict[str, Any]]:
    """The program saved at ``path`` and its ``funcgraph.json`` record (``{}`` if absent)."""
    p = Path(path)
    if not p.is_file():
        raise ExportError(f"{p}: no such exported model file")
    extra = {METADATA_FILE: ""}
    try:
        program = torch.export.load(str(p), extra_files=extra)
        meta = json.loads(extra[METADATA_FILE]) if extra[METADATA_FILE] else {}
    except Exception as e:  # a damaged or foreign file: torch and json raise many types
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ExportError(f"{p}: not a saved torch.export program: {first}") from None
    return program, dict(meta)


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The ``funcgraph.json`` record saved with an artifact (``{}`` if absent)."""
    return _load(path)[1]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class InputSpec:
    """What one input of an exported program must be: a tensor of ``dtype`` with
    ``len(shape)`` dims, each equal to ``shape``'s entry where that is an int (``None``: a
    dynamic dim, such as the batch)."""

    shape: tuple[int | None, ...]
    dtype: torch.dtype

    def describe(self) -> str:
        """``(batch, 1, 28, 28) float32``: dynamic dims are ``batch`` (dim 0) or ``?``."""
        dims = ["batch" if d is None and i == 0 else "?" if d is None else str(d)
                for i, d in enumerate(self.shape)]
        return f"({', '.join(dims)}{',' * (len(dims) == 1)}) {_dtype_name(self.dtype)}"

    def problem(self, x: Any) -> str | None:
        """Why ``x`` cannot be this input (the first reason), or None when it can."""
        if not isinstance(x, Tensor):
            return f"expected a tensor, got {type(x).__name__}"
        got = tuple(x.shape)
        if x.dim() != len(self.shape):
            return f"expected {len(self.shape)} dims, got {x.dim()} (shape {got})"
        for i, (want, size) in enumerate(zip(self.shape, got, strict=True)):
            if want is not None and want != size:
                return f"dim {i} must be {want}, got {size} (shape {got})"
        if x.dtype != self.dtype:
            name = _dtype_name(self.dtype)
            return (f"expected dtype {name}, got {_dtype_name(x.dtype)} "
                    f"(convert with x.to(torch.{name}))")
        return None


def input_specs(program: torch.export.ExportedProgram) -> tuple[InputSpec, ...]:
    """The spec of each user input of ``program``, read from its graph's placeholders.

    Raises:
        ExportError: an input is not a tensor (not a program :func:`export` writes).
    """
    user = program.graph_signature.user_inputs
    values = {n.name: n.meta.get("val") for n in program.graph.nodes if n.op == "placeholder"}
    specs = []
    for i, name in enumerate(user):
        val = values.get(name)
        if not isinstance(val, Tensor):
            raise ExportError(f"input {i} ({name}) of the program is not a tensor; only "
                              "programs of tensor inputs have input specs")
        specs.append(InputSpec(tuple(d if isinstance(d, int) else None for d in val.shape),
                               val.dtype))
    return tuple(specs)


class CheckedModule(nn.Module):
    """An exported program's module that checks its inputs before running (see :func:`load`).

    Attributes:
        module: the program's own module, what ``torch.export.load(path).module()`` gives.
        program: the ``ExportedProgram``.
        inputs: one :class:`InputSpec` per input.
        metadata: the artifact's ``funcgraph.json`` record (``{}`` if absent).
        source: where the program was loaded from, for messages.
    """

    def __init__(self, program: torch.export.ExportedProgram, source: str,
                 metadata: Mapping[str, Any]) -> None:
        super().__init__()
        self.module = program.module()
        self.program = program
        self.inputs = input_specs(program)
        self.metadata = dict(metadata)
        self.source = source

    def check(self, inputs: Sequence[Any]) -> None:
        """Raise :class:`ExportError` unless ``inputs`` fit :attr:`inputs`."""
        if len(inputs) != len(self.inputs):
            want = ", ".join(spec.describe() for spec in self.inputs)
            raise ExportError(f"{self.source}: expected {len(self.inputs)} input(s) [{want}], "
                              f"got {len(inputs)}")
        for i, (spec, x) in enumerate(zip(self.inputs, inputs, strict=True)):
            problem = spec.problem(x)
            if problem is not None:
                raise ExportError(f"{self.source}: input {i} {spec.describe()}: {problem}")

    def forward(self, *inputs: Any) -> Any:
        self.check(inputs)
        return self.module(*inputs)


def load(path: str | Path) -> CheckedModule:
    """The artifact saved at ``path`` as a module whose wrong inputs raise :class:`ExportError`
    with the expected and received shape and dtype (see :mod:`funcgraph.export` for what
    ``torch.export.load(path).module()`` says instead).

    Example: ``load("model.pt2")(x)``.

    Raises:
        ExportError: the file is missing or not a saved program.
    """
    program, meta = _load(path)
    return CheckedModule(program, str(path), meta)


__all__ = [
    "METADATA_FILE",
    "CheckedModule",
    "InputSpec",
    "input_specs",
    "load",
    "read_metadata",
    "save",
]
