"""Devices: resolve ``--device`` strings, set the CPU threads (:func:`cpu_threads`), and place
a model's params over several devices.

``resolve_device("auto")`` picks CUDA if available, then MPS, else CPU; every other spelling
(``cpu``, ``cuda``, ``cuda:N``, ``mps``) is checked against what torch sees, and a bad or absent
device is a :class:`DeviceError`.

A placement plan maps parameter prefixes to devices, ``"stem=cuda:0,layer1=cuda:0,
layer2=cuda:1,*=cuda:1"`` (``*`` places every name no prefix matches; the longest matching
prefix wins). :func:`place` moves params and state per the plan; :func:`placed` runs a
``f(params, x)`` so that activations follow the params: a torch function mode moves an op's
tensors to one device whenever they sit on several, preferring the device of the parameters
the op reads, else that of its newest activation input. The moves are ordinary differentiable
``Tensor.to`` calls, so ``torch.func.grad`` returns each gradient on its parameter's device.
``micro_batches=m`` splits the batch into ``m`` chunks run one after another: on CUDA, kernel
launches are asynchronous, so stage 1 of chunk ``i+1`` overlaps stage 2 of chunk ``i``
(a GPipe-style fill/drain schedule); outputs are concatenated along dim 0.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.utils.weak import WeakIdKeyDictionary

from .checks import check_int
from .errors import ConfigError, DeviceError
from .model import Model
from .params import Params

_DEVICE = re.compile(r"^(auto|cpu|mps|cuda)(?::(\d+))?$")
EXPECTED = "auto, cpu, cuda, cuda:N or mps"


@contextlib.contextmanager
def cpu_threads(threads: int) -> Iterator[None]:
    """Run the block with ``threads`` intra-op CPU threads (``torch.set_num_threads``; 0 keeps
    the current count), restoring the count after it.

    The count decides the CPU strategies' cost: ``strategy="threads"`` starts that many worker
    threads (one intra-op thread each), ``"loop"`` and ``"vmap"`` give every op that many
    threads. Timings swing with it when other processes share the cores (the meta-learning
    guide's "Threads" section), so set it explicitly where results are compared: one thread per
    process when several run side by side (the commands' ``--threads 1``), the core count for
    one job alone.
    """
    check_int("cpu_threads", "threads", threads, minimum=0)
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def resolve_device(spec: str | torch.device = "auto") -> torch.device:
    """The ``torch.device`` for ``spec``, checked against the devices torch sees.

    ``auto`` -> ``cuda`` if available, then ``mps``, else ``cpu``. Raises :class:`DeviceError`
    for a malformed string or an absent device.
    """
    text = str(spec).strip().lower()
    match = _DEVICE.match(text)
    if match is None or (match.group(2) is not None and match.group(1) != "cuda"):
        raise DeviceError(f"device: expected {EXPECTED}, got {str(spec)!r}")
    kind, index = match.group(1), match.group(2)
    if kind == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if kind == "cpu":
        return torch.device("cpu")
    if kind == "mps":
        if not torch.backends.mps.is_available():
            raise DeviceError("device: mps requested but torch.backends.mps.is_available() is "
                              "False on this machine")
        return torch.device("mps")
    if not torch.cuda.is_available():
        raise DeviceError(f"device: {text} requested but CUDA is not available "
                          f"(torch {torch.__version__}); use cpu or auto")
    n = int(index) if index is not None else torch.cuda.current_device()
    if n >= torch.cuda.device_count():
        raise DeviceError(f"device: {text} requested but only {torch.cuda.device_count()} CUDA "
                          f"device(s) exist (cuda:0..cuda:{torch.cuda.device_count() - 1})")
    return torch.device("cuda", n)


@dataclass(frozen=True)
class PlacementPlan:
    """Ordered ``(prefix, device)`` stages plus the device of unmatched names (``*``)."""

    stages: tuple[tuple[str, torch.device], ...]
    default: torch.device | None = None

    def device_of(self, name: str) -> torch.device:
        """The device of tensor ``name``: the longest matching prefix, else the default."""
        best: tuple[int, torch.device] | None = None
        for prefix, device in self.stages:
            if (name == prefix or name.startswith(prefix + ".")) and (
                best is None or len(prefix) > best[0]
            ):
                best = (len(prefix), device)
        if best is not None:
            return best[1]
        if self.default is None:
            raise DeviceError(f"placement: no plan entry matches {name!r}; add a prefix for it "
                              "or '*=DEVICE' for everything unmatched")
        return self.default

    def devices(self) -> list[torch.device]:
        """The distinct devices of the plan, in order."""
        found = [d for _, d in self.stages] + ([self.default] if self.default else [])
        return list(dict.fromkeys(found))


def parse_plan(text: str) -> PlacementPlan:
    """Parse ``"PREFIX=DEVICE,..."`` (``*=DEVICE`` for the rest); devices are resolved.

    Raises :class:`DeviceError` naming the bad entry (no ``=``, empty prefix, a prefix given
    twice, a bad or absent device).
    """
    stages: list[tuple[str, torch.device]] = []
    default: torch.device | None = None
    entries = [e.strip() for e in text.split(",") if e.strip()]
    if not entries:
        raise DeviceError(f"placement plan: expected PREFIX=DEVICE[,...], got {text!r}")
    for i, entry in enumerate(entries, start=1):
        prefix, eq, device = (s.strip() for s in entry.partition("="))
        if not eq or not prefix or not device:
            raise DeviceError(f"placement plan entry {i} {entry!r}: expected PREFIX=DEVICE")
        try:
            resolved = resolve_device(device)
        except DeviceError as e:
            raise DeviceError(f"placement plan entry {i} {entry!r}: {e}") from None
        if prefix == "*":
            default = resolved
        elif any(p == prefix for p, _ in stages):
            raise DeviceError(f"placement plan entry {i} {entry!r}: prefix {prefix!r} given twice")
        else:
            stages.append((prefix.rstrip("."), resolved))
    return PlacementPlan(tuple(stages), default)


def _as_plan(plan: PlacementPlan | str) -> PlacementPlan:
    return parse_plan(plan) if isinstance(plan, str) else plan


def check_plan(plan: PlacementPlan | str, names: list[str] | Mapping[str, Any]) -> PlacementPlan:
    """Validate ``plan`` against tensor names: every prefix must match a name and every name
    must get a device. Raises :class:`DeviceError` listing the top-level scopes that exist."""
    plan = _as_plan(plan)
    names = list(names)
    scopes = sorted({n.split(".")[0] for n in names})
    for prefix, _ in plan.stages:
        if not any(n == prefix or n.startswith(prefix + ".") for n in names):
            raise DeviceError(f"placement plan: prefix {prefix!r} matches no parameter; "
                              f"top-level scopes are {scopes}")
    for n in names:
        plan.device_of(n)
    return plan


def place(
    tensors: Mapping[str, Tensor], plan: PlacementPlan | str, *, partial: bool = False
) -> Params:
    """A new dict with every tensor moved to its device under ``plan`` (validated first).

    ``partial=True`` is for dicts holding only some of the model's names (its state): every
    name must still get a device, but a prefix need not match any of them.
    """
    plan = _as_plan(plan)
    if partial:
        for n in tensors:
            plan.device_of(n)
    else:
        check_plan(plan, tensors)
    return {n: t.to(plan.device_of(n)) for n, t in tensors.items()}


class _FollowParams(TorchFunctionMode):
    """Moves an op's tensors to one device when they sit on several (see module docstring)."""

    def __init__(self, params: Mapping[str, Tensor]) -> None:
        super().__init__()
        self.derived: WeakIdKeyDictionary = WeakIdKeyDictionary()  # param-derived tensors
        self.acts: WeakIdKeyDictionary = WeakIdKeyDictionary()  # activation -> birth order
        self.clock = 0
        for t in params.values():
            self.derived[t] = True

    def mark_input(self, t: Tensor) -> None:
        self.acts[t] = self.clock

    def _target(self, tensors: list[Tensor], inplace: bool) -> torch.device:
        if inplace:
            return tensors[0].device
        for t in tensors:
            if t in self.derived:
                return t.device
        acts = [(self.acts[t], i) for i, t in enumerate(tensors) if t in self.acts]
        if acts:
            return tensors[max(acts)[1]].device
        return tensors[0].device

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        leaves, spec = tree_flatten((args, kwargs))
        tensors = [x for x in leaves if isinstance(x, Tensor)]
        name = getattr(func, "__name__", "")
        if len({t.device for t in tensors}) > 1 and name not in ("to", "__get__", "__set__"):
            inplace = name.endswith("_") or name in ("__setitem__", "__iadd__", "__imul__")
            target = self._target(tensors, inplace)
            moved = [x.to(target) if isinstance(x, Tensor) and x.device != target else x
                     for x in leaves]
            for old, new in zip(leaves, moved, strict=True):
                if isinstance(old, Tensor) and new is not old:
                    if old in self.derived:
                        self.derived[new] = True
                    if old in self.acts:
                        self.acts[new] = self.acts[old]
            args, kwargs = tree_unflatten(moved, spec)
            tensors = [x for x in moved if isinstance(x, Tensor)]
        out = func(*args, **kwargs)
        is_act = any(t in self.acts for t in tensors)
        is_derived = bool(tensors) and all(t in self.derived for t in tensors)
        if is_act or is_derived:
            self.clock += 1
            for t in tree_flatten(out)[0]:
                if isinstance(t, Tensor):
                    if is_act:
                        self.acts[t] = self.clock
                    else:
                        self.derived[t] = True
        return out


def _split(x: Any, n: int) -> list[Any]:
    leaves, spec = tree_flatten(x)
    sizes = {t.shape[0] for t in leaves if isinstance(t, Tensor)}
    if len(sizes) != 1:
        raise ConfigError(f"micro_batches: inputs need one shared batch size, got {sorted(sizes)}")
    (batch,) = sizes
    if batch < n:
        raise ConfigError(f"micro_batches={n} exceeds the batch size {batch}")
    chunks = [t.tensor_split(n) if isinstance(t, Tensor) else [t] * n for t in leaves]
    return [tree_unflatten([c[i] for c in chunks], spec) for i in range(n)]


def _concat(outputs: list[Any]) -> Any:
    first_leaves, spec = tree_flatten(outputs[0])
    columns = [tree_flatten(o)[0] for o in outputs]
    joined = [
        torch.cat([col[i] for col in columns]) if isinstance(leaf, Tensor) and leaf.dim() else leaf
        for i, leaf in enumerate(first_leaves)
    ]
    return tree_unflatten(joined, spec)


def placed(
    fn: Callable[[Params, Any], Any], plan: PlacementPlan | str, *, micro_batches: int = 1
) -> Callable[[Params, Any], Any]:
    """``fn(params, x)`` with activations following params across the plan's devices.

    Arguments:
        fn: a function of (params, x), e.g. ``funcgraph.bind(model, state)``.
        plan: a :class:`PlacementPlan` or its string form; params passed to the returned
            function must already be placed (:func:`place`); they are checked against it.
        micro_batches: split ``x`` along dim 0 into this many chunks, run them in turn and
            concatenate the outputs. Only for models whose examples are independent:
            batch-norm in training or a ``cond`` on a batch-wide value sees one chunk.

    Example::

        params = place(params, "layer1=cuda:0,*=cuda:1")
        y = placed(bind(model, state), "layer1=cuda:0,*=cuda:1", micro_batches=4)(params, x)
    """
    plan = _as_plan(plan)
    if micro_batches < 1:
        raise ConfigError(f"micro_batches must be >= 1, got {micro_batches}")

    def run(params: Params, x: Any) -> Any:
        check_plan(plan, params)
        wrong = [n for n, t in params.items() if t.device != plan.device_of(n)]
        if wrong:
            raise DeviceError(f"placed: params {wrong[:4]} are not on their planned devices; "
                              "move them with place(params, plan) first")
        chunks = _split(x, micro_batches) if micro_batches > 1 else [x]
        outputs = []
        for chunk in chunks:
            mode = _FollowParams(params)
            for t in tree_flatten(chunk)[0]:
                if isinstance(t, Tensor):
                    mode.mark_input(t)
            with mode:
                outputs.append(fn(params, chunk))
        return outputs[0] if micro_batches == 1 else _concat(outputs)

    return run


def placed_model(model: Model, plan: PlacementPlan | str) -> Model:
    """``model`` with its ``apply`` run as :func:`placed` runs a function: activations follow
    the params across the plan's devices. Its ``init`` places params and state (state need not
    match every prefix), so a training loop built on the Model needs no other change; the
    optimiser's updates are elementwise and stay on each param's device."""
    plan = _as_plan(plan)

    def init(key: Any) -> tuple[Params, Params]:
        params, state = model.init(key)
        return place(params, plan), place(state, plan, partial=True)

    def apply(params: Params, state: Params, x: Any, *, key: Any = None,
              train: bool = False) -> tuple[Any, Params]:
        mode = _FollowParams({**params, **state})
        for t in tree_flatten(x)[0]:
            if isinstance(t, Tensor):
                mode.mark_input(t)
        with mode:
            return model.apply(params, state, x, key=key, train=train)

    return Model(init, apply, model.name, model.meta)


__all__ = [
    "EXPECTED",
    "PlacementPlan",
    "check_plan",
    "cpu_threads",
    "parse_plan",
    "place",
    "placed",
    "placed_model",
    "resolve_device",
]
