"""The one Model record, binding state away, and conversion from ``nn.Module``.

A :class:`Model` is a pair of pure functions::

    params, state = model.init(key)
    y, new_state = model.apply(params, state, x, key=None, train=False)

``params`` and ``state`` are flat dotted dicts named like ``nn.Module.state_dict()``; ``state``
holds non-trained tensors (batch-norm running statistics) and is returned, never mutated.
Hyperparameters are Python values closed over by the constructor; only tensors flow through
the arguments, so ``torch.func.grad``/``vmap``/``functional_call`` compose freely.
"""

from __future__ import annotations

import contextvars
import copy
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from .control import in_transform, is_batched
from .errors import ArgumentTypeError, ConfigError, ShapeError
from .params import Params, State
from .random import Key, check_key


class InitFn(Protocol):
    def __call__(self, key: Key) -> tuple[Params, State]: ...


class ApplyFn(Protocol):
    def __call__(
        self, params: Params, state: State, x: Any, *, key: Key | None = None, train: bool = False
    ) -> tuple[Any, State]: ...


class _KeyCheckedInit:
    """A Model's ``init`` that checks its key first, so a wrong key is a
    :class:`~funcgraph.errors.KeyTypeError` naming ``Model.init`` (what the user called), not
    a random function deep inside. Compares and hashes as the function it wraps."""

    __slots__ = ("fn", "model_name")

    def __init__(self, fn: InitFn, model_name: str) -> None:
        self.fn = fn
        self.model_name = model_name

    def __call__(self, key: Key) -> tuple[Params, State]:
        return self.fn(check_key(f"Model.init of {self.model_name!r}", key, batch=False))

    def __eq__(self, other: object) -> bool:
        return self.fn == (other.fn if isinstance(other, _KeyCheckedInit) else other)

    def __hash__(self) -> int:
        return hash(self.fn)


@dataclass(frozen=True)
class Model:
    """A model as two pure functions; see the module docstring for the contract.

    Attributes:
        init: ``key -> (params, state)``; the key (one ``(2,)`` key) is checked first.
        apply: ``(params, state, x, *, key=None, train=False) -> (y, state)``.
        name: a short human-readable name (used in graphs and error messages).
        meta: free-form hyperparameters for inspection (never read by ``apply``).
    """

    init: InitFn
    apply: ApplyFn
    name: str = "model"
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.init, _KeyCheckedInit):
            object.__setattr__(self, "init", _KeyCheckedInit(self.init, self.name))

    def __call__(
        self, params: Params, state: State, x: Any, *, key: Key | None = None, train: bool = False
    ) -> tuple[Any, State]:
        return self.apply(params, state, x, key=key, train=train)


class BoundApply(Protocol):
    """``f(params, x) -> y``: a model with its state and mode bound away (what :func:`bind`
    returns and what the meta-learners take).

    The protocol promises only ``f(params, x)``, so any plain function of ``(params, x)`` is
    one. The functions :func:`bind` makes also take ``key=`` (the randomness of dropout or
    stochastic depth for that call); callers that have a key pass it only to functions that
    accept one (see :func:`funcgraph.meta.learner.call`).
    """

    def __call__(self, params: Params, x: Any, /) -> Any: ...


def bind(
    model: Model, state: State, *, train: bool = False, key: Key | None = None
) -> BoundApply:
    """A plain ``f(params, x, *, key=None) -> y`` with ``state`` and ``train`` fixed.

    A ``key`` given at call time is used, else the bound ``key``: bind the mode once and pass
    a fresh key per call (what meta-learners do per task and inner step). The state the model
    returns is dropped, which is what meta-learning with batch statistics (transductive batch
    norm) and evaluation want. Use ``model.apply`` to keep it.
    """
    bound = key

    def f(params: Params, x: Any, *, key: Key | None = None) -> Any:
        y, _ = model.apply(params, state, x, key=bound if key is None else key, train=train)
        return y

    # What a meta-learner checks: a model with running statistics bound for evaluation would
    # adapt with those statistics instead of each task's own (funcgraph.meta.check_apply).
    f.funcgraph_bound = BoundInfo(model.name, train,  # type: ignore[attr-defined]
                                  any(n.endswith("running_mean") for n in state))
    return f


@dataclass(frozen=True)
class BoundInfo:
    """What :func:`bind` fixed, kept on the bound function as ``funcgraph_bound``."""

    model: str
    train: bool
    running_stats: bool


def stateless(
    name: str,
    init: Callable[[Key], Params],
    fn: Callable[[Params, Any], Any],
    **meta: Any,
) -> Model:
    """A Model from a params-only init and a deterministic ``fn(params, x)``."""

    def init_(key: Key) -> tuple[Params, State]:
        return init(key), {}

    def apply(
        params: Params, state: State, x: Any, *, key: Key | None = None, train: bool = False
    ) -> tuple[Any, State]:
        return fn(params, x), state

    return Model(init_, apply, name, dict(meta))


_BATCH_NORM = nn.modules.batchnorm._BatchNorm
"""``BatchNorm1d/2d/3d``, their lazy forms and ``SyncBatchNorm``: the modules whose
``F.batch_norm`` calls :func:`from_module` makes transform-safe."""


class _TransformSafeBatchNorm(TorchFunctionMode):
    """Runs the ``F.batch_norm`` calls of one module call exactly under ``torch.func``.

    The module's own ``forward`` still decides everything (training or running statistics,
    the momentum, ``num_batches_tracked``); only the kernel changes. Outside transforms the
    native kernel runs, updating the cloned state in place. Inside them, batch statistics
    are computed with ``mean``/``var``: torch's native kernel gives wrong second-order
    gradients under ``vmap`` (see ``funcgraph.nn.norm``) and refuses running statistics that
    are not batched like the input. The new running statistics are then returned out of
    place in :attr:`updates`, under their state names, so under ``vmap`` they are per member.
    """

    def __init__(self, names: dict[int, str]) -> None:
        super().__init__()
        self.names = names
        self.updates: State = {}

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        if func is F.batch_norm:
            return self.batch_norm(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))

    def batch_norm(
        self, x: Tensor, running_mean: Tensor | None, running_var: Tensor | None,
        weight: Tensor | None = None, bias: Tensor | None = None, training: bool = False,
        momentum: float = 0.1, eps: float = 1e-5,
    ) -> Tensor:
        if training and x.numel() // x.shape[1] < 2:
            raise ShapeError(f"from_module: batch norm in training needs more than one value "
                             f"per channel, got input {tuple(x.shape)}; use a larger batch "
                             "or train=False")
        if not training or not in_transform():
            return F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum,
                                eps)
        dims = [0, *range(2, x.dim())]
        shape = [1, x.shape[1]] + [1] * (x.dim() - 2)  # broadcast per channel
        mean = x.mean(dim=dims)
        centred = x - mean.reshape(shape)
        var = centred.square().mean(dim=dims)
        y = centred * torch.rsqrt(var.reshape(shape) + eps)
        if weight is not None:
            y = y * weight.reshape(shape)
        if bias is not None:
            y = y + bias.reshape(shape)
        count = x.numel() // x.shape[1]
        for stat, value in ((running_mean, mean), (running_var, var * count / (count - 1))):
            name = None if stat is None else self.names.get(id(stat))
            if stat is not None and name is not None:  # a later call of a shared norm
                previous = self.updates.get(name, stat)  # continues from the earlier one
                self.updates[name] = (1 - momentum) * previous + momentum * value.detach()
        return y


_ROUTE: contextvars.ContextVar[_TransformSafeBatchNorm | None] = contextvars.ContextVar(
    "funcgraph_batch_norm_route", default=None)
"""The kernel router of the :func:`from_module` call running in this thread, if any."""


class _TracedRoute:
    """The kernel router of the :func:`from_module` call that ``torch.compile`` is tracing.

    Dynamo traces neither a ``ContextVar`` nor ``threading``; it traces a plain attribute and
    a ``TorchFunctionMode`` entered inside the traced function, and it traces in one thread.
    The compiled code holds no Python: the attribute is only read while tracing."""

    router: _TransformSafeBatchNorm | None = None


def _current_route() -> _TransformSafeBatchNorm | None:
    if torch.compiler.is_compiling():
        return _TracedRoute.router
    return _ROUTE.get()


def _with_routed_batch_norm(module: nn.Module) -> nn.Module:
    """``module`` (a private copy) with each batch norm's forward run under the router of the
    current call: the mode is active only inside the norms, so the rest of the forward keeps
    torch's dispatch (a mode over the whole call would send every op through Python)."""
    for m in module.modules():
        if isinstance(m, _BATCH_NORM):
            m.forward = _routed(m.forward)  # type: ignore[method-assign]
    return module


def _routed(forward: Callable[..., Tensor]) -> Callable[..., Tensor]:
    def run(*args: Any, **kwargs: Any) -> Tensor:
        router = _current_route()
        if router is None:
            return forward(*args, **kwargs)
        with router:
            return forward(*args, **kwargs)

    return run


def _seed(key: Key) -> int:
    """The 64-bit seed of torch's generator for ``key``: its two words, so distinct keys give
    distinct seeds and ``key(s)`` gives seed ``s``."""
    if is_batched(key):
        raise ConfigError(
            "Model.init of a from_module model: cannot run under vmap over keys (it calls the "
            "module's reset_parameters, which draw from torch's generator); init each key in "
            "a Python loop and stack the params with funcgraph.params.stack")
    return (int(key[0]) << 32) | int(key[1])


def _reset_order(module: nn.Module) -> list[nn.Module]:
    """Every submodule once, children before their parent (the order constructors run in, so
    a parent's reset that overrides its children's, as ``nn.MultiheadAttention``'s, wins)."""
    order: list[nn.Module] = []
    seen: set[int] = set()

    def visit(m: nn.Module) -> None:
        if id(m) in seen:
            return
        seen.add(id(m))
        for child in m.children():
            visit(child)
        order.append(m)

    visit(module)
    return order


def _reset(module: nn.Module, seed: int) -> nn.Module:
    """A CPU copy of ``module`` with every ``reset_parameters()`` run from ``seed``.

    torch's own modules whose reset is private (``nn.MultiheadAttention``, ``nn.Transformer``)
    run ``_reset_parameters()``. The copy lives on the CPU, so a key gives the same values on
    every device; torch's CPU generator is seeded inside ``fork_rng``, which restores it.
    """
    fresh = copy.deepcopy(module).cpu()
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.random.default_generator.manual_seed(seed)
        for m in _reset_order(fresh):
            reset = getattr(m, "reset_parameters", None)
            if reset is None and type(m).__module__.startswith("torch.nn."):
                reset = getattr(m, "_reset_parameters", None)
            if callable(reset):
                reset()
    return fresh


INIT_MODES = ("reset", "copy")
"""How a :func:`from_module` model initialises: from the key, or the module's values."""


def from_module(module: nn.Module, name: str | None = None, *, init: str = "reset") -> Model:
    """A pure Model running ``module`` through ``torch.func.functional_call``.

    This is the exact path for every module. ``funcgraph.from_module``
    (:func:`funcgraph.nn.torch_module.from_module`, one floor up, since it builds on
    ``funcgraph.nn``'s layers) is this with a module's CNN chains rewritten onto funcgraph's
    fused layers; ``fuse=False`` there gives this.

    Arguments:
        module: any ``torch.nn.Module`` whose forward takes one input.
        name: the Model's name (default: the module's class name).
        init: ``"reset"`` (default): ``model.init(key)`` gives the params the module's own
            ``reset_parameters()`` would, drawn from the key: the same key gives the same
            params, different keys different ones, and ``init(funcgraph.random.key(s))``
            equals the module built after ``torch.manual_seed(s)`` (for modules whose
            constructor only resets its layers). ``"copy"``: the module's current values
            for every key (pretrained weights).

    **Init.** Submodules are reset children first, on a CPU copy, with torch's generator
    seeded from the key inside ``torch.random.fork_rng`` (the global generator is left as it
    was). Parameters that no ``reset_parameters`` covers (a raw ``nn.Parameter`` on your own
    module) keep the module's current values, the same for every key: give that module a
    ``reset_parameters`` to have them drawn. Tied weights appear once, under their first
    name, and stay tied. Buffers (running statistics) become the state.

    **Apply.** Never mutates the module's tensors or the passed state: buffers are cloned
    before the call and the clones, updated, are returned as new state. The module's
    ``train()``/``eval()`` mode is set for the call and restored afterwards; calls from other
    threads (the ``"threads"`` meta-learning strategy) run on their own copy of the module.
    The ``key`` is ignored: modules draw from torch's global generator (e.g. ``nn.Dropout``).

    **Batch norm.** ``BatchNorm1d/2d/3d`` (running statistics included) work under every
    ``torch.func`` transform, so the module meta-trains with ``vmap`` over tasks: inside a
    transform, training-mode batch norm runs as funcgraph's mean/var form, whose second-order
    gradients are exact (torch's native kernel's are not under ``vmap``), and the running
    statistics come back as new state (per task under ``vmap``). Outside transforms the
    native kernel runs. Evaluation with running statistics is the native kernel everywhere.
    """
    if not isinstance(module, nn.Module):
        raise ArgumentTypeError(
            f"from_module: module must be a torch.nn.Module, got {type(module).__name__}")
    if init not in INIT_MODES:
        raise ConfigError(f"from_module: init must be one of {INIT_MODES}, got {init!r}")
    has_batch_norm = any(isinstance(m, _BATCH_NORM) for m in module.modules())
    owner = threading.get_ident()
    copies = threading.local()
    # The copy a compiled call traces (made now: Dynamo traces no deepcopy of a module).
    traced = _with_routed_batch_norm(copy.deepcopy(module)) if has_batch_norm else module

    def this_threads_module() -> nn.Module:
        """The module a call runs: the user's own in the thread that converted it, a private
        copy in any other; with batch norm, always a copy whose norms route their kernel.
        Under ``torch.compile`` (which traces in one thread, and no thread identity) the one
        made for tracing."""
        if torch.compiler.is_compiling():
            return traced
        if threading.get_ident() == owner and not has_batch_norm:
            return module
        if not hasattr(copies, "module"):
            copies.module = _with_routed_batch_norm(copy.deepcopy(module))
        return cast(nn.Module, copies.module)

    def init_(key: Key) -> tuple[Params, State]:
        source = module
        if init == "reset":
            source = _reset(module, _seed(key))
        devices = {n: t.device for n, t in (*module.named_parameters(),
                                            *module.named_buffers())}
        params = {n: p.detach().clone().to(devices[n]) for n, p in source.named_parameters()}
        state = {n: b.detach().clone().to(devices[n]) for n, b in source.named_buffers()}
        return params, state

    def apply(
        params: Params, state: State, x: Any, *, key: Key | None = None, train: bool = False
    ) -> tuple[Any, State]:
        new_state = {n: t.clone() for n, t in state.items()}
        m = this_threads_module()
        was_training = m.training
        m.train(train)
        norms = _TransformSafeBatchNorm({id(t): n for n, t in new_state.items()})
        if torch.compiler.is_compiling():
            _TracedRoute.router = norms if has_batch_norm else None
            try:
                y = torch.func.functional_call(m, (params, new_state), (x,), tie_weights=True)
            finally:
                _TracedRoute.router = None
                m.train(was_training)
            return y, {**new_state, **norms.updates}
        routing = _ROUTE.set(norms if has_batch_norm else None)
        try:
            y = torch.func.functional_call(m, (params, new_state), (x,), tie_weights=True)
        finally:
            _ROUTE.reset(routing)
            m.train(was_training)
        return y, {**new_state, **norms.updates}

    return Model(init_, apply, name or type(module).__name__, {"module": type(module).__name__})

__all__ = ["ApplyFn", "BoundApply", "InitFn", "Model", "bind", "from_module", "stateless"]
