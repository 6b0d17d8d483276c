"""One MAML meta-step: funcgraph against a clone-and-adapt per-task loop, same math, same run.

The baseline re-implements learn2learn's method here (learn2learn itself is not installed
or run; its overheads are not measured): for each task, clone the module's parameters (the
clones stay in the autograd graph), adapt with ``torch.autograd.grad(create_graph=True)`` and
by swapping the adapted tensors into the module, then ``backward()`` the query loss into the
shared parameters; Adam steps once per meta-batch. With ``higher`` installed (``pip install -e
".[bench]"``, a real third-party MAML), its ``innerloop_ctx`` runs the same step as a second
reference row. funcgraph runs the same computation as a
pure function (``funcgraph.meta.maml`` over ``conv4``) in each variant named by
``--strategies``: ``loop``, ``threads``, ``vmap`` or ``vmapN`` (N tasks at a time), optionally with
``+remat`` (the rematerialised meta-gradient: first-order query pass, one Hessian-vector
product per inner step; the memory-saving mode); ``loop+compile`` loops over each task's
meta-gradient compiled as one ``torch.compile`` graph (compiled during the gradient check,
tens of seconds); ``+twin`` runs funcgraph's maml over conv4's ``torch.nn`` twin instead
(its forward as a function of the params, ``torch.func.functional_call``: funcgraph's
machinery on the un-rewritten model; the loop only: native batch norm's
second order is wrong under ``vmap``, and ``functional_call`` is not thread-safe).

The speed-up over the baseline mixes two things: conv4's exact rewrites (the fused first
block, ReLU after max-pool, channels-last; see ``funcgraph/models/conv4.py``) and funcgraph's
meta-learning machinery. The row "baseline on funcgraph's conv4" separates them: the same
clone-and-adapt loop, whose module is a ``torch.nn`` face of funcgraph's conv4
(:class:`FuncgraphConv4`), so only the loop is the baseline's; a summary line per funcgraph
variant splits its speed-up into baseline / baseline-on-rewritten (what the rewrites buy) and
baseline-on-rewritten / funcgraph (what the machinery buys).

Timings are interleaved (the references, then each funcgraph variant, repeated), so load
changes on a shared machine hit all alike; the table shows medians. Before timing, the
meta-gradients of every variant are compared with the baseline's on the same batch. Peak RSS
is measured per variant in a fresh process (``--peak-of``) that builds the same batch and
runs that variant's step twice, resetting the kernel's high-water mark
(``/proc/self/clear_refs``) before the second, so that memory freed by other variants or
kept by a compilation cannot blur it. ``--breakdown N`` adds the N operators that take
longest in one step of the first variant (each kernel call timed directly). GFLOP/s divides
the useful work (FLOPs of the baseline step, counted once with ``torch.utils.flop_counter``)
by each variant's time; the line after the table gives the CPU's own dense rate (a large
matmul in float32, and in bfloat16 where a row runs in it, at the same threads), the ceiling
that column is read against.

Example (15 queries per class, the MAML evaluation protocol; prints a table and JSON lines)::

    python benchmarks/meta_step.py --queries 15 --variant pool --reps 5
    python benchmarks/meta_step.py --queries 1 --variant strided   # the meta-train default
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from funcgraph import bind, random
from funcgraph.allocator import keep_freed_memory
from funcgraph.meta import BoundApply, Task, maml, mean_task_grads
from funcgraph.meta.learner import TaskGradFn
from funcgraph.model import Model
from funcgraph.models import conv4
from funcgraph.models.conv4 import conv4_module
from funcgraph.params import Params, State
from funcgraph.train import Optimizer, adam


def clone_module(module: nn.Module) -> nn.Module:
    """After learn2learn's ``clone_module``: a shallow copy with graph-connected clones."""
    clone = module.__new__(type(module))
    clone.__dict__ = module.__dict__.copy()
    clone._parameters = {k: p.clone() for k, p in module._parameters.items()  # type: ignore[misc]
                         if p is not None}
    clone._modules = {k: clone_module(m) for k, m in module._modules.items() if m is not None}
    return clone


def update_module(module: nn.Module, grads: dict[str, Tensor], lr: float, prefix: str = "") -> None:
    """After learn2learn's ``update_module``: swap ``p - lr * g`` in for every parameter."""
    params: dict[str, Tensor | None] = module._parameters  # type: ignore[assignment]
    for k, p in list(params.items()):
        if p is not None:
            params[k] = p - lr * grads[prefix + k]
    for name, child in module._modules.items():
        if child is not None:
            update_module(child, grads, lr, f"{prefix}{name}.")


class FuncgraphConv4(nn.Module):
    """funcgraph's conv4 behind a ``torch.nn`` face, for the clone-and-adapt baseline: its
    parameters are conv4's params (copies, as ``nn.Parameter``), in nested submodules that
    mirror their dotted names, and its forward calls conv4's ``apply`` with whichever tensors
    sit in those slots (after :func:`update_module`, the adapted ones). The computation is
    exactly funcgraph's rewritten conv4; only the meta-learning loop around it is not."""

    def __init__(self, apply: BoundApply, params: Params) -> None:
        super().__init__()
        self.conv4 = apply  # a plain attribute: ``nn.Module.apply`` is taken
        for name, value in params.items():
            *path, leaf = name.split(".")
            owner: nn.Module = self
            for part in path:
                if part not in owner._modules:
                    owner.add_module(part, nn.Module())
                owner = owner._modules[part]  # type: ignore[assignment]
            owner.register_parameter(leaf, nn.Parameter(value.detach().clone()))

    def forward(self, x: Tensor) -> Tensor:
        return self.conv4(dict(self.named_parameters()), x)


def baseline_grads(module: nn.Module, tasks: Task, lr: float, steps: int) -> Params:
    """Mean meta-gradient over tasks with the clone-and-adapt loop (grads land in ``.grad``)."""
    module.zero_grad(set_to_none=True)
    for t in range(tasks.num_tasks):
        learner = clone_module(module)
        for _ in range(steps):
            loss = F.cross_entropy(learner(tasks.support_x[t]), tasks.support_y[t])
            named = dict(learner.named_parameters())  # the graph-connected clones
            grads = torch.autograd.grad(loss, list(named.values()), create_graph=True)
            update_module(learner, dict(zip(named, grads, strict=True)), lr)
        query_loss = F.cross_entropy(learner(tasks.query_x[t]), tasks.query_y[t])
        (query_loss / tasks.num_tasks).backward()
    return {n: p.grad for n, p in module.named_parameters() if p.grad is not None}


def higher_grads(module: nn.Module, tasks: Task, lr: float, steps: int) -> Params:
    """Mean meta-gradient with the ``higher`` library, a real third-party MAML: its
    ``innerloop_ctx`` over SGD, second order (grads land in ``.grad``)."""
    import higher

    module.zero_grad(set_to_none=True)
    inner = torch.optim.SGD(module.parameters(), lr=lr)
    for t in range(tasks.num_tasks):
        with higher.innerloop_ctx(module, inner, copy_initial_weights=False) as (fmodel, opt):
            for _ in range(steps):
                opt.step(F.cross_entropy(fmodel(tasks.support_x[t]), tasks.support_y[t]))
            query_loss = F.cross_entropy(fmodel(tasks.query_x[t]), tasks.query_y[t])
            (query_loss / tasks.num_tasks).backward()
    return {n: p.grad for n, p in module.named_parameters() if p.grad is not None}


def make_tasks(args: argparse.Namespace, dtype: torch.dtype) -> Task:
    k = random.split(random.key(args.seed), 2)
    n, t = args.ways, args.meta_batch
    sx = random.uniform(k[0], (t, n * args.shots, 1, 28, 28), dtype=dtype)
    qx = random.uniform(k[1], (t, n * args.queries, 1, 28, 28), dtype=dtype)
    sy = torch.arange(n).repeat_interleave(args.shots).expand(t, -1).contiguous()
    qy = torch.arange(n).repeat_interleave(args.queries).expand(t, -1).contiguous()
    return Task(sx, sy, qx, qy)


def peak_rss_reset() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss_gb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def child_command(*extra: str) -> list[str]:
    """This benchmark, with this run's arguments and ``extra``, as a child process."""
    return [sys.executable, __file__, *sys.argv[1:], *extra]


def peak_rss_in_child(variant: str) -> float:
    """Peak RSS (GB) of one step of ``variant``, measured in a fresh process."""
    out = subprocess.run(child_command("--peak-of", variant),
                         check=True, capture_output=True, text=True).stdout
    return float(json.loads(out.strip().splitlines()[-1])["peak_rss_gb"])


@dataclass(frozen=True)
class Variant:
    """One funcgraph row: how its tasks run and what computes each task's gradient."""

    strategy: str
    chunk: int | None
    task_grad: TaskGradFn
    compile: bool
    precision: str


BASELINE = "baseline (clone-and-adapt loop)"
REWRITTEN = "baseline on funcgraph's conv4"
BASELINES = (BASELINE, REWRITTEN)
HIGHER = "higher (innerloop_ctx, installed)"

CONVOLUTIONS = (torch.ops.aten.convolution.default, torch.ops.aten.convolution_backward.default)


def convolution_seconds(step: Callable[[], None], clock: Callable[[], float],
                        reps: int = 5) -> float:
    """Seconds that the convolution kernels of one ``step`` take alone: every convolution,
    convolution backward and (second order) double-backward convolution it runs is recorded
    by its shapes, layouts and options and replayed on fresh tensors of the same kind; each
    signature's median time, times its count. A floor for the step with these kernels."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    def spec(a: object) -> object:
        if isinstance(a, Tensor):
            return ("tensor", tuple(a.shape), a.stride(), a.dtype)
        return tuple(a) if isinstance(a, list) else a

    def fresh(shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        extent = 1 + sum((n - 1) * st for n, st in zip(shape, stride, strict=True))
        return torch.randn(max(extent, 1), dtype=dtype).as_strided(shape, stride)

    calls: Counter[tuple[object, ...]] = Counter()

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if func in CONVOLUTIONS:
                calls[(func, *(spec(a) for a in args))] += 1
            return func(*args, **(kwargs or {}))

    with Record():
        step()
    total = 0.0
    for (func, *specs), count in calls.items():
        args = [fresh(*a[1:]) if isinstance(a, tuple) and a and a[0] == "tensor" else a
                for a in specs]
        run = timer(lambda f=func, a=args: f(*a), clock)  # type: ignore[misc]
        run()
        total += count * statistics.median(run() for _ in range(reps))
    return total


def seconds_by_op(step: Callable[[], None]) -> dict[str, float]:
    """Wall seconds inside each aten operator during one ``step`` (forward, backward and
    double backward alike), timed around each kernel call. Unlike ``torch.profiler``, which
    can inflate small kernels several-fold, the kernels'
    sum stays close to the step's own time."""
    from collections import defaultdict

    from torch.utils._python_dispatch import TorchDispatchMode

    spent: defaultdict[str, float] = defaultdict(float)

    class Time(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            start = time.perf_counter()
            out = func(*args, **(kwargs or {}))
            spent[str(func.overloadpacket)] += time.perf_counter() - start
            return out

    with Time():
        step()
    return dict(spent)


def matmul_gflop_per_s(dtype: torch.dtype, clock: Callable[[], float], size: int = 2048,
                       reps: int = 5) -> float:
    """The CPU's dense rate at this thread count: GFLOP/s of a ``size``-square matmul in
    ``dtype`` (median of three rounds of ``reps``), the ceiling the GFLOP/s column is read
    against: a step's convolutions run no faster than the machine multiplies matrices."""
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    a @ b
    rounds = []
    for _ in range(3):
        start = clock()
        for _ in range(reps):
            a @ b
        rounds.append((clock() - start) / reps)
    return 2 * size**3 / statistics.median(rounds) / 1e9


def timer(fn: Callable[[], None], clock: Callable[[], float]) -> Callable[[], float]:
    """``fn`` made to return its duration on ``clock``."""
    def run() -> float:
        start = clock()
        fn()
        return clock() - start
    return run


def baseline_in_child(name: str) -> Callable[[], float]:
    """The step of baseline ``name`` in a child process with glibc's default allocator
    settings: each call asks it for one step and returns the duration it measured."""
    child = subprocess.Popen(child_command("--serve-baseline", name),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    stdin, stdout = child.stdin, child.stdout

    def run() -> float:
        stdin.write("step\n")
        stdin.flush()
        return float(stdout.readline())
    return run


def print_split(base: float, rewritten: float, funcgraph: dict[str, float]) -> None:
    """Each funcgraph variant's speed-up over the baseline (median seconds ``base``) as the
    product of what conv4's rewrites buy (baseline / baseline on funcgraph's conv4, median
    ``rewritten``) and what funcgraph's machinery buys (baseline on funcgraph's conv4 /
    funcgraph); a ``+twin`` variant, the other way round, splits its rewritten counterpart's
    speed-up into funcgraph's machinery on the twin (baseline / twin variant) and the rewrites
    under that machinery (twin variant / its counterpart). A line and a JSON line each."""
    rewrites = base / rewritten
    for name, sec in funcgraph.items():
        if name.endswith("+twin"):
            continue
        machinery = rewritten / sec
        print(f"split of 'funcgraph {name}' ({base / sec:.2f}x): conv4's rewrites "
              f"{rewrites:.2f}x (baseline / baseline on funcgraph's conv4) * funcgraph's "
              f"machinery {machinery:.2f}x (baseline on funcgraph's conv4 / funcgraph)")
        print(json.dumps({"split_of": f"funcgraph {name}", "speedup_vs_baseline": base / sec,
                          "rewrites": rewrites, "machinery": machinery}))
        twin = funcgraph.get(f"{name}+twin")
        if twin is not None:
            print(f"  the other way round: funcgraph's machinery on the torch.nn twin "
                  f"{base / twin:.2f}x (baseline / funcgraph {name}+twin) * conv4's rewrites "
                  f"under it {twin / sec:.2f}x (funcgraph {name}+twin / funcgraph {name})")
            print(json.dumps({"split_of": f"funcgraph {name}", "order": "machinery first",
                              "machinery_on_twin": base / twin, "rewrites_under_it": twin / sec}))


def parse_args() -> argparse.Namespace:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ways", type=int, default=5)
    p.add_argument("--shots", type=int, default=1)
    p.add_argument("--queries", type=int, default=15)
    p.add_argument("--meta-batch", type=int, default=32)
    p.add_argument("--inner-steps", type=int, default=1)
    p.add_argument("--inner-lr", type=float, default=0.4)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--variant", choices=("pool", "strided"), default="pool")
    p.add_argument("--strategies", default="loop,loop+remat,vmap8",
                   help="funcgraph variants: auto (what meta-train runs), loop, threads, "
                        "vmap (the device's chunks: 16 tasks at a time on CPU), vmapN (vmap N "
                        "tasks at a time), each optionally +remat, +compile (the whole "
                        "meta-gradient compiled; not with threads or remat), +bf16 "
                        "(precision='bf16'), +module (meta.maml of conv4 written as a plain "
                        "nn.Module, the user's path through from_module); loop+twin "
                        "(funcgraph's maml over the nn.Module's forward by functional_call, "
                        "no rewriting)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                   help="float64 for several inner steps: float32 rounding grows through "
                        "the steps, and the gradient check needs agreement")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall: perf_counter; cpu: process CPU time (robust on a shared machine)")
    p.add_argument("--malloc", choices=("default", "keep", "shipped"), default="default",
                   help="default: glibc as is, for both; keep: "
                        "funcgraph.allocator.keep_freed_memory() for both; shipped: funcgraph "
                        "with it (as its training commands run) and the baseline without it, "
                        "in a child process whose steps alternate with funcgraph's")
    p.add_argument("--breakdown", type=int, default=0, metavar="N",
                   help="also print the N operators that take longest in one step of the "
                        "first variant")
    p.add_argument("--serve-baseline", default=None, help=argparse.SUPPRESS)
    p.add_argument("--peak-of", default=None, help=argparse.SUPPRESS)  # internal, see docs
    return p.parse_args()


def set_allocator(args: argparse.Namespace) -> None:
    """Keep freed memory in this process where ``--malloc`` asks for it (``keep``: every
    process; ``shipped``: funcgraph's, not a process that runs only a baseline)."""
    baseline_only = args.serve_baseline is not None or args.peak_of in BASELINES
    keep = args.malloc == "keep" or (args.malloc == "shipped" and not baseline_only)
    if keep and not keep_freed_memory():
        raise SystemExit(f"--malloc {args.malloc}: this C library has no glibc mallopt")


def twin_forward(module: nn.Module) -> Callable[[Params, Tensor], Tensor]:
    """The ``torch.nn`` twin's forward as a function of the params (not thread-safe:
    ``functional_call`` swaps the tensors into the module for the call)."""

    def twin(p: Params, x: Tensor) -> Tensor:
        """``module(x)`` with the params ``p``."""
        return torch.func.functional_call(module, p, (x,))

    return twin


def parse_variant(spec: str, args: argparse.Namespace, model: Model, state: State,
                  module: nn.Module) -> Variant:
    """The variant of a spec such as ``vmap8+remat`` or ``vmap+module+compile``: maml over
    conv4 bound to its ``state``, over its ``torch.nn`` twin ``module`` (``+module``) or over
    that twin's forward by ``functional_call`` (``+twin``)."""
    name, *flags = spec.split("+")
    unknown = set(flags) - {"remat", "compile", "twin", "module", "bf16"}
    if unknown or not (name in ("auto", "loop", "threads") or name.startswith("vmap")) or (
            "compile" in flags and (name == "threads" or "remat" in flags)) or (
            "twin" in flags and (name != "loop" or {"compile", "module"} & set(flags))):
        raise SystemExit(f"--strategies: cannot read {spec!r}")
    chunk = int(name[4:]) if name.startswith("vmap") and name[4:] else None
    over: Any = (twin_forward(module) if "twin" in flags else module if "module" in flags else
                 bind(model, state))
    task_grad = maml(over, inner_steps=args.inner_steps, inner_lr=args.inner_lr,
                     remat="remat" in flags).task_grad
    return Variant("vmap" if name.startswith("vmap") else name, chunk, task_grad,
                   "compile" in flags, "bf16" if "bf16" in flags else "float32")


@dataclass
class Bench:
    """What one run measures: conv4's params and its ``torch.nn`` twin ``module``, the
    tasks, the funcgraph variants by spec and the references by row name (how each computes
    its meta-gradient, and on which module: the twin, or :class:`FuncgraphConv4`)."""

    args: argparse.Namespace
    params: Params
    module: nn.Module
    tasks: Task
    specs: dict[str, Variant]
    references: dict[str, tuple[Callable[..., Params], nn.Module]]
    optimizer: Optimizer
    opt_state: Params

    @classmethod
    def build(cls, args: argparse.Namespace) -> Bench:
        """Seed, build conv4 and its twins with the same params, the tasks and the variants;
        ``higher``'s row only where it is installed."""
        torch.manual_seed(args.seed)
        dtype = getattr(torch, args.dtype)
        model = conv4(args.ways, hidden=args.hidden, variant=args.variant, dtype=dtype)
        params, state = model.init(random.key(args.seed))
        module = conv4_module(args.ways, hidden=args.hidden, variant=args.variant)
        module.to(dtype).load_state_dict(params)
        rewritten = FuncgraphConv4(bind(model, state), params)
        tasks = make_tasks(args, dtype)
        specs = {spec: parse_variant(spec, args, model, state, module)
                 for spec in args.strategies.split(",")}
        optimizer = adam(1e-3)
        opt_state = optimizer.init(params)
        references: dict[str, tuple[Callable[..., Params], nn.Module]] = {
            BASELINE: (baseline_grads, module), REWRITTEN: (baseline_grads, rewritten)}
        if importlib.util.find_spec("higher") is not None:
            references[HIGHER] = (higher_grads, module)
        return cls(args, params, module, tasks, specs, references, optimizer, opt_state)

    def reference_grads(self, name: str) -> Params:
        """Reference ``name``'s meta-gradient on the tasks."""
        grads_of, net = self.references[name]
        return grads_of(net, self.tasks, self.args.inner_lr, self.args.inner_steps)

    def reference_step(self, name: str) -> Callable[[], None]:
        """One step of reference ``name``: its meta-gradient, then Adam on its module."""
        opt = torch.optim.Adam(self.references[name][1].parameters(), 1e-3)

        def step() -> None:
            """The meta-gradient, then the update."""
            self.reference_grads(name)
            opt.step()
        return step

    def fg_grads(self, spec: str) -> Params:
        """funcgraph variant ``spec``'s mean meta-gradient on the tasks."""
        v = self.specs[spec]
        grads, _, _ = mean_task_grads(v.task_grad, self.params, self.tasks, strategy=v.strategy,
                                      chunk_size=v.chunk, compile=v.compile,
                                      precision=v.precision)
        return grads

    def fg_step(self, spec: str) -> Callable[[], None]:
        """One step of funcgraph variant ``spec``: its meta-gradient, then Adam."""
        def step() -> None:
            """The meta-gradient, then the update (dropped: the same params every rep)."""
            self.optimizer.update(self.params, self.fg_grads(spec), self.opt_state)
        return step

    def steps(self) -> dict[str, Callable[[], None]]:
        """Every row's step by its row name: the references, then ``funcgraph <spec>``."""
        variants = {name: self.reference_step(name) for name in self.references}
        for name in self.specs:
            variants[f"funcgraph {name}"] = self.fg_step(name)
        return variants


def serve_baseline(bench: Bench, name: str, clock: Callable[[], float]) -> None:
    """A child of ``--malloc shipped``: one step of baseline ``name`` per request line on
    stdin, its duration printed on a line of its own."""
    timed_step = timer(bench.reference_step(name), clock)
    for _ in sys.stdin:
        print(timed_step(), flush=True)


def print_peak_rss(step: Callable[[], None]) -> None:
    """The child process measuring one variant's peak RSS: two steps, the kernel's
    high-water mark reset between them; a JSON line."""
    step()
    peak_rss_reset()
    step()
    print(json.dumps({"peak_rss_gb": peak_rss_gb()}))


def check_meta_gradients(bench: Bench) -> None:
    """Equal meta-gradients on this batch before any timing (float32: rounding-level
    agreement): each row's against the baseline's, a JSON line each; exit on a mismatch."""
    want = bench.reference_grads(BASELINE)
    others: dict[str, Callable[[], Params]] = {
        **{name: functools.partial(bench.reference_grads, name)
           for name in bench.references if name != BASELINE},
        **{f"funcgraph {name}": functools.partial(bench.fg_grads, name) for name in bench.specs}}
    for name, grads_of in others.items():
        got = grads_of()
        # Relative to the whole gradient: conv biases before batch norm have ~0 gradient, so
        # a per-tensor ratio would compare rounding noise with rounding noise.
        diff = torch.cat([(got[n] - want[n]).flatten() for n in want])
        err = (diff.norm() / torch.cat([w.flatten() for w in want.values()]).norm()).item()
        print(json.dumps({"check": name, "rel_grad_diff_vs_baseline": err}))
        spec = bench.specs.get(name.removeprefix("funcgraph "))
        # bfloat16 keeps ~3 digits and the meta-gradient is a difference of large terms: tens
        # of percent off float64 at initialisation (docs/meta-learning.md), for any library
        limit = 0.5 if spec is not None and spec.precision == "bf16" else 1e-3
        if err > limit:
            raise SystemExit(f"{name}: meta-gradient differs from the baseline ({err:.2e})")


def baseline_flops(bench: Bench) -> int:
    """The useful work of one meta-step: the FLOPs of the baseline's, counted once."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        baseline_grads(bench.module, bench.tasks, bench.args.inner_lr, bench.args.inner_steps)
    return counter.get_total_flops()


def interleaved_times(variants: dict[str, Callable[[], None]], args: argparse.Namespace,
                      clock: Callable[[], float]) -> dict[str, list[float]]:
    """Each row's step durations: one warm-up round, then ``--reps`` rounds that run every
    row in turn (with ``--malloc shipped`` the baselines in a child process)."""
    timed = {name: timer(fn, clock) for name, fn in variants.items()}
    if args.malloc == "shipped":
        timed.update({name: baseline_in_child(name) for name in BASELINES})
    times: dict[str, list[float]] = {name: [] for name in variants}
    for run in timed.values():  # warm-up
        run()
    for _ in range(args.reps):
        for name, run in timed.items():
            times[name].append(run())
    return times


def print_table(args: argparse.Namespace, times: dict[str, list[float]], rss: dict[str, float],
                flops: int) -> None:
    """The header line and one row per variant (median seconds, tasks/s, peak RSS, GFLOP/s,
    speed-up over the baseline), each with its JSON line."""
    base = statistics.median(times[BASELINE])
    print(f"\nmalloc {args.malloc}; conv4-{args.variant} {args.ways}-way {args.shots}-shot "
          f"{args.queries} query, "
          f"meta-batch {args.meta_batch}, {args.inner_steps} second-order inner step(s); "
          f"{flops / 1e9:.1f} GFLOP per meta-step; threads {torch.get_num_threads()}; "
          f"median of {args.reps}, {args.clock} clock")
    print(f"{'variant':34s} {'s/step':>8s} {'tasks/s':>8s} {'peak RSS GB':>12s} "
          f"{'GFLOP/s':>8s} {'speed-up':>9s}")
    for name, ts in times.items():
        med = statistics.median(ts)
        row = {"variant": name, "s_per_step": med, "tasks_per_s": args.meta_batch / med,
               "peak_rss_gb": rss[name], "gflop_per_s": flops / med / 1e9,
               "speedup_vs_baseline": base / med, "config": vars(args)}
        print(f"{name:34s} {med:8.3f} {row['tasks_per_s']:8.1f} {rss[name]:12.2f} "
              f"{row['gflop_per_s']:8.1f} {row['speedup_vs_baseline']:8.2f}x")
        print(json.dumps(row))


def print_convolution_bound(first: str, conv_s: float, base: float) -> None:
    """How fast variant ``first``'s step would be with nothing but its convolutions
    (``conv_s`` seconds), against the baseline's median ``base``; nothing when the replay saw
    none (the threads strategy runs its convolutions where the replay cannot see)."""
    if conv_s > 0:
        print(f"convolutions of one 'funcgraph {first}' step, replayed alone: {conv_s:.3f} s: "
              f"with no other work the step would be {base / conv_s:.2f}x the baseline")
        print(json.dumps({"convolution_s_per_step": conv_s, "of": f"funcgraph {first}",
                          "speedup_bound_vs_baseline": base / conv_s}))


def print_breakdown(step: Callable[[], None], first: str, top: int) -> None:
    """The ``top`` operators that take longest in one ``step`` of variant ``first``."""
    by_op = seconds_by_op(step)
    total = sum(by_op.values())
    print(f"\noperators of one 'funcgraph {first}' step (timed around each kernel; "
          f"{total:.3f} s in all)")
    for op, sec in sorted(by_op.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{sec:8.3f} s {100 * sec / total:5.1f}%  {op}")
    print(json.dumps({"seconds_by_op": by_op, "of": f"funcgraph {first}"}))


def main() -> None:
    """Check every row's meta-gradient against the baseline's, then time the rows
    interleaved and print the table, the CPU's matmul rate, the speed-up splits, the
    convolutions' bound and (``--breakdown``) the slowest operators."""
    args = parse_args()
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    set_allocator(args)
    bench = Bench.build(args)
    if args.serve_baseline is not None:  # a child of --malloc shipped: one step per request
        serve_baseline(bench, args.serve_baseline, clock)
        return
    variants = bench.steps()
    if args.peak_of is not None:  # the child process measuring one variant's peak RSS
        print_peak_rss(variants[args.peak_of])
        return

    check_meta_gradients(bench)
    flops = baseline_flops(bench)
    rss = {name: peak_rss_in_child(name) for name in variants}
    times = interleaved_times(variants, args, clock)
    base = statistics.median(times[BASELINE])
    first = next(iter(bench.specs))  # the variant whose convolutions are replayed
    conv_s = convolution_seconds(bench.fg_step(first), clock)
    # bfloat16's rate only where a row runs in it: without native bfloat16 (AVX2 alone) its
    # 2048-square matmuls take minutes
    dtypes = [torch.float32]
    if any(spec.precision == "bf16" for spec in bench.specs.values()):
        dtypes.append(torch.bfloat16)
    peaks = {str(dt).removeprefix("torch."): matmul_gflop_per_s(dt, clock) for dt in dtypes}
    print_table(args, times, rss, flops)
    print("the CPU's matmul rate at these threads (2048-square): " + ", ".join(
        f"{dt} {rate:.0f} GFLOP/s" for dt, rate in peaks.items()))
    print(json.dumps({"matmul_gflop_per_s": peaks}))
    print_split(base, statistics.median(times[REWRITTEN]),
                {name: statistics.median(times[f"funcgraph {name}"]) for name in bench.specs})
    print_convolution_bound(first, conv_s, base)
    if args.breakdown:
        print_breakdown(bench.fg_step(first), first, args.breakdown)


if __name__ == "__main__":
    from records import recorded  # benchmarks/records.py: --record appends a record

    recorded("meta_step")(main)()
