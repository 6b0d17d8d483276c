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

import contextlib
import contextvars
import os
import re
import time
import traceback
import types
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..params import Params
from .learner import RANDOMNESS, Task

MeanGrads = Callable[[Params, Task, Params], tuple[Params, Tensor, Tensor]]


class CompileFallback(UserWarning):
    """``torch.compile`` could not compile a meta-gradient whole; the eager one runs."""


_COMPILED: dict[tuple[Any, ...], Any] = {}
_FAILED: dict[tuple[Any, ...], str] = {}
MAX_COMPILED = 8
"""Compiled meta-gradients kept per process (the newest; a settings study builds a learner
per trial)."""


def use_compile_cache(folder: str | Path | None = None) -> Path:
    """Point torch's compile cache at ``folder`` (default: ``$TORCHINDUCTOR_CACHE_DIR`` if
    set, else ``$XDG_CACHE_HOME/funcgraph/torch-compile`` or ``~/.cache/...``), so a second
    run of the same meta-step loads its compiled code instead of compiling again."""
    if folder is None:
        chosen = _chosen_cache()
        if chosen is not None:
            return Path(chosen)
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        folder = Path(base) / "funcgraph" / "torch-compile"
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    return path


@dataclass
class CompileRecord:
    """What the compiled meta-gradient did in the calls made inside :func:`recording`.

    Attributes:
        compiled: whether the last meta-gradient asked to compile ran compiled (``None``:
            none was asked).
        reason: why the last one did not (:func:`compile_failure`'s line, or the schedule's).
        compiles: calls that compiled (each new function, strategy and shapes compiles once).
        seconds: the time those calls took, the compiling included.
        on_start: called with no argument when a call starts to compile.
        on_done: called with the seconds it took and ``None``, or the reason it did not
            compile, when that call returns.
    """

    compiled: bool | None = None
    reason: str | None = None
    compiles: int = 0
    seconds: float = 0.0
    on_start: Callable[[], object] | None = None
    on_done: Callable[[float, str | None], object] | None = None

    def ran(self, compiled: bool, reason: str | None = None) -> None:
        self.compiled, self.reason = compiled, None if compiled else reason


_RECORD: contextvars.ContextVar[CompileRecord | None] = contextvars.ContextVar(
    "funcgraph_compile_record", default=None)


@contextlib.contextmanager
def recording(record: CompileRecord) -> Iterator[CompileRecord]:
    """Inside the block, every compiled meta-gradient (:func:`compiled_mean_grads`, through
    ``mean_task_grads(..., compile=...)``) reports to ``record``."""
    token = _RECORD.set(record)
    try:
        yield record
    finally:
        _RECORD.reset(token)


def note(compiled: bool, reason: str | None = None) -> None:
    """Tell the current :class:`CompileRecord` (if any) how a meta-gradient ran."""
    record = _RECORD.get()
    if record is not None:
        record.ran(compiled, reason)


Backend = str | Callable[..., Any]
"""A ``torch.compile`` backend: a name (``"inductor"``, ``"aot_eager"``) or a callable one
(``torch._dynamo.testing.CompileCounterWithBackend("aot_eager")`` counts the graphs)."""


def _chosen_cache() -> str | None:
    """``$TORCHINDUCTOR_CACHE_DIR`` when someone chose it: torch writes its own default
    (``/tmp/torchinductor_$USER``) into the variable the first time it looks, which is no
    choice and would hide the folder that lasts."""
    value = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not value:
        return None
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:  # pragma: no cover - a torch without it: take the variable as set
        return value
    return None if os.path.abspath(value) == os.path.abspath(default_cache_dir()) else value


def compiled_mean_grads(task_grad: Callable[..., Any], strategy: str, *,
                        key: tuple[Any, ...], chunk_size: int | None = None,
                        backend: Backend = "inductor", inputs: bool = False
                        ) -> MeanGrads | None:
    """The compiled mean meta-gradient ``(meta_params, tasks, inputs) -> (grads, loss,
    metric)`` for ``strategy`` (``"loop"`` or ``"vmap"``), made once per ``key`` (the caller's
    function, precision and strategy); ``None`` where it failed to compile before.
    ``backend`` is ``torch.compile``'s (``"inductor"`` generates kernels; ``"aot_eager"``
    traces the same graph and runs it with torch's kernels, in seconds: what tests compare).
    With ``inputs``, ``task_grad`` is ``(meta_params, task, inputs) -> ...``, the tensors of
    a :class:`~funcgraph.meta.learner.StepInputs` (its ``fn``), passed to every task alike;
    without, ``inputs`` is ignored."""
    cache_key = (*key, strategy, chunk_size, backend, inputs)
    if cache_key in _FAILED:
        note(False, _FAILED[cache_key])
        return None
    fresh = cache_key not in _COMPILED
    if fresh:
        while len(_COMPILED) >= MAX_COMPILED:
            _COMPILED.pop(next(iter(_COMPILED)))
        _COMPILED[cache_key] = _make(task_grad, strategy, chunk_size, backend, inputs)
    fn: MeanGrads = _COMPILED[cache_key]
    return _guarded(fn, cache_key, fresh)


def _fresh(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with a code object of its own. Dynamo keeps its compiled graphs per code
    object, up to ``recompile_limit`` (8) of them: the same inner function compiled for a
    ninth learner in one process (a settings study's ninth trial) would hit the limit."""
    _fresh.count += 1  # type: ignore[attr-defined]
    name = f"{fn.__name__}_{_fresh.count}"  # type: ignore[attr-defined]
    code = fn.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


_fresh.count = 0  # type: ignore[attr-defined]


def _make(task_grad: Callable[..., Any], strategy: str, chunk_size: int | None,
          backend: Backend, inputs: bool) -> MeanGrads:
    def per_task(meta_params: Params, task: Task, values: Params
                 ) -> tuple[Params, Tensor, Tensor]:
        return task_grad(meta_params, task, values) if inputs else task_grad(meta_params, task)

    if strategy == "vmap":
        def mean_vmapped(meta_params: Params, tasks: Task, values: Params
                         ) -> tuple[Params, Tensor, Tensor]:
            grads, loss, metric = torch.func.vmap(
                per_task, in_dims=(None, 0, None), chunk_size=chunk_size,
                randomness=RANDOMNESS)(meta_params, tasks, values)
            return {n: g.mean(0) for n, g in grads.items()}, loss.mean(), metric.mean()

        return torch.compile(_fresh(mean_vmapped), fullgraph=True, dynamic=False,
                             backend=backend)

    one_task = torch.compile(_fresh(per_task), fullgraph=True, dynamic=False, backend=backend)

    def mean_looped(meta_params: Params, tasks: Task, values: Params
                    ) -> tuple[Params, Tensor, Tensor]:
        return looped_mean(one_task(meta_params, tasks.pick(t), values)
                           for t in range(tasks.num_tasks))

    return mean_looped


def looped_mean(results: Iterable[tuple[Params, Tensor, Tensor]]
                ) -> tuple[Params, Tensor, Tensor]:
    """The mean of per-task ``(grads, loss, metric)`` that come one task at a time (the
    loop's, compiled or not): the gradients summed as they come, one running total rather
    than a stack of every task's, then divided by the number of tasks; the losses and
    metrics stacked and averaged."""
    total: Params = {}
    losses: list[Tensor] = []
    metrics: list[Tensor] = []
    for t, (grads, loss, metric) in enumerate(results):
        total = grads if t == 0 else {n: total[n] + g for n, g in grads.items()}
        losses.append(loss)
        metrics.append(metric)
    num = len(losses)
    return ({n: g / num for n, g in total.items()}, torch.stack(losses).mean(),
            torch.stack(metrics).mean())


def _guarded(fn: MeanGrads, cache_key: tuple[Any, ...], fresh: bool) -> MeanGrads:
    """``fn``, turning a compile failure into one :class:`CompileFallback` and ``None``
    results for the caller to run eagerly (raised as :class:`NotCompiled`); a ``fresh``
    function (its first call compiles) tells the current :class:`CompileRecord` when it
    starts and how long it took."""

    def run(meta_params: Params, tasks: Task, values: Params) -> tuple[Params, Tensor, Tensor]:
        record = _RECORD.get() if fresh else None
        if record is not None and record.on_start is not None:
            record.on_start()
        started = time.perf_counter()
        try:
            out = fn(meta_params, tasks, values)
        except Exception as e:
            reason = compile_failure(e)
            if reason is None:
                raise
            _FAILED[cache_key] = reason
            _COMPILED.pop(cache_key, None)
            note(False, reason)
            if record is not None and record.on_done is not None:
                record.on_done(time.perf_counter() - started, reason)
            warnings.warn(f"the meta-step did not compile ({reason}); it runs eagerly",
                          CompileFallback, stacklevel=3)
            raise NotCompiled(reason) from None
        note(True)
        if record is not None:
            record.compiles += 1
            record.seconds += time.perf_counter() - started
            if record.on_done is not None:
                record.on_done(time.perf_counter() - started, None)
        return out

    return run


class NotCompiled(Exception):
    """Raised by a compiled meta-gradient that failed to compile: the caller runs eagerly."""


def compile_failure(error: BaseException) -> str | None:
    """One line for an error ``torch.compile`` raised while compiling: what failed (Dynamo's
    own words, the op it names, or the error a backend raised) and where (the user's file and
    line; for a backend's failure, the deepest frame outside torch, else torch's own), or
    ``None`` for an error of the computation itself."""
    import torch._dynamo.exc as dynamo

    kinds = tuple(k for k in (getattr(dynamo, n, None) for n in (
        "TorchDynamoException", "FailOnRecompileLimitHit")) if isinstance(k, type))
    if not isinstance(error, kinds):
        return None
    chain = _chain(error)
    lines = _lines(error)
    head = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    if not lines or lines[0].endswith("raised:"):  # a backend's failure: say what it raised
        inner = chain[-1] if len(chain) > 1 else None
        raised = (_lines(inner)[:1] or [""])[0] if inner is not None else ""
        raised = raised or (lines[1] if len(lines) > 1 else "")
        head = f"{head} {type(inner).__name__ + ': ' if inner is not None else ''}{raised}"
    explained = next((line.removeprefix("Explanation:").strip() for line in lines
                      if line.startswith("Explanation:")), None)
    if explained:  # its first sentence names the op ("... the builtin `_thread.get_ident.`")
        first = re.match(r"(.*?\.`?)(?=\s+[A-Z]|$)", explained)
        head = f"{head}: {first.group(1) if first else explained}"
    where = _where(chain, lines)
    return (head.strip() + (f"; at {where}" if where else ""))[:500]


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and the exceptions it was raised from, outermost first."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and all(current is not e for e in chain):
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _lines(error: BaseException) -> list[str]:
    return [line.strip() for line in str(error).splitlines() if line.strip()]


def _where(chain: list[BaseException], lines: list[str]) -> str | None:
    """The file and line a compile failure points at (see :func:`compile_failure`)."""
    for e in chain:  # Dynamo's user stack: the traced code's own frame
        stack = getattr(e, "real_stack", None)
        if stack:
            frame = stack[-1]
            return f'File "{frame.filename}", line {frame.lineno}, in {frame.name}'
    user = next((line for line in reversed(lines) if line.startswith("File ")), None)
    if user is not None:
        return user
    tb = chain[-1].__traceback__
    frames = traceback.extract_tb(tb) if tb is not None else []
    torch_dir = str(Path(torch.__file__).parent)
    outside = [f for f in frames if not f.filename.startswith(torch_dir)]
    if not frames:
        return None
    frame = (outside or frames)[-1]
    return f'File "{frame.filename}", line {frame.lineno}, in {frame.name}'


__all__ = ["Backend", "CompileFallback", "CompileRecord", "NotCompiled", "compile_failure",
           "compiled_mean_grads", "looped_mean", "note", "recording", "use_compile_cache"]
