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

An input the program was not traced for is reported in one of two ways:

* :func:`load` (funcgraph installed) returns a :class:`CheckedModule` that checks every input
  against the program's input specs first (count, tensor, rank, each static dim, dtype) and
  raises :class:`ExportError` naming the artifact, the input, the expected shape and dtype
  and what it got: ``model.pt2: input 0 (batch, 1, 28, 28) float32: dim 1 must be 1, got 3
  (shape (8, 3, 28, 28))``. :func:`save` records the same specs in ``funcgraph.json``.
* ``torch.export.load(path).module()`` (no funcgraph) has only torch's own checks, which
  graphs cannot extend with messages: a wrong static dim fails a guard
  (``Guard failed: inputs_0.size()[1] == 1``), a wrong rank fails inside the guard code
  (``IndexError: tuple index out of range``, or a guard on a dim that exists). For the dtype the
  program carries an ``aten._assert_tensor_metadata`` check, so a float64 input reads
  ``Tensor dtype mismatch! Expected: Float, Got: double`` rather than failing inside the first
  layer.

Tracing (and ONNX) is :mod:`funcgraph.export.program`; the saved file, its record and the
checked loading are :mod:`funcgraph.export.artifact`.
"""

from typing import TYPE_CHECKING

from .._exports import lazy_exports
from .artifact import (
    METADATA_FILE,
    CheckedModule,
    InputSpec,
    input_specs,
    load,
    read_metadata,
    save,
)
from .program import (
    ExportWrapper,
    batch_coupling,
    export,
    export_onnx,
    onnx_available,
    onnx_files,
)

__all__ = [
    "METADATA_FILE",
    "CheckedModule",
    "ExportWrapper",
    "InputSpec",
    "batch_coupling",
    "export",
    "export_onnx",
    "input_specs",
    "load",
    "onnx_available",
    "onnx_files",
    "read_metadata",
    "save",
]


if not TYPE_CHECKING:  # type checkers see the names and submodules through the imports
    __getattr__, __dir__ = lazy_exports(__name__, __all__, submodules=("artifact", "program"))
