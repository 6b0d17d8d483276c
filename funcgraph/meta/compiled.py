"""The meta-gradient compiled whole with ``torch.compile``.

A pure meta-gradient is what makes this possible: the per-task gradient (the inner loop and,
for second order, its double backward, all ``torch.func`` transforms inside one function) and
the ``vmap`` over tasks trace into one forward graph, with no autograd double backward through
a compiled region, which torch does not support and which clone-and-adapt libraries would
need. ``strategy="loop"`` compiles one task's gradient and loops over it; ``"vmap"`` compiles
the vmapped mean over the whole batch. (``"threads"`` is not compiled: Dynamo's compilation is
not made to run from several threads at once.)

The first call compiles (tens of seconds for a conv4 on a CPU; torch keeps the compiled code
in its cache, ``TORCHINDUCTOR_CACHE_DIR``, which :func:`use_compile_cache` points at a
directory that lasts across runs), later calls with the same shapes reuse it. A function
Dynamo cannot trace whole (a graph break, an unsupported op) is not compiled at all: one
:class:`CompileFallback` warning names the op and where, and the eager meta-gradient runs, so
a compiled step is never a silently slow one.
"""

from __future__ import annotations

import os
import types
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..params import Params
from .learner import Task, TaskGradFn

MeanGrads = Callable[[Params, Task], tuple[Params, Tensor, Tensor]]


class CompileFallback(UserWarning):
    """``torch.compile`` could not compile a meta-gradient whole; the eager one runs."""


_COMPILED: dict[tuple[Any, ...], Any] = {}
_FAILED: dict[tuple[Any, ...], str] = {}
KEEP = 8
"""Compiled meta-gradients kept per process (the newest; a settings study builds a learner
per trial)."""


def use_compile_cache(folder: str | Path | None = None) -> Path:
    """Point torch's compile cache at ``folder`` (default: ``$TORCHINDUCTOR_CACHE_DIR`` if
    set, else ``$XDG_CACHE_HOME/funcgraph/torch-compile`` or ``~/.cache/...``), so a second
    run of the same meta-step loads its compiled code instead of compiling again."""
    if folder is None:
        if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
            return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        folder = Path(base) / "funcgraph" / "torch-compile"
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    return path


def compiled_mean_grads(task_grad: TaskGradFn, strategy: str, *, key: tuple[Any, ...],
                        chunk_size: int | None = None, backend: str = "inductor"
                        ) -> MeanGrads | None:
    """The compiled mean meta-gradient ``(meta_params, tasks) -> (grads, loss, metric)`` for
    ``strategy`` (``"loop"`` or ``"vmap"``), made once per ``key`` (the caller's function,
    precision and strategy); ``None`` where it failed to compile before. ``backend`` is
    ``torch.compile``'s (``"inductor"`` generates kernels; ``"aot_eager"`` traces the same
    graph and runs it with torch's kernels, in seconds: what tests compare)."""
    whole = (*key, strategy, chunk_size, backend)
    if whole in _FAILED:
        return None
    if whole not in _COMPILED:
        while len(_COMPILED) >= KEEP:
            _COMPILED.pop(next(iter(_COMPILED)))
        _COMPILED[whole] = _make(task_grad, strategy, chunk_size, backend)
    fn: MeanGrads = _COMPILED[whole]
    return _guarded(fn, whole)


def _fresh(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with a code object of its own. Dynamo keeps its compiled graphs per code
    object, up to ``recompile_limit`` (8) of them: the same inner function compiled for a
    ninth learner in one process (a settings study's ninth trial) would hit the limit."""
    _fresh.count += 1  # type: ignore[attr-defined]
    name = f"{fn.__name__}_{_fresh.count}"  # type: ignore[attr-defined]
    code = fn.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


_fresh.count = 0  # type: ignore[attr-defined]


def _make(task_grad: TaskGradFn, strategy: str, chunk_size: int | None,
          backend: str) -> MeanGrads:
    if strategy == "vmap":
        def mean_vmapped(meta_params: Params, tasks: Task) -> tuple[Params, Tensor, Tensor]:
            grads, loss, metric = torch.func.vmap(task_grad, in_dims=(None, 0),
                                                  chunk_size=chunk_size)(meta_params, tasks)
            return {n: g.mean(0) for n, g in grads.items()}, loss.mean(), metric.mean()

        return torch.compile(_fresh(mean_vmapped), fullgraph=True, dynamic=False,
                             backend=backend)

    def one(meta_params: Params, task: Task) -> tuple[Params, Tensor, Tensor]:
        return task_grad(meta_params, task)

    one_task = torch.compile(_fresh(one), fullgraph=True, dynamic=False, backend=backend)

    def mean_looped(meta_params: Params, tasks: Task) -> tuple[Params, Tensor, Tensor]:
        total: Params = {}
        losses, metrics = [], []
        for t in range(tasks.num_tasks):
            grads, loss, metric = one_task(meta_params, tasks.pick(t))
            total = grads if t == 0 else {n: total[n] + g for n, g in grads.items()}
            losses.append(loss)
            metrics.append(metric)
        num = tasks.num_tasks
        return ({n: g / num for n, g in total.items()}, torch.stack(losses).mean(),
                torch.stack(metrics).mean())

    return mean_looped


def _guarded(fn: MeanGrads, whole: tuple[Any, ...]) -> MeanGrads:
    """``fn``, turning a compile failure into one :class:`CompileFallback` and ``None``
    results for the caller to run eagerly (raised as :class:`_NotCompiled`)."""

    def run(meta_params: Params, tasks: Task) -> tuple[Params, Tensor, Tensor]:
        try:
            return fn(meta_params, tasks)
        except Exception as e:
            reason = compile_failure(e)
            if reason is None:
                raise
            _FAILED[whole] = reason
            _COMPILED.pop(whole, None)
            warnings.warn(f"the meta-step did not compile ({reason}); it runs eagerly",
                          CompileFallback, stacklevel=3)
            raise NotCompiled(reason) from None

    return run


class NotCompiled(Exception):
    """Raised by a compiled meta-gradient that failed to compile: the caller runs eagerly."""


def compile_failure(error: BaseException) -> str | None:
    """One line for an error ``torch.compile`` raised while compiling (the op and where, from
    Dynamo's own message), or ``None`` for an error of the computation itself."""
    import torch._dynamo.exc as dynamo

    kinds = tuple(k for k in (getattr(dynamo, n, None) for n in (
        "TorchDynamoException", "FailOnRecompileLimitHit")) if isinstance(k, type))
    if not isinstance(error, kinds):
        return None
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    head = lines[0] if lines else type(error).__name__
    where = next((line for line in lines if line.startswith(("File ", "from user code"))),
                 None)
    user = next((line for line in reversed(lines) if line.startswith("File ")), where)
    text = f"{type(error).__name__}: {head}" + (f"; at {user}" if user else "")
    return text[:400]


__all__ = ["CompileFallback", "NotCompiled", "compile_failure", "compiled_mean_grads",
           "use_compile_cache"]
