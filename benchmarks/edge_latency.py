"""Inference latency of the shipped models: eager against the exported program and against
the AOTInductor-compiled one, at batch 1 (the edge) and a batch of 64.

The early-exit CNN (width 32, 100 classes, 28 px) is timed by exit rate (its threshold at
quantiles of the continue probability): at batch 1 the eager model against its per-sample
program (``funcgraph.nn.per_sample_exits``, each exit a ``torch.cond``) run eagerly, exported
(``torch.export``, run through ``ExportedProgram.module()``) and compiled ahead of time
(``torch._inductor.aoti_compile_and_package``); at batch 64 the eager model (continuing rows
gathered) against the masked program (``masked_exits``: every row through every block)
exported and compiled. Then the other shipped models with per-sample outputs, the MLP and the
stochastic-depth ResNet in evaluation, eager against exported and compiled. Each figure is the
median wall time per call over ``--reps`` interleaved rounds (after a warm-up), one thread.

    python benchmarks/edge_latency.py [--reps 50] [--no-aoti] [--record]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from funcgraph import Model, random
from funcgraph.export import export
from funcgraph.models import early_exit_cnn, mlp, resnet
from funcgraph.nn import masked_exits, per_sample_exits, with_threshold


def median_ms(fns: dict[str, Callable[[], Any]], reps: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in fns}
    with torch.no_grad():
        for fn in fns.values():
            fn()
        for _ in range(reps):
            for name, fn in fns.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}


def compiled(program: torch.export.ExportedProgram, folder: Path, name: str
             ) -> Callable[..., Any] | None:
    """The AOTInductor-compiled program, or ``None`` where it does not compile here."""
    try:
        path = torch._inductor.aoti_compile_and_package(program,
                                                        package_path=str(folder / f"{name}.pt2"))
        return torch._inductor.aoti_load_package(path)  # type: ignore[no-any-return]
    except Exception as e:  # a missing compiler, an unsupported op: reported, not fatal
        print(f"# {name}: AOTInductor failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
        return None


def report(model: str, case: str, batch: int, ms: dict[str, float], extra: dict[str, Any]
           ) -> None:
    base = ms["eager"]
    cells = "  ".join(f"{k} {v:7.3f} ms ({base / v:4.2f}x)" for k, v in ms.items())
    print(f"{model:<12} {case:<14} batch {batch:>3}  {cells}")
    print(json.dumps({"model": model, "case": case, "batch": batch, **extra,
                      **{f"{k}_ms": round(v, 4) for k, v in ms.items()},
                      **{f"{k}_speedup": round(base / v, 3) for k, v in ms.items()}}))


def variants(model: Model, eager: Model, params: Any, state: Any, x: torch.Tensor,
             dynamic: bool, folder: Path, name: str, aoti: bool) -> dict[str, Callable[[], Any]]:
    fns: dict[str, Callable[[], Any]] = {
        "eager": lambda: eager.apply(params, state, x)[0]}
    if model is not eager:
        fns["eager program"] = lambda: model.apply(params, state, x)[0]
    program = export(model, params, state, x, dynamic_batch=dynamic)
    module = program.module()
    fns["exported"] = lambda: module(x)
    if aoti:
        runner = compiled(program, folder, name)
        if runner is not None:
            fns["aoti"] = lambda: runner(x)
    return fns


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--rates", default="0,0.5,1", help="exit rates, comma-separated")
    parser.add_argument("--no-aoti", action="store_true", help="skip AOTInductor")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    aoti = not args.no_aoti
    print(f"torch {torch.__version__}, 1 thread, median wall ms of {args.reps} rounds")
    folder = Path(tempfile.mkdtemp(prefix="edge_latency_"))
    net = early_exit_cnn(num_classes=100, width=32)
    params, state = net.init(random.key(0))
    many = random.uniform(random.key(1), (64, 1, 28, 28))
    with torch.no_grad():
        p = net.apply(params, state, many)[0].continue_prob
    for rate in (float(r) for r in args.rates.split(",")):
        # exits when p <= threshold: the quantile `rate` of p exits that share of samples
        at = float(torch.quantile(p, rate)) if 0 < rate < 1 else (1.0 if rate >= 1 else 0.0)
        model = with_threshold(net, at)
        with torch.no_grad():
            exited = float(model.apply(params, state, many)[0].exited.float().mean())
        one = many[:1] if rate in (0.0, 1.0) else many[int((p <= at).nonzero()[0])][None]
        tag = f"exit {exited:.2f}"
        fns = variants(per_sample_exits(model), model, params, state, one, False, folder,
                       f"ee1-{rate}", aoti)
        report("early_exit", tag, 1, median_ms(fns, args.reps), {"exit_rate": exited})
        fns = variants(masked_exits(model), model, params, state, many, True, folder,
                       f"ee64-{rate}", aoti)
        report("early_exit", tag, 64, median_ms(fns, args.reps), {"exit_rate": exited})
    others: dict[str, tuple[Model, tuple[int, ...]]] = {
        "mlp": (mlp(784, 10, hidden=(256, 256)), (784,)),
        "resnet": (resnet(num_classes=10, depth=20), (3, 32, 32)),
    }
    for name, (model, shape) in others.items():
        params, state = model.init(random.key(0))
        for batch in (1, 64):
            x = random.uniform(random.key(2), (batch, *shape))
            fns = variants(model, model, params, state, x, batch > 1, folder, f"{name}{batch}",
                           aoti)
            report(name, "-", batch, median_ms(fns, args.reps), {})


if __name__ == "__main__":
    from records import recorded  # benchmarks/records.py: --record appends a record

    recorded("edge_latency")(main)()
