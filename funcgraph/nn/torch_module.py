"""``from_module``: any ``nn.Module`` as a Model, its CNN chains on funcgraph's own layers.

:func:`funcgraph.model.from_module` runs a module's own forward through
``torch.func.functional_call``: exact for every module. This one runs it that way too, unless
the forward is a chain (:func:`funcgraph.nn.torch_chain.read_chain`: ``nn.Sequential``,
nested Sequentials, children called in turn, ``F.relu``/``F.max_pool2d`` between them) with a
convolution or batch norm in it. Then the chain runs as funcgraph's layers with the same
params, state and names, and the rewrites :func:`funcgraph.models.conv4` makes, each exact:

* ``Conv2d -> BatchNorm2d`` is :func:`~funcgraph.nn.conv_batch_norm` (a narrow first
  convolution takes its batch statistics from the patches' covariance and folds the
  normalisation into its weights); batch norm is funcgraph's (its mean/var form inside
  ``torch.func`` transforms, whose second-order gradients are right under ``vmap``);
* ``ReLU -> MaxPool2d`` runs as ``MaxPool2d -> ReLU`` (ReLU is monotone: the same values and
  gradients, on a quarter of the values for 2x2 pooling);
* a max-pool (``MaxPool2d``, ``F.max_pool2d``) runs as :func:`~funcgraph.nn.max_pool`, whose
  window search is faster inside transforms;
* outside transforms a 4-D input is laid out channels-last, and a 4-D output is returned
  contiguous again.

A layer that cannot be written exactly this way (``padding_mode`` other than zeros, batch norm
with ``momentum=None``, a running-statistics flag that disagrees with the buffers) keeps the
whole module on the exact path; ``Conv2d`` with groups or string padding, or a batch norm not
after a ``Conv2d``, runs as separate funcgraph layers. The Model's ``meta["rewritten"]`` lists
each chain and how it runs; ``meta["not_rewritten"]`` says why a module kept the exact path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn

from .. import model as exact
from ..checks import check_bool
from ..control import in_transform
from ..errors import ShapeError
from ..model import Model
from ..params import Params, State
from ..random import Key
from .conv_norm import conv_batch_norm
from .functional import channels_last
from .linear import conv1d, conv2d, linear
from .norm import batch_norm
from .torch_chain import Op, read_chain

Run = Callable[[Params, State, Any, bool], tuple[Any, State]]
"""One step of a chain: ``(params, state, x, train) -> (y, state updates)``."""

_NORM_DIMS: dict[type[nn.Module], tuple[int, ...]] = {
    nn.BatchNorm1d: (2, 3), nn.BatchNorm2d: (4,), nn.BatchNorm3d: (5,)}
"""The input dims each batch norm takes (what its ``_check_input_dim`` allows)."""

Pair = tuple[int, int]


@dataclass(frozen=True)
class _Step:
    ops: tuple[Op, ...]
    run: Run
    how: str


def _named(layer: Model, names: dict[str, str], own: dict[str, Tensor],
           check: Callable[[Tensor], None] | None = None) -> Run:
    """``layer`` (a funcgraph Model) over the module's names: ``names`` maps the layer's
    param and state names to the module's. A name missing from the params or state passed is
    read from the module, as ``functional_call`` does."""
    p_names = {n: f for n, f in names.items() if f in own and isinstance(own[f], nn.Parameter)}
    s_names = {n: f for n, f in names.items() if f in own and n not in p_names}

    def run(params: Params, state: State, x: Any, train: bool) -> tuple[Any, State]:
        if check is not None:
            check(x)
        p = {n: params[f] if f in params else own[f] for n, f in p_names.items()}
        s = {n: state[f] if f in state else own[f] for n, f in s_names.items()}
        y, new = layer.apply(p, s, x, train=train)
        return y, {s_names[n]: t for n, t in new.items()}

    return run


def _local(prefix: str, module: nn.Module, path: str) -> dict[str, str]:
    """``{prefix.name: path.name}`` for the params and buffers of ``module`` itself."""
    tensors = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
    return {f"{prefix}{n}": f"{path}.{n}" for n, t in tensors if t is not None}


def _norm_refusal(norm: nn.Module, name: str) -> str | None:
    assert isinstance(norm, nn.modules.batchnorm._BatchNorm)
    momentum = norm.momentum
    if momentum is None or not 0.0 <= momentum <= 1.0:
        return f"batch norm {name!r} has momentum={momentum!r} (a cumulative average)"
    if (norm.running_mean is not None) != norm.track_running_stats or (
            norm.running_var is not None) != norm.track_running_stats:
        return f"batch norm {name!r}: track_running_stats disagrees with its buffers"
    if norm.affine != (norm.weight is not None and norm.bias is not None):
        return f"batch norm {name!r}: affine disagrees with its params"
    return None


def _norm(norm: nn.Module) -> Model:
    assert isinstance(norm, nn.modules.batchnorm._BatchNorm)
    return batch_norm(norm.num_features, eps=norm.eps, momentum=float(norm.momentum or 0.0),
                      affine=norm.affine, track_running_stats=norm.track_running_stats)


def _norm_check(norm: nn.Module, name: str) -> Callable[[Tensor], None]:
    dims = _NORM_DIMS[type(norm)]

    def check(x: Tensor) -> None:
        if x.dim() not in dims:
            raise ShapeError(f"from_module: batch norm {name!r} ({type(norm).__name__}) expects "
                             f"a {' or '.join(map(str, dims))}-D input, got {tuple(x.shape)}")
    return check


def _conv(conv: nn.Module) -> Model:
    assert isinstance(conv, nn.Conv1d | nn.Conv2d)
    make: Callable[..., Model] = conv1d if isinstance(conv, nn.Conv1d) else conv2d
    return make(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride,
                padding=conv.padding, dilation=conv.dilation, groups=conv.groups,
                bias=conv.bias is not None)


def _steps(ops: list[Op], own: dict[str, Tensor]) -> list[_Step] | str:
    """The steps running ``ops``, or why one of them cannot run exactly."""
    steps: list[_Step] = []
    i = 0
    while i < len(ops):
        op, after = ops[i], ops[i + 1] if i + 1 < len(ops) else None
        layer = op.layer
        if isinstance(layer, nn.Conv1d | nn.Conv2d) and layer.padding_mode != "zeros":
            return f"convolution {op.name!r} has padding_mode={layer.padding_mode!r}"
        if isinstance(layer, nn.modules.batchnorm._BatchNorm):
            refusal = _norm_refusal(layer, op.name)
            if refusal is not None:
                return refusal
        norm = after.layer if after is not None else None
        if (type(layer) is nn.Conv2d and type(norm) is nn.BatchNorm2d and layer.groups == 1
                and not isinstance(layer.padding, str) and after is not None
                and _norm_refusal(norm, after.name) is None):
            assert isinstance(norm, nn.BatchNorm2d)
            fused = conv_batch_norm(
                layer.in_channels, layer.out_channels, cast(Pair, layer.kernel_size),
                stride=cast(Pair, layer.stride), padding=cast(Pair, layer.padding),
                dilation=cast(Pair, layer.dilation), bias=layer.bias is not None,
                eps=norm.eps, momentum=float(norm.momentum or 0.0), affine=norm.affine,
                track_running_stats=norm.track_running_stats)
            names = {**_local("conv.", layer, op.name), **_local("norm.", norm, after.name)}
            how = ("conv_batch_norm (batch statistics from the patches)" if fused.meta["fused"]
                   else "conv_batch_norm")
            steps.append(_Step((op, after), _named(fused, names, own), how))
            i += 2
        elif isinstance(layer, nn.Conv1d | nn.Conv2d):
            steps.append(_Step((op,), _named(_conv(layer), _local("", layer, op.name), own),
                               type(layer).__name__.lower()))
            i += 1
        elif isinstance(layer, nn.modules.batchnorm._BatchNorm):
            steps.append(_Step((op,), _named(_norm(layer), _local("", layer, op.name), own,
                                             _norm_check(layer, op.name)), "batch_norm"))
            i += 1
        elif isinstance(layer, nn.Linear):
            model = linear(layer.in_features, layer.out_features, bias=layer.bias is not None)
            steps.append(_Step((op,), _named(model, _local("", layer, op.name), own), "linear"))
            i += 1
        elif op.role == "relu" and after is not None and after.role == "max_pool2d":
            steps.append(_Step((op, after), _relu_after(after), "ReLU after max-pool"))
            i += 2
        else:
            steps.append(_Step((op,), _pure(op), ""))
            i += 1
    return steps


def _relu_after(pool: Op) -> Run:
    def run(params: Params, state: State, x: Any, train: bool) -> tuple[Any, State]:
        return torch.relu(pool(x, train)), {}
    return run


def _pure(op: Op) -> Run:
    def run(params: Params, state: State, x: Any, train: bool) -> tuple[Any, State]:
        return op(x, train), {}
    return run


def _described(steps: list[_Step]) -> tuple[str, ...]:
    """One line per chain (a run of steps from one convolution or linear layer to the next):
    its ops and how they run."""
    chains: list[list[_Step]] = []
    for step in steps:
        starts = isinstance(step.ops[0].layer, nn.Conv1d | nn.Conv2d | nn.Linear)
        if starts or not chains:
            chains.append([])
        chains[-1].append(step)
    lines = []
    for chain in chains:
        ops = " > ".join(op.label for step in chain for op in step.ops)
        hows = ", ".join(step.how for step in chain if step.how)
        lines.append(f"{ops}: {hows}" if hows else ops)
    return tuple(lines)


def _program(module: nn.Module) -> tuple[Callable[..., tuple[Any, State]], tuple[str, ...]] | str:
    """The rewritten apply of ``module`` and its description, or why it keeps the exact path."""
    ops = read_chain(module)
    if isinstance(ops, str):
        return ops
    own = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    steps = _steps(ops, own)
    if isinstance(steps, str):
        return steps
    if not any(isinstance(op.layer, nn.Conv1d | nn.Conv2d | nn.modules.batchnorm._BatchNorm)
               for step in steps for op in step.ops):
        return "no convolution or batch norm in its chain: nothing to rewrite"
    layout = any(type(op.layer) is nn.Conv2d for step in steps for op in step.ops)

    def apply(params: Params, state: State, x: Any, *, key: Key | None = None,
              train: bool = False) -> tuple[Any, State]:
        relaid = layout and isinstance(x, Tensor) and x.dim() == 4 and not in_transform()
        if relaid:
            x = channels_last(x)
        new_state = dict(state)
        for step in steps:
            x, updates = step.run(params, new_state, x, train)
            new_state.update(updates)
        if relaid and isinstance(x, Tensor) and x.dim() == 4:
            x = x.contiguous()
        return x, new_state

    lines = _described(steps)
    return apply, (*lines, "input: channels-last outside transforms") if layout else lines


def from_module(
    module: nn.Module, name: str | None = None, *, init: str = "reset", fuse: bool = True
) -> Model:
    """A pure Model of ``module``, with its CNN chains on funcgraph's fused layers.

    Arguments:
        module: the ``nn.Module``, as :func:`funcgraph.model.from_module` takes it.
        name: the Model's name (default: the module's class name).
        init: ``"reset"`` draws the params from the key as the module's
            ``reset_parameters()`` would, ``"copy"`` keeps its values; buffers become the
            state.
        fuse: rewrite a chain of convolutions, batch norms, activations, pooling and linear
            layers onto funcgraph's layers (see the module docstring); ``False`` runs the
            module's own forward through ``functional_call`` whatever it is.

    Returns:
        A Model whose params and state are named as ``module.state_dict()``, equal to the
        module's forward in both modes (running statistics returned as new state, the
        module's tensors never touched). ``meta["rewritten"]`` lists the chains that run on
        funcgraph's layers (empty when none), ``meta["not_rewritten"]`` why not (``None``
        when rewritten).

    Example::

        net = torch.nn.Sequential(torch.nn.Conv2d(1, 32, 3, padding=1),
                                  torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
                                  torch.nn.MaxPool2d(2), torch.nn.Flatten(),
                                  torch.nn.Linear(32 * 14 * 14, 5))
        model = funcgraph.from_module(net)
        model.meta["rewritten"][0]   # '0 (Conv2d) > 1 (BatchNorm2d) > 2 (ReLU) > ...'
    """
    converted = exact.from_module(module, name, init=init)
    check_bool("from_module", "fuse", fuse)
    program = _program(module) if fuse else "fuse=False"
    if isinstance(program, str):
        return Model(converted.init, converted.apply, converted.name,
                     {**converted.meta, "rewritten": (), "not_rewritten": program})
    apply, lines = program
    return Model(converted.init, apply, converted.name,
                 {**converted.meta, "rewritten": lines, "not_rewritten": None})


__all__ = ["from_module"]
