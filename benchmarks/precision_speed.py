"""One MAML meta-step in bfloat16 against float32, every strategy, timed interleaved.

For each task shape (``--queries``: 1 query per class on strided conv4, the meta-train
default; 15 on pooled conv4, the evaluation protocol) and each strategy (``loop``,
``threads``, ``vmap``), funcgraph's second-order meta-step (meta-batch 32, one inner step) runs
with ``precision="float32"`` and ``"bf16"``, and the clone-and-adapt baseline
(``benchmarks/meta_step.py``'s learn2learn-style loop over ``torch.nn`` conv4) runs in float32
and under ``torch.autocast("cpu", dtype=torch.bfloat16)``, the way users of other libraries
get bfloat16. All variants of a shape are timed interleaved over ``--reps`` rounds (medians of
wall seconds); ratios are against funcgraph float32 in the same strategy and against the
baseline's float32. Before timing, each precision's meta-gradient is compared with the
float64 one on the same batch (relative L2 error).

Whether bfloat16 is fast depends on the CPU: the run prints the CPU's bfloat16 flags
(``funcgraph.precision.bf16_native``).

    python benchmarks/precision_speed.py [--queries 1,15] [--reps 5] [--record]
    python benchmarks/precision_speed.py --profile [--record]   # where a bf16 step's time goes

``--profile`` instead profiles one loop-strategy meta-step of each precision (15 queries,
pooled conv4, 8 tasks, one thread) with ``torch.profiler`` and prints the share of its CPU
time spent in casts and copies (``aten::_to_copy``, ``copy_``, ``to``, ``empty_strided``)
beside the largest operators: what autocast's per-op weight casts cost.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Callable

import torch
from meta_step import baseline_grads  # benchmarks/meta_step.py: the clone-and-adapt loop

from funcgraph import bind, random
from funcgraph.meta import Task, maml, mean_task_grads
from funcgraph.models import conv4
from funcgraph.models.conv4 import conv4_module
from funcgraph.params import Params
from funcgraph.precision import bf16_native

STRATEGIES = ("loop", "threads", "vmap")


def make_tasks(queries: int, meta_batch: int, dtype: torch.dtype) -> Task:
    k = random.split(random.key(0), 2)
    sx = random.uniform(k[0], (meta_batch, 5, 1, 28, 28), dtype=torch.float64).to(dtype)
    qx = random.uniform(k[1], (meta_batch, 5 * queries, 1, 28, 28),
                        dtype=torch.float64).to(dtype)
    sy = torch.arange(5).expand(meta_batch, -1).contiguous()
    qy = torch.arange(5).repeat_interleave(queries).expand(meta_batch, -1).contiguous()
    return Task(sx, sy, qx, qy)


def rel_error(grads: Params, reference: Params) -> float:
    num = sum(((grads[n].double() - reference[n]) ** 2).sum() for n in reference) ** 0.5
    return float(num / sum((reference[n] ** 2).sum() for n in reference) ** 0.5)


def median_seconds(fns: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    for fn in fns.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():  # interleaved: load changes hit every variant alike
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def run_shape(queries: int, args: argparse.Namespace) -> None:
    variant = "strided" if queries == 1 else "pool"
    model64 = conv4(5, variant=variant, dtype=torch.float64)
    p64, state = model64.init(random.key(0))
    model = conv4(5, variant=variant)
    params = {n: v.float() for n, v in p64.items()}
    tasks, tasks64 = (make_tasks(queries, args.meta_batch, d)
                      for d in (torch.float32, torch.float64))
    reference = mean_task_grads(maml(bind(model64, state, train=True), inner_steps=1,
                                     inner_lr=0.4).task_grad, p64, tasks64, strategy="loop")[0]
    learner = maml(bind(model, state, train=True), inner_steps=1, inner_lr=0.4)

    def step(strategy: str, precision: str) -> Callable[[], Params]:
        return lambda: mean_task_grads(learner.task_grad, params, tasks, strategy=strategy,
                                       precision=precision)[0]

    module = conv4_module(5, variant=variant)
    module.load_state_dict(params)

    def baseline(bf16: bool) -> Callable[[], Params]:
        def run() -> Params:
            context = (torch.autocast("cpu", dtype=torch.bfloat16) if bf16
                       else contextlib.nullcontext())
            with context:
                return baseline_grads(module, tasks, 0.4, 1)
        return run

    fns: dict[str, Callable[[], Params]] = {"baseline float32": baseline(False),
                                           "baseline bf16 autocast": baseline(True)}
    for strategy in args.strategies.split(","):
        for precision in ("float32", "bf16"):
            fns[f"funcgraph {strategy} {precision}"] = step(strategy, precision)
    errors = {name: rel_error({n: g.detach() for n, g in fn().items()}, reference)
              for name, fn in fns.items()}
    seconds = median_seconds(fns, args.reps)
    base = seconds["baseline float32"]
    print(f"\n{queries} quer{'y' if queries == 1 else 'ies'} per class ({variant} conv4), "
          f"meta-batch {args.meta_batch}, median of {args.reps}")
    print(f"{'variant':<30} {'s/step':>7} {'vs fp32':>8} {'vs base':>8} {'grad err':>9}")
    for name, sec in seconds.items():
        fp32 = name.replace("bf16 autocast", "float32").replace("bf16", "float32")
        speedup = seconds[fp32] / sec
        print(f"{name:<30} {sec:7.3f} {speedup:7.2f}x {base / sec:7.2f}x {errors[name]:9.2e}")
        print(json.dumps({"queries": queries, "variant": name, "seconds": round(sec, 4),
                          "speedup_vs_float32": round(speedup, 3),
                          "speedup_vs_baseline_float32": round(base / sec, 3),
                          "grad_rel_error_vs_float64": round(errors[name], 5)}))


CASTS = ("aten::_to_copy", "aten::copy_", "aten::to", "aten::empty_strided")


def profile_casts() -> None:
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(1)
    model = conv4(5, variant="pool")
    params, state = model.init(random.key(0))
    tasks = make_tasks(15, 8, torch.float32)
    learner = maml(bind(model, state, train=True), inner_steps=1, inner_lr=0.4)
    for precision in ("float32", "bf16"):
        mean_task_grads(learner.task_grad, params, tasks, strategy="loop", precision=precision)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            mean_task_grads(learner.task_grad, params, tasks, strategy="loop",
                            precision=precision)
        events = prof.key_averages()
        total = sum(e.self_cpu_time_total for e in events) / 1e3
        casts = sum(e.self_cpu_time_total for e in events if e.key in CASTS) / 1e3
        top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:5]
        print(f"{precision:>8}: {total:7.0f} ms, casts and copies {casts:5.0f} ms "
              f"({100 * casts / total:.1f}%)")
        print(json.dumps({"profile": precision, "total_ms": round(total, 1),
                          "cast_ms": round(casts, 1), "cast_share": round(casts / total, 4),
                          "top": {e.key: round(e.self_cpu_time_total / 1e3, 1) for e in top}}))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queries", default="1,15", help="query settings, comma-separated")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--meta-batch", type=int, default=32)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--profile", action="store_true",
                        help="profile one step per precision instead of timing")
    args = parser.parse_args(argv)
    if args.profile:
        profile_casts()
        return
    native, why = bf16_native("cpu")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); bfloat16 native: "
          f"{native} ({why})")
    print(json.dumps({"bf16_native": native, "why": why,
                      "threads": torch.get_num_threads()}))
    for queries in (int(q) for q in args.queries.split(",")):
        run_shape(queries, args)


if __name__ == "__main__":
    from records import recorded  # benchmarks/records.py: --record appends a record

    recorded("precision_speed")(main)()
