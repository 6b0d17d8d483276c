"""One implementation of one second-order MAML meta-step, in a process of its own.

:mod:`peers` starts this script once per implementation and round, with the Python of
whichever environment has that implementation (learn2learn builds in a venv of its own), so
each library runs with exactly its own imports and allocator. Every implementation runs the same
step: 5-way 1-shot tasks of 28x28 images, pooled conv4 (:class:`PeerConv4`, batch statistics),
one inner SGD step at ``--inner-lr``, the query cross-entropy averaged over ``--meta-batch``
tasks, then Adam at 1e-3.

- ``learn2learn``: ``l2l.algorithms.MAML(model, lr, first_order=False)``, ``clone()`` and
  ``adapt(loss)`` per task, ``backward()`` of each query loss;
- ``higher``: ``higher.innerloop_ctx`` with an SGD inner optimiser per task;
- ``autograd``: the same loop in plain torch (``torch.func.functional_call`` over the
  adapted tensors), the reference the others are checked against;
- ``funcgraph-module``: ``funcgraph.meta.maml(module)`` over :class:`PeerConv4` itself,
  ``strategy=--strategy``; ``funcgraph-conv4``: funcgraph's own conv4 (``variant="pool"``)
  loaded with the same parameters.

``--check OUT`` writes the mean meta-gradient in float64 (no optimiser step) to ``OUT``;
otherwise the worker runs one untimed step, then ``--steps`` timed ones, and prints one JSON
line: the median step in wall and CPU seconds and the process's peak resident memory.
``--profile`` prints instead where one step's time goes (``torch.profiler``'s self CPU time by
kind of operator: convolution, matmul, pooling, normalisation, copies and fills, element-wise,
other). ``--op-limit`` prints the step's op-limit: every convolution and matrix product the step
performs (forward, backward and second order, traced at the aten level with their shapes,
strides and dtypes) replayed alone on fresh tensors, best of ``--replays``, summed.

    python benchmarks/peer_worker.py learn2learn DATA.pt --steps 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

IMPLEMENTATIONS = ("learn2learn", "higher", "autograd", "funcgraph-module", "funcgraph-conv4")
Tasks = tuple[Tensor, Tensor, Tensor, Tensor]
"""``(support_x, support_y, query_x, query_y)``, each with the tasks on the leading dim."""


class Block(nn.Module):
    """One conv4 block's convolution and norm (a class of its own: ``higher`` patches each
    module's class, and cannot patch a bare ``nn.Module``)."""

    conv: nn.Conv2d
    norm: nn.BatchNorm2d


class PeerConv4(nn.Module):
    """Pooled conv4 as every peer writes it: four blocks of 3x3 convolution, batch norm with
    batch statistics, ReLU and 2x2 max-pool, then a linear head (funcgraph's
    ``conv4_module(ways, variant="pool")`` with the same parameter names)."""

    def __init__(self, ways: int, hidden: int = 64) -> None:
        super().__init__()
        for i in range(4):
            block = Block()
            block.conv = nn.Conv2d(1 if i == 0 else hidden, hidden, 3, 1, 1)
            block.norm = nn.BatchNorm2d(hidden, track_running_stats=False)
            self.add_module(f"block{i + 1}", block)
        self.head = nn.Linear(hidden, ways)

    def forward(self, x: Tensor) -> Tensor:
        for i in range(4):
            block = getattr(self, f"block{i + 1}")
            x = F.max_pool2d(F.relu(block.norm(block.conv(x))), 2)
        return self.head(x.flatten(1))


def make_data(ways: int, queries: int, meta_batch: int, seed: int = 0) -> dict[str, Any]:
    """The initial parameters and the tasks every implementation starts from."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    state = PeerConv4(ways).state_dict()
    sx = torch.rand(meta_batch, ways, 1, 28, 28, generator=gen)
    qx = torch.rand(meta_batch, ways * queries, 1, 28, 28, generator=gen)
    sy = torch.arange(ways).expand(meta_batch, -1).contiguous()
    qy = torch.arange(ways).repeat_interleave(queries).expand(meta_batch, -1).contiguous()
    return {"state": state, "tasks": (sx, sy, qx, qy), "ways": ways}


def _stub_class(name: str) -> type:
    """A class for any public name of a stubbed module (dunder names stay missing, so
    ``inspect`` and ``import`` see a plain module)."""
    if name.startswith("__"):
        raise AttributeError(name)
    return type(name, (), {})


def learn2learn_step(model: nn.Module, lr: float) -> Callable[[nn.Module, Tasks, float], None]:
    """learn2learn's MAML wrapped around ``model`` once; the returned function puts the mean
    meta-gradient into ``model``'s ``.grad``."""
    import types

    class NoTorchvision:  # learn2learn imports torchvision, which its MAML does not use
        def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
            if name == "torchvision" or name.startswith("torchvision."):
                import importlib.machinery

                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec: Any) -> types.ModuleType:
            return types.ModuleType(spec.name)

        def exec_module(self, module: types.ModuleType) -> None:
            module.__path__ = []  # type: ignore[attr-defined]
            # any name it is asked for is a class (learn2learn subclasses some at import)
            module.__getattr__ = _stub_class  # type: ignore[attr-defined]

    if "learn2learn" not in sys.modules:
        sys.meta_path.insert(0, NoTorchvision())  # type: ignore[arg-type]
    import learn2learn as l2l

    meta = l2l.algorithms.MAML(model, lr=lr, first_order=False)

    def grads(model: nn.Module, tasks: Tasks, lr: float) -> None:
        sx, sy, qx, qy = tasks
        for t in range(sx.shape[0]):
            learner = meta.clone()
            learner.adapt(F.cross_entropy(learner(sx[t]), sy[t]))
            (F.cross_entropy(learner(qx[t]), qy[t]) / sx.shape[0]).backward()
    return grads


def higher_grads(model: nn.Module, tasks: Tasks, lr: float) -> None:
    import higher

    inner = torch.optim.SGD(model.parameters(), lr=lr)
    sx, sy, qx, qy = tasks
    for t in range(sx.shape[0]):
        with higher.innerloop_ctx(model, inner, copy_initial_weights=False) as (fmodel, opt):
            opt.step(F.cross_entropy(fmodel(sx[t]), sy[t]))
            (F.cross_entropy(fmodel(qx[t]), qy[t]) / sx.shape[0]).backward()


def autograd_grads(model: nn.Module, tasks: Tasks, lr: float) -> None:
    params = dict(model.named_parameters())
    sx, sy, qx, qy = tasks
    for t in range(sx.shape[0]):
        loss = F.cross_entropy(torch.func.functional_call(model, params, (sx[t],)), sy[t])
        grads = torch.autograd.grad(loss, list(params.values()), create_graph=True)
        adapted = {n: p - lr * g for (n, p), g in zip(params.items(), grads, strict=True)}
        query = torch.func.functional_call(model, adapted, (qx[t],))
        (F.cross_entropy(query, qy[t]) / sx.shape[0]).backward()


def funcgraph_step(name: str, model: nn.Module, lr: float, strategy: str
                   ) -> Callable[[nn.Module, Tasks, float], None]:
    """A function that puts funcgraph's mean meta-gradient into ``model``'s ``.grad``."""
    from funcgraph import bind
    from funcgraph.meta import Task, maml, mean_task_grads
    from funcgraph.models import conv4

    if name == "funcgraph-module":
        apply: Any = model
    else:
        net = conv4(model.head.out_features, variant="pool")
        from funcgraph import random

        _, state = net.init(random.key(0))
        apply = bind(net, state)
    task_grad = maml(apply, inner_steps=1, inner_lr=lr).task_grad

    def grads(model: nn.Module, tasks: Tasks, lr: float) -> None:
        params = {n: p.detach() for n, p in model.named_parameters()}
        mean, _, _ = mean_task_grads(task_grad, params, Task(*tasks), strategy=strategy)
        for n, p in model.named_parameters():
            p.grad = mean[n]
    return grads


KINDS = (
    ("convolution", ("conv", "im2col", "col2im")),
    ("matmul", ("addmm", "aten::mm", "bmm", "matmul", "linear")),
    ("pooling", ("pool",)),
    ("normalisation", ("batch_norm", "var_mean", "aten::var", "native_batch_norm")),
    ("copies and fills", ("copy", "clone", "contiguous", "fill", "zero", "cat", "stack",
                          "empty", "index", "scatter", "gather", "expand", "view", "reshape",
                          "permute", "transpose", "as_strided", "select", "slice", "unsqueeze",
                          "squeeze", "t\b")),
)


def kind_of(op: str) -> str:
    for kind, marks in KINDS:
        if any(mark in op for mark in marks):
            return kind
    return "element-wise" if op.startswith("aten::") else "other"


def profile(step: Callable[[], None]) -> dict[str, float]:
    """Fractions of one step's self CPU time by kind of operator (:data:`KINDS`)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    with profiler(activities=[ProfilerActivity.CPU]) as prof:
        step()
    by_kind: dict[str, float] = {}
    for event in prof.key_averages():
        kind = kind_of(event.key)
        by_kind[kind] = by_kind.get(kind, 0.0) + event.self_cpu_time_total
    total = sum(by_kind.values())
    return {kind: round(us / total, 4) for kind, us in sorted(by_kind.items())}


DENSE_OPS = {"aten.convolution.default", "aten.convolution_backward.default",
             "aten.mm.default", "aten.addmm.default", "aten.bmm.default"}


def op_limit(step: Callable[[], None], replays: int) -> dict[str, Any]:
    """Every dense op of one ``step`` (:data:`DENSE_OPS`) replayed alone: their summed best
    times are the step's op-limit, what the step would take if nothing but them ran."""
    from torch.utils._python_dispatch import TorchDispatchMode

    calls: dict[str, tuple[Any, tuple[Any, ...], dict[str, Any], int]] = {}

    def spec(x: Any) -> Any:
        return (tuple(x.shape), x.stride(), x.dtype) if isinstance(x, Tensor) else x

    class Trace(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                               ) -> Any:
            kwargs = kwargs or {}
            if str(func) in DENSE_OPS:
                key = repr((str(func), [spec(a) for a in args], sorted(kwargs.items())))
                before = calls.get(key)
                calls[key] = (func, args, kwargs, before[3] + 1 if before else 1)
            return func(*args, **kwargs)

    with Trace():
        step()

    def fresh(x: Any) -> Any:
        return (torch.empty_strided(x.shape, x.stride(), dtype=x.dtype).uniform_(-1, 1)
                if isinstance(x, Tensor) else x)

    total, rows = 0.0, []
    for func, args, kwargs, count in calls.values():
        inputs = [fresh(a) for a in args]
        best = float("inf")
        for _ in range(replays + 1):  # the first replay warms up
            start = time.perf_counter()
            func(*inputs, **kwargs)
            best = min(best, time.perf_counter() - start)
        total += best * count
        rows.append({"op": str(func), "count": count, "best_ms": round(1e3 * best, 3),
                     "shapes": [list(a.shape) for a in args if isinstance(a, Tensor)]})
    return {"op_limit_s": round(total, 4), "distinct_ops": len(rows),
            "calls": sum(r["count"] for r in rows), "ops": rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("implementation", choices=IMPLEMENTATIONS)
    parser.add_argument("data", type=Path, help="the file peers.py wrote (params and tasks)")
    parser.add_argument("--steps", type=int, default=1, help="timed steps after a warm-up")
    parser.add_argument("--inner-lr", type=float, default=0.4)
    parser.add_argument("--strategy", default="auto", help="funcgraph's task strategy")
    parser.add_argument("--check", type=Path, help="write the float64 meta-gradient here")
    parser.add_argument("--profile", action="store_true", help="where one step's time goes")
    parser.add_argument("--op-limit", action="store_true", help="the step's dense ops alone")
    parser.add_argument("--replays", type=int, default=5, help="with --op-limit: best of N")
    args = parser.parse_args(argv)

    data = torch.load(args.data)
    dtype = torch.float64 if args.check else torch.float32
    model = PeerConv4(data["ways"]).to(dtype)
    model.load_state_dict(data["state"])
    tasks: Tasks = tuple(t.to(dtype) if t.is_floating_point() else t  # type: ignore[assignment]
                         for t in data["tasks"])
    grads_of = {"higher": higher_grads, "autograd": autograd_grads}.get(args.implementation)
    if args.implementation == "learn2learn":
        grads_of = learn2learn_step(model, args.inner_lr)
    elif grads_of is None:
        grads_of = funcgraph_step(args.implementation, model, args.inner_lr, args.strategy)
    if args.check:
        grads_of(model, tasks, args.inner_lr)
        torch.save({n: p.grad for n, p in model.named_parameters()}, args.check)
        return
    opt = torch.optim.Adam(model.parameters(), 1e-3)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        grads_of(model, tasks, args.inner_lr)
        opt.step()

    step()  # warm-up: first-call costs (lazy imports, kernel choice) stay out of the times
    if args.profile or args.op_limit:
        found = profile(step) if args.profile else op_limit(step, args.replays)
        print(json.dumps({"implementation": args.implementation,
                          "threads": torch.get_num_threads(),
                          "profile" if args.profile else "op_limit": found}))
        return
    wall, cpu = [], []
    for _ in range(args.steps):
        w, c = time.perf_counter(), time.process_time()
        step()
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    hwm = next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
               if line.startswith("VmHWM:"))
    print(json.dumps({"implementation": args.implementation, "wall_s": statistics.median(wall),
                      "cpu_s": statistics.median(cpu), "peak_rss_mb": round(hwm / 1024, 1),
                      "threads": torch.get_num_threads(), "torch": torch.__version__}))


if __name__ == "__main__":
    main()
