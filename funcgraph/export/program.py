"""Export a Model: a ``torch.export`` program with its params and state baked in, or ONNX.

:func:`export` wraps ``(model, params, state)`` in :class:`ExportWrapper`, an ``nn.Module``
whose parameters and buffers carry the exact funcgraph names, runs the model in eval mode and
traces it. Before tracing, :func:`batch_coupling` checks that each sample's output is its own
(an exported model is usually fed one sample or any batch); a failed trace is reported in one
line naming the likely fix. :func:`export_onnx` converts the same program to ONNX. Saving and
loading the ``.pt2`` file is :mod:`funcgraph.export.artifact`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import ExportError
from ..model import Model
from ..params import Params, State
from .artifact import save


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
        for t in inputs:  # kept by torch.export: the program itself refuses another dtype
            torch.ops.aten._assert_tensor_metadata.default(t, dtype=t.dtype)
        x = inputs[0] if len(inputs) == 1 else inputs
        y, _ = self._model.apply(params, state, x, key=None, train=False)
        if isinstance(y, tuple) and hasattr(y, "_fields"):
            # A named tuple (an early exit's ExitOutput) leaves as a plain tuple, in field
            # order: loading the program then needs no funcgraph class.
            return tuple(y)
        return y


def _check_names(tensors: Mapping[str, Tensor]) -> None:
    for name in tensors:
        if not name or any(not part for part in name.split(".")):
            raise ExportError(f"export: bad tensor name {name!r} (empty dotted component)")


def _as_tuple(example_inputs: Tensor | Sequence[Tensor]) -> tuple[Tensor, ...]:
    inputs = (example_inputs,) if isinstance(example_inputs, Tensor) else (
        tuple(example_inputs) if isinstance(example_inputs, Sequence) else ())
    if not inputs or not all(isinstance(t, Tensor) for t in inputs):
        raise ExportError("export: example_inputs must be a tensor or a non-empty tuple of tensors")
    return inputs


def _check_arguments(model: object, params: object, state: object, path: object,
                     **flags: object) -> None:
    """The arguments :func:`export` takes, checked before anything runs (one line each)."""
    if not isinstance(model, Model):
        raise ExportError(f"export: model must be a funcgraph Model, got {type(model).__name__}")
    for name, tree in (("params", params), ("state", state)):
        if not isinstance(tree, Mapping) or not all(isinstance(t, Tensor)
                                                    for t in tree.values()):
            raise ExportError(f"export: {name} must be a dict of tensors (model.init's), got "
                              f"{type(tree).__name__}")
    if path is not None and not isinstance(path, str | Path):
        raise ExportError(f"export: path must be a file path, got {type(path).__name__}")
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise ExportError(f"export: {name} must be True or False, got {value!r}")


def export(
    model: Model,
    params: Params,
    state: State,
    example_inputs: Tensor | Sequence[Tensor],
    *,
    dynamic_batch: bool = True,
    path: str | Path | None = None,
    batch_dependent: bool = False,
) -> torch.export.ExportedProgram:
    """Export ``model`` with ``params``/``state`` baked in, in eval mode.

    An exported model is usually fed one sample or any batch, so its outputs are first
    checked to be per-sample (:func:`batch_coupling`: a sample alone and the same sample
    beside another give the same output). A model whose outputs depend on the batch (batch
    norm with batch statistics, as meta-learning's transductive conv4 uses) is refused unless
    ``batch_dependent=True``; the artifact records which (``per_sample`` in
    ``funcgraph.json``). Per-sample behaviour comes from running statistics (batch norm with
    ``running_stats=True``).

    Arguments:
        model: what to export.
        params: its params (copied into the program).
        state: its state (copied into the program).
        example_inputs: the input ``x`` (or a tuple when the model takes several tensors).
        dynamic_batch: make dim 0 of every input symbolic. An example batch of 1 is repeated
            to 2 for tracing, because torch specialises size-1 dims.
        path: also save the program there (``.pt2``) with a ``funcgraph.json`` extra file
            recording the model name, input shapes and versions; not an existing directory.
        batch_dependent: export a model whose outputs depend on the batch as it is.
    Returns:
        The ``torch.export.ExportedProgram``; ``program.module()(x)`` runs it.
    Raises:
        ExportError: the model cannot be exported, in one line naming the likely fix (torch's
            whole report is the error's ``__cause__``), or its outputs depend on the batch.
    """
    _check_arguments(model, params, state, path, dynamic_batch=dynamic_batch,
                     batch_dependent=batch_dependent)
    inputs = _as_tuple(example_inputs)
    if path is not None and Path(path).is_dir():
        raise ExportError(f"export: path {path} is a directory; name a file, e.g. "
                          f"{Path(path) / 'model.pt2'}")
    coupling = batch_coupling(model, params, state, inputs)
    if coupling is not None and not batch_dependent:
        raise ExportError(
            f"export of {model.name!r}: its outputs depend on the batch (a sample alone and "
            f"beside another differ by up to {coupling:.2g}), as batch norm with batch "
            "statistics does; export per-sample behaviour from running statistics (batch norm "
            "with running_stats=True), or pass batch_dependent=True (export --batch-dependent) "
            "to export it as it is")
    wrapper = ExportWrapper(model, params, state).eval()
    dynamic: Any = None
    if dynamic_batch:
        if any(t.dim() == 0 for t in inputs):
            raise ExportError("export: dynamic_batch needs inputs with a batch dim (got a scalar)")
        inputs = tuple(torch.cat([t, t]) if t.shape[0] == 1 else t for t in inputs)
        batch = torch.export.Dim("batch", min=1)
        dynamic = (tuple({0: batch} for _ in inputs),)  # one entry: the *inputs varargs
    failure: Exception | None = None
    with torch_logs_kept() as logged:
        try:
            program = torch.export.export(wrapper, inputs, dynamic_shapes=dynamic)
        except Exception as e:  # torch raises many unrelated types; all mean "not exportable"
            failure = e
    if failure is not None:
        if logged:
            failure.add_note("torch's log during the export:\n" + "\n".join(logged))
        raise ExportError(_export_failure(model.name, failure)) from failure
    if path is not None:
        try:
            save(program, path, model=model, example_inputs=inputs,
                 dynamic_batch=dynamic_batch, per_sample=coupling is None)
        except ExportError:
            raise
        except Exception as e:  # torch's serialiser refusing what the program holds
            raise ExportError(_export_failure(model.name, e)) from e
    return program


class _Kept(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__()
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}")


@contextlib.contextmanager
def torch_logs_kept() -> Iterator[list[str]]:
    """Keep what torch's loggers write inside the block (warnings and generated graph code a
    failed trace prints) in the yielded list instead of on stderr: a failed export stays one
    line, and its report (the error's notes) carries the log."""
    lines: list[str] = []
    handler = _Kept(lines)
    names = ["torch", *(n for n in list(logging.root.manager.loggerDict)
                        if n.startswith("torch."))]
    loggers = [logging.getLogger(n) for n in names]
    saved = [(lg, lg.handlers[:]) for lg in loggers]
    for lg in loggers:
        if lg.handlers:
            lg.handlers = [handler]
    printed = io.StringIO()  # what torch writes to sys.stderr itself
    try:
        with contextlib.redirect_stderr(printed):
            yield lines
    finally:
        for lg, handlers in saved:
            lg.handlers = handlers
        lines.extend(printed.getvalue().splitlines())


def batch_coupling(model: Model, params: Params, state: State,
                   inputs: tuple[Tensor, ...]) -> float | None:
    """How far the model's outputs for one sample move when another sample shares its batch
    (the largest absolute change, eval mode), or ``None`` when they do not move (to 1e-5
    relative) or cannot be compared (integer inputs such as tokens, outputs without a batch
    dim, or a model that fails here and is left to the export to report)."""
    if not all(t.is_floating_point() and t.dim() > 0 and t.shape[0] >= 1 for t in inputs):
        return None
    one = tuple(t[:1] for t in inputs)
    pair = tuple(torch.cat([t, 1.0 - 2.0 * t]) for t in one)  # a different second sample

    def run(xs: tuple[Tensor, ...]) -> list[Tensor]:
        with torch.no_grad():
            y, _ = model.apply(params, state, xs[0] if len(xs) == 1 else xs, key=None,
                               train=False)
        return [t for t in torch.utils._pytree.tree_leaves(y) if isinstance(t, Tensor)]

    try:
        alone, both = run(one), run(pair)
    except Exception:  # not this check's to report: the export says what is wrong
        return None
    worst = 0.0
    for a, b in zip(alone, both, strict=False):
        if a.dim() == 0 or a.shape[0] != 1 or b.shape[0] != 2 or not a.is_floating_point():
            continue
        gap = (a - b[:1]).abs().max().item()
        if gap > 1e-5 * (1.0 + a.abs().max().item()):
            worst = max(worst, gap)
    return worst or None


def _export_failure(name: str, error: Exception) -> str:
    """The message of a failed export: one self-sufficient line, what failed and the likely
    fix; torch's whole report (often the generated graph code) stays the error's
    ``__cause__``, which ``funcgraph export`` writes to a file it names."""
    text = str(error).strip()
    if "data-dependent" in text or "GuardOnDataDependent" in type(error).__name__:
        summary = ("a Python `if` on a tensor value cannot be exported; use funcgraph.cond(pred, "
                   "true_fn, false_fn, *operands), which becomes torch.cond")
    elif "side effect" in text:
        summary = ("a cond branch changes outside state, e.g. calls run('child', h); read "
                   "run.params in branches instead")
    else:
        first = text.splitlines()[0] if text else type(error).__name__
        summary = first if len(first) <= 150 else first[:147] + "..."
    return f"export of {name!r} failed: {summary}"


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
    batch_dependent: bool = False,
) -> Path:
    """Export to an ONNX file through ``torch.onnx.export(..., dynamo=True)``.

    The exporter may keep the weights in a side file, ``path`` + ``.data`` (``x.onnx.data``),
    which must travel with the ``.onnx`` file: :func:`onnx_files` lists what was written.
    ``batch_dependent`` is :func:`export`'s.

    Raises :class:`ExportError` when ``onnx``/``onnxscript`` are not installed, or in one line
    when the model cannot be converted.
    """
    if not onnx_available():
        raise ExportError("ONNX export needs the onnx and onnxscript packages "
                          "(pip install onnx onnxscript)")
    out = Path(path)
    if out.is_dir():
        raise ExportError(f"export_onnx: path {out} is a directory; name a file, e.g. "
                          f"{out / 'model.onnx'}")
    program = export(model, params, state, example_inputs, dynamic_batch=dynamic_batch,
                     batch_dependent=batch_dependent)
    try:
        torch.onnx.export(program, (), str(out), dynamo=True)
    except Exception as e:  # the ONNX converter raises assorted types for unsupported ops
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:150]
        raise ExportError(f"ONNX export of {model.name!r} failed: {first}") from e
    return out


def onnx_files(path: str | Path) -> list[Path]:
    """The files an ONNX export to ``path`` wrote: the model and, where the exporter kept the
    weights apart, its ``.data`` side file."""
    out = Path(path)
    side = out.with_name(out.name + ".data")
    return [p for p in (out, side) if p.exists()]


__all__ = [
    "ExportWrapper",
    "batch_coupling",
    "export",
    "export_onnx",
    "onnx_available",
    "onnx_files",
]
