"""Running a per-task function over a batch of tasks: ``vmap``, a Python loop, or threads.

All give the same meta-gradient (the mean over tasks of each task's gradient, equal to
rounding); which is faster depends on the device and the task shape:

* ``"loop"`` runs one task at a time. Peak memory is one task's graph: the memory-saving
  choice for second order.
* ``"threads"`` runs the loop's per-task function on ``torch.get_num_threads()`` worker
  threads at once, each with one intra-op thread: the same CPU budget spent across tasks
  instead of inside each operation. A task's many small operations (the support set's
  forward, backward and double backward) barely speed up from one intra-op thread to two,
  while two tasks at once do; torch releases the GIL inside its kernels and the autograd
  engine. Memory: one task graph per worker. With freed memory kept in the heap (as the
  commands run) the loop was the faster on a 2-core CPU even for large tasks
  (:data:`CPU_VMAP_MAX_EXAMPLES`); see ``benchmarks/meta_step.py`` and
  ``docs/meta-learning.md``. Results are summed in task order, so they are deterministic.
* ``"vmap"`` runs all tasks as one batched computation (``torch.func.vmap``): few large
  kernels, which is what accelerators want; ``chunk_size`` bounds its memory (it maps that
  many tasks at a time), down to one task per chunk.

``"auto"`` takes the measured default for the device and task size
(:func:`default_strategy`); ``"measure"`` times each on the real batch and keeps the fastest
(:func:`measure_strategies`).

Task keys (:attr:`~funcgraph.meta.learner.Task.key`) travel with their tasks: ``pick`` hands
each task its own key, and ``vmap`` maps the key dim with the data (or maps no key at all for
key-free tasks), so every strategy gives each task the same randomness.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import torch
from torch import Tensor

from ..checks import check_choice, check_int
from ..control import vmap_hint
from ..errors import ConfigError
from ..params import Params
from ..precision import check_precision, in_precision
from .compiled import Backend, NotCompiled, compiled_mean_grads, looped_mean
from .learner import RANDOMNESS, StepInputs, Task, TaskEvalFn, TaskGradFn

STRATEGIES = ("loop", "threads", "vmap")
COMPILED = ("loop", "vmap")
"""The strategies a compiled meta-gradient runs with (:mod:`funcgraph.meta.compiled`)."""
CHOICES = ("auto", "measure", *STRATEGIES)

DEFAULT_STRATEGY: dict[str, str] = {"cpu": "vmap", "cuda": "vmap", "mps": "vmap"}
"""The measured default per device type for small tasks (see :func:`default_strategy`)."""

CPU_VMAP_MAX_EXAMPLES = 20
"""On CPU, tasks with more examples (support + query) than this run in a loop.

Measured with ``benchmarks/meta_step.py`` (second-order MAML, meta-batch 32, 2 threads, wall
clock): at 10 examples per task (5-way 1-shot, 1 query, strided conv4) vmap takes 0.214 s per
meta-step against 0.294 s for the loop; at 80 (15 queries, pooled conv4) the loop takes
1.2-1.5 s, while vmap took 15.1 s and 8 GB (an earlier measurement, 1 thread, CPU time,
against 4.4 s for the loop of that time). The threshold lies between; 20 is on the safe side.
For those large tasks the loop (every op on all threads) beats ``"threads"`` (one task per
thread) once freed memory stays in the heap (:mod:`funcgraph.allocator`, as the commands
run): at 15 queries, 2 threads, 0.922 against 1.014 s per step on pooled conv4 and 0.423
against 0.506 s on strided conv4 (records in ``results/meta_step.jsonl``), with less memory.
"""


CPU_VMAP_CHUNK = 16
"""On CPU, ``"vmap"`` maps this many tasks at a time unless ``chunk_size`` says otherwise: a
bounded share of the memory, at about the speed of all tasks at once.

Measured with ``benchmarks/meta_step.py`` (second-order MAML, 5-way 1-shot, 1 query, meta-batch
32, median of 5; results/meta_step.jsonl), 16 at a time against all 32 at once: strided conv4,
2 threads, 0.47 against 0.60 GB peak (the clone-and-adapt loop's: 0.33 GB), at 0.143 against
0.122 s per step with freed memory kept (``funcgraph.allocator``, as the commands run) and
0.125 against 0.147 s with glibc's default, whose page faults grow with the batch; pooled
conv4, one thread, 0.79 against 1.14 GB at 0.531 against 0.540 s (memory kept).

Fewer at a time trade speed for memory by the model's size (2 threads, glibc's default, median
of 6): 8 at a time against 16 is 4% faster on pooled conv4 of width 64 at 1 query (1.022 against
1.065 s, 0.56 against 0.73 GB) but 12% slower at the shape of MAML++'s default step, strided
conv4 of width 32 at 3 queries, 16 tasks, one inner step (0.234 against 0.209 s, 0.37 against
0.41 GB). 16 stays the default; ``chunk_size=8`` is the memory-saving choice for wide pooled
models.
"""


def default_chunk_size(device: torch.device | str) -> int | None:
    """Tasks ``"vmap"`` maps at a time when ``chunk_size`` is ``None``: :data:`CPU_VMAP_CHUNK`
    on CPU, all of them (``None``) on an accelerator, which wants the fewest, largest kernels."""
    return CPU_VMAP_CHUNK if torch.device(device).type == "cpu" else None


def default_strategy(device: torch.device | str, examples_per_task: int | None = None) -> str:
    """The measured default: ``"vmap"``, except ``"loop"`` on CPU for large tasks."""
    kind = torch.device(device).type
    if kind == "cpu" and examples_per_task is not None and (
        examples_per_task > CPU_VMAP_MAX_EXAMPLES
    ):
        return "loop"
    return DEFAULT_STRATEGY.get(kind, "loop")


def check_compiled_strategy(who: str, compile: object, *strategies: str | None,
                            compile_option: str = "compile",
                            strategy_option: str = "strategy") -> None:
    """Refuse ``compile`` with ``"threads"`` among ``strategies``: a compiled meta-gradient
    runs its tasks in a loop or vmapped (:data:`COMPILED`), as Dynamo compiles from one
    thread. ``who`` and the option names are the caller's, as its user writes them
    (``MetaTrainer``'s ``compile``, ``meta-train``'s ``--compile``).

    Raises:
        ConfigError: ``compile`` is set and a strategy is ``"threads"``.
    """
    if compile and "threads" in strategies:
        raise ConfigError(f"{who}: {compile_option} runs tasks in a loop or vmapped, not "
                          f"'threads' (Dynamo compiles from one thread): choose another "
                          f"{strategy_option}")


Result = TypeVar("Result")


def per_task(fn: Callable[[int], Result], num: int, *, workers: int = 1) -> Iterator[Result]:
    """``fn(0), ..., fn(num - 1)`` in order: in this thread, or with ``workers > 1`` computed
    on that many worker threads with one intra-op thread each.

    ``torch.set_num_threads`` in a worker changes that thread's OpenMP setting and the default
    that new threads start from; the caller's count is restored when the workers are done.
    """
    workers = min(workers, num)
    if workers < 2:
        yield from (fn(t) for t in range(num))
        return
    budget = torch.get_num_threads()
    pool = ThreadPoolExecutor(workers, initializer=torch.set_num_threads, initargs=(1,))
    try:
        yield from pool.map(fn, range(num))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        torch.set_num_threads(budget)


def _resolve(fn: str, fn_arg: object, meta_params: object, tasks: object, strategy: object,
             chunk_size: object, workers: object) -> tuple[str, int | None]:
    """Check the arguments of :func:`mean_task_grads` / :func:`task_evals` (named ``fn``);
    ``(strategy, chunk size)`` with ``"auto"`` resolved to the measured default for the tasks'
    device and size and a ``None`` chunk size to the device's (:func:`default_chunk_size`)."""
    if not callable(fn_arg):
        raise ConfigError(f"{fn}: the per-task function must be callable (learner.task_grad or "
                          f"learner.task_eval), got {fn_arg!r}")
    if not isinstance(meta_params, dict):
        raise ConfigError(f"{fn}: meta_params must be a dict of tensors (a Params), got "
                          f"{type(meta_params).__name__}")
    if not isinstance(tasks, Task):
        raise ConfigError(f"{fn}: tasks must be a batch of tasks (funcgraph.meta.Task with a "
                          f"leading task dim), got {type(tasks).__name__}")
    check_choice(fn, "strategy", strategy, ("auto", *STRATEGIES))
    for name, value in (("chunk_size", chunk_size), ("workers", workers)):
        if value is not None:
            check_int(fn, name, value)
    device = tasks.support_x.device
    chosen = str(strategy) if strategy != "auto" else default_strategy(
        device, examples_per_task(tasks))
    return chosen, chunk_size if isinstance(chunk_size, int) else default_chunk_size(device)


def examples_per_task(tasks: Task) -> int:
    """Examples (support + query) in each task of a batch: what the strategy depends on."""
    return int(tasks.support_x.shape[1] + tasks.query_x.shape[1])


def _looped(fn: Callable[[Params, Task], Result], meta_params: Params, tasks: Task,
            strategy: str, workers: int | None) -> Iterator[Result]:
    """``fn`` on each task in order, under a non-vmap strategy: in this thread for
    ``"loop"``, on ``workers`` threads (default ``torch.get_num_threads()``) for
    ``"threads"`` (:func:`per_task`)."""
    if strategy != "threads":
        workers = 1
    elif workers is None:
        workers = torch.get_num_threads()
    return per_task(lambda t: fn(meta_params, tasks.pick(t)), tasks.num_tasks, workers=workers)


def _vmapped(fn: Callable[[Params, Task], Any], meta_params: Params, tasks: Task,
             chunk_size: int | None) -> Any:
    """``fn`` mapped over the tasks; torch's refusal of a Python ``if`` on a tensor becomes
    the hint to use ``funcgraph.cond`` (:func:`funcgraph.control.vmap_hint`). A draw from
    torch's generator (an ``nn.Module``'s ``nn.Dropout``) is drawn for each task apart, as the
    loop draws it (:data:`RANDOMNESS`)."""
    try:
        return torch.func.vmap(fn, in_dims=(None, 0), chunk_size=chunk_size,
                               randomness=RANDOMNESS)(meta_params, tasks)
    except RuntimeError as e:
        hint = vmap_hint(e)
        if hint is None:
            raise
        raise hint from e


def mean_task_grads(
    task_grad: TaskGradFn,
    meta_params: Params,
    tasks: Task,
    *,
    strategy: str = "auto",
    chunk_size: int | None = None,
    workers: int | None = None,
    precision: str = "float32",
    compile: bool | Backend = False,
) -> tuple[Params, Tensor, Tensor]:
    """The mean over the tasks of ``task_grad``: ``(grads, loss, metric)``.

    Arguments:
        task_grad: ``(meta_params, one task) -> (grads, loss, metric)``.
        meta_params: shared by every task.
        tasks: a batch of ``T`` tasks (leading dim ``T`` on every tensor, the keys included).
        strategy: ``"loop"``, ``"threads"``, ``"vmap"``, or ``"auto"``: the measured default
            for the tasks' device and size (:func:`default_strategy`), as
            ``funcgraph meta-train`` runs.
        chunk_size: with ``"vmap"``, map at most this many tasks at a time (memory bound);
            ``None``: the device's default (:func:`default_chunk_size`: 16 on CPU).
        workers: with ``"threads"``, the worker threads (default ``torch.get_num_threads()``).
        precision: ``"float32"``, or ``"bf16"``: each task computes its convolutions and
            matmuls in bfloat16 (:mod:`funcgraph.precision`; in every strategy, worker
            threads included), the gradients, losses and params staying float32.
        compile: compile the whole mean meta-gradient with ``torch.compile`` (the per-task
            gradient with ``"loop"``, the vmapped mean with ``"vmap"``;
            :mod:`funcgraph.meta.compiled`). The first call compiles; one that cannot be
            compiled whole warns once (:class:`~funcgraph.meta.compiled.CompileFallback`) and
            runs eagerly. ``True`` compiles with torch's default backend (inductor); a string
            names another ``torch.compile`` backend (``"aot_eager"``), and a callable is one
            (``torch._dynamo.testing.CompileCounterWithBackend("aot_eager")`` counts graphs).
            A :class:`~funcgraph.meta.learner.StepInputs` compiles its ``fn`` once, its
            tensors passed as arguments. Inside :func:`~funcgraph.meta.compiled.recording`
            the record says whether it ran compiled.
    """
    strategy, chunk_size = _resolve("mean_task_grads", task_grad, meta_params, tasks, strategy,
                                    chunk_size, workers)
    precise = check_precision("mean_task_grads", precision)
    device = tasks.support_x.device.type
    if compile:
        check_compiled_strategy("mean_task_grads", compile, strategy)
        # One compiled function per shared fn: a StepInputs' tensors are its arguments.
        fn, inputs = ((task_grad.fn, task_grad.inputs) if isinstance(task_grad, StepInputs)
                      else (task_grad, None))
        compiled = compiled_mean_grads(
            in_precision(fn, precise, device), strategy, key=(fn, precise, device),
            chunk_size=chunk_size, backend="inductor" if compile is True else compile,
            inputs=inputs is not None)
        if compiled is not None:
            try:
                return compiled(meta_params, tasks, inputs or {})
            except NotCompiled:
                pass
    task_grad = in_precision(task_grad, precise, device)
    if strategy == "vmap":
        grads, loss, metric = _vmapped(task_grad, meta_params, tasks, chunk_size)
        return {n: g.mean(0) for n, g in grads.items()}, loss.mean(), metric.mean()
    return looped_mean(_looped(task_grad, meta_params, tasks, strategy, workers))


def task_evals(
    task_eval: TaskEvalFn,
    meta_params: Params,
    tasks: Task,
    *,
    strategy: str = "auto",
    chunk_size: int | None = None,
    workers: int | None = None,
    precision: str = "float32",
) -> tuple[Tensor, Tensor]:
    """Per-task ``(losses (T,), metrics (T,))`` of ``task_eval`` over a batch of tasks
    (arguments as :func:`mean_task_grads`)."""
    strategy, chunk_size = _resolve("task_evals", task_eval, meta_params, tasks, strategy,
                                    chunk_size, workers)
    task_eval = in_precision(task_eval, check_precision("task_evals", precision),
                             tasks.support_x.device.type)
    if strategy == "vmap":
        loss, metric = _vmapped(task_eval, meta_params, tasks, chunk_size)
        return loss, metric
    pairs = list(_looped(task_eval, meta_params, tasks, strategy, workers))
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


def measure_strategies(run: Callable[[str], Any], *, repeats: int = 2,
                       strategies: tuple[str, ...] = STRATEGIES) -> dict[str, float]:
    """Median seconds of ``run(strategy)`` for each of ``strategies`` (after one warm-up call
    each, which is also where a compiled step compiles)."""
    times: dict[str, list[float]] = {s: [] for s in strategies}
    for s in strategies:
        run(s)
    for _ in range(repeats):
        for s in strategies:  # interleaved, so load changes hit both alike
            start = time.perf_counter()
            run(s)
            times[s].append(time.perf_counter() - start)
    return {s: sorted(v)[len(v) // 2] for s, v in times.items()}


def resolve_strategy(
    strategy: str,
    device: torch.device | str,
    *,
    examples_per_task: int | None = None,
    probe: Callable[[str], Any] | None = None,
    compiled: bool = False,
) -> str:
    """``"loop"``, ``"threads"`` or ``"vmap"`` for ``strategy`` in :data:`CHOICES` on ``device``.

    ``"auto"`` is :func:`default_strategy` for the device and task size; ``"measure"`` times
    ``probe(strategy)`` (a meta-step on a real batch) with :func:`measure_strategies` and
    keeps the faster. With ``compiled`` (a compiled meta-step) the candidates are ``"loop"``
    and ``"vmap"``, each measured compiled (``"auto"`` never takes threads).
    """
    if strategy not in CHOICES:
        raise ConfigError(f"strategy must be one of {CHOICES}, got {strategy!r}")
    if strategy == "auto":
        return default_strategy(device, examples_per_task)
    if strategy == "measure":
        if probe is None:
            raise ConfigError("resolve_strategy: 'measure' needs a probe function")
        times = measure_strategies(probe, strategies=COMPILED if compiled else STRATEGIES)
        return min(times, key=lambda s: times[s])
    return strategy


__all__ = [
    "CHOICES",
    "COMPILED",
    "CPU_VMAP_CHUNK",
    "CPU_VMAP_MAX_EXAMPLES",
    "DEFAULT_STRATEGY",
    "RANDOMNESS",
    "STRATEGIES",
    "check_compiled_strategy",
    "default_chunk_size",
    "default_strategy",
    "examples_per_task",
    "mean_task_grads",
    "measure_strategies",
    "per_task",
    "resolve_strategy",
    "task_evals",
]
