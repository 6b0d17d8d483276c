"""conv4's fused first block against the unfused conv2d + batch_norm pair: accuracy and speed.

``nn.conv_batch_norm`` fuses conv4's first block (3x3 patches over one channel, 9 values wide
against 64 outputs): batch statistics from the patches' 9x9 covariance, the normalisation
folded into the convolution (docs/meta-learning.md). Here the same conv4 is built twice, once
as shipped and once with the fusion turned off (``PATCH_WIDTH_RATIO`` raised above any width
while the model is built, so every block is the plain pair), with the same params.

* ``accuracy`` (default): the MAML meta-gradient (one second-order inner step at lr 0.4) of
  ``--meta-batch`` 5-way 1-shot tasks with ``--queries`` queries per class,
  on uniform random 28x28 images (as ``benchmarks/meta_step.py``), in float32 for both models
  with the loop strategy (plain autograd: native batch norm, channels-last) and with ``vmap``
  (the mean/var form), relative to the float64 meta-gradient of the unfused pair (loop):
  ``||g32 - g64|| / ||g64||`` over all params. The float64 fused and unfused gradients are
  compared too (they must agree).
* ``speed``: seconds per meta-step (``mean_task_grads`` over the meta-batch, float32) of both
  models with ``--strategy``, interleaved over ``--reps`` repetitions (wall clock, medians),
  and the ratio unfused / fused.

    python benchmarks/fused_block.py accuracy --variant strided
    python benchmarks/fused_block.py accuracy --variant pool
    OMP_NUM_THREADS=1 python benchmarks/fused_block.py speed --strategy vmap --queries 1
    OMP_NUM_THREADS=1 python benchmarks/fused_block.py speed --strategy loop --queries 15
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch import Tensor

import funcgraph.nn.conv_norm as conv_norm
from funcgraph import bind, random
from funcgraph.debug import count_calls
from funcgraph.meta import Task, maml, mean_task_grads
from funcgraph.model import Model
from funcgraph.models import conv4
from funcgraph.params import Params

WAYS = 5


def build(variant: str, dtype: torch.dtype, *, fused: bool) -> Model:
    saved = conv_norm.PATCH_WIDTH_RATIO
    if not fused:
        conv_norm.PATCH_WIDTH_RATIO = 10**9  # no block is wide enough to fuse
    try:
        model = conv4(WAYS, variant=variant, dtype=dtype)
    finally:
        conv_norm.PATCH_WIDTH_RATIO = saved
    with count_calls(F.unfold) as seen:
        bind(model, {})(model.init(random.key(0))[0], torch.zeros(2, 1, 28, 28, dtype=dtype))
    if seen.count != (1 if fused else 0):
        raise RuntimeError(f"fused={fused}: the first block ran F.unfold {seen.count} times")
    return model


def make_tasks(n: int, queries: int, seed: int, dtype: torch.dtype) -> Task:
    k = random.split(random.key(seed), 2)
    sx = random.uniform(k[0], (n, WAYS, 1, 28, 28), dtype=dtype)
    qx = random.uniform(k[1], (n, WAYS * queries, 1, 28, 28), dtype=dtype)
    sy = torch.arange(WAYS).expand(n, -1).contiguous()
    qy = torch.arange(WAYS).repeat_interleave(queries).expand(n, -1).contiguous()
    return Task(sx, sy, qx, qy)


def meta_grad(model: Model, params: Params, tasks: Task, strategy: str) -> Params:
    learner = maml(bind(model, {}), inner_steps=1, inner_lr=0.4)
    grads, _, _ = mean_task_grads(learner.task_grad, params, tasks, strategy=strategy)
    return grads


def flat(g: Params) -> Tensor:
    return torch.cat([g[n].double().flatten() for n in sorted(g)])


def accuracy(args: argparse.Namespace) -> None:
    params32 = build(args.variant, torch.float32, fused=True).init(random.key(args.seed))[0]
    params64 = {n: t.double() for n, t in params32.items()}
    tasks32 = make_tasks(args.meta_batch, args.queries, args.seed + 1, torch.float32)
    tasks64 = Task(*(t.double() if t.is_floating_point() else t for t in tasks32))
    ref = flat(meta_grad(build(args.variant, torch.float64, fused=False), params64, tasks64,
                         "loop"))
    fused64 = flat(meta_grad(build(args.variant, torch.float64, fused=True), params64, tasks64,
                             "loop"))
    print(f"conv4 {args.variant}, {args.meta_batch} tasks, {args.queries} queries, "
          f"torch {torch.__version__}")
    rel64 = ((fused64 - ref).norm() / ref.norm()).item()
    print(f"float64 fused vs unfused: relative {rel64:.1e}")
    print(json.dumps({"mode": "accuracy", "variant": args.variant, "dtype": "float64",
                      "strategy": "loop", "model": "fused", "rel_error_vs_unfused_f64": rel64}))
    for strategy in ("loop", "vmap"):
        for fused in (True, False):
            g = flat(meta_grad(build(args.variant, torch.float32, fused=fused), params32,
                               tasks32, strategy))
            name = "fused" if fused else "unfused"
            rel = ((g - ref).norm() / ref.norm()).item()
            print(f"float32 {strategy:4s} {name:7s} vs float64: relative {rel:.1e}")
            print(json.dumps({"mode": "accuracy", "variant": args.variant, "dtype": "float32",
                              "strategy": strategy, "model": name,
                              "rel_error_vs_unfused_f64": rel}))


def speed(args: argparse.Namespace) -> None:
    models = {name: build(args.variant, torch.float32, fused=name == "fused")
              for name in ("fused", "unfused")}
    params = models["fused"].init(random.key(args.seed))[0]
    tasks = make_tasks(args.meta_batch, args.queries, args.seed + 1, torch.float32)
    times: dict[str, list[float]] = {name: [] for name in models}
    for model in models.values():  # warm-up
        meta_grad(model, params, tasks, args.strategy)
    for _ in range(args.reps):
        for name, model in models.items():
            start = time.perf_counter()
            meta_grad(model, params, tasks, args.strategy)
            times[name].append(time.perf_counter() - start)
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"conv4 {args.variant}, {args.strategy}, {args.meta_batch} tasks, {args.queries} "
          f"queries, {torch.get_num_threads()} thread(s), {args.reps} interleaved reps")
    for name, m in med.items():
        print(f"{name:8s} {m:.3f} s/step  (all: {', '.join(f'{t:.3f}' for t in times[name])})")
    print(f"fused is {med['unfused'] / med['fused']:.2f}x faster")
    print(json.dumps({"mode": "speed", "variant": args.variant, "strategy": args.strategy,
                      "queries": args.queries, "threads": torch.get_num_threads(),
                      "reps": args.reps, "fused_s": med["fused"], "unfused_s": med["unfused"],
                      "speedup": med["unfused"] / med["fused"]}))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", nargs="?", choices=("accuracy", "speed"), default="accuracy")
    p.add_argument("--variant", choices=("strided", "pool"), default="strided")
    p.add_argument("--meta-batch", type=int, default=None,
                   help="tasks per meta-step (default 8 for accuracy, 32 for speed)")
    p.add_argument("--queries", type=int, default=15)
    p.add_argument("--strategy", choices=("loop", "vmap", "threads"), default="vmap")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.meta_batch is None:
        args.meta_batch = 8 if args.mode == "accuracy" else 32
    (accuracy if args.mode == "accuracy" else speed)(args)


if __name__ == "__main__":
    from records import recorded  # benchmarks/records.py: --record appends a record

    recorded("fused_block")(main)()
