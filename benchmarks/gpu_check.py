"""Check placement, tracing and export on real CUDA devices, and say exactly what was verified.

Needs a machine with CUDA. With two or more GPUs the plan splits a ResNet over ``cuda:0`` and
``cuda:1``; with one GPU the first stages stay on the CPU and the rest go to ``cuda:0``, so
activations still cross a real device boundary. Checks, each printed as ``VERIFIED`` or
``FAILED``:

1. ``resolve_device``: ``auto`` is CUDA, every ``cuda:N`` resolves, ``cuda:<count>`` is a
   DeviceError.
2. ``place``: every parameter and state tensor sits on its planned device.
3. ``placed``: the output is on the last stage's device and equals the single-device CPU run;
   with ``--micro-batches`` too.
4. Gradients through ``torch.func.grad``: each on its parameter's device, equal to CPU.
5. ``trace`` records CUDA ops; ``finite_check`` catches a NaN born on the GPU.
6. ``export`` of CUDA params: the reloaded program equals the eager model.
7. Timing (wall clock, CUDA synchronised, median of ``--rounds``): single device vs placed vs
   placed with micro-batches, ratios to the single-device run measured in the same run.

Run: python benchmarks/gpu_check.py [--batch 64] [--micro-batches 4] [--rounds 20]
     python benchmarks/gpu_check.py --cpu-dry-run   # exercise the script logic on CPU only
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import funcgraph
from funcgraph import random
from funcgraph.debug import NonFiniteError, finite_check, trace
from funcgraph.errors import DeviceError
from funcgraph.export import export
from funcgraph.models.resnet import resnet
from funcgraph.placement import PlacementPlan, place, placed, resolve_device

RESULTS: list[dict[str, Any]] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    RESULTS.append({"check": name, "ok": ok, "detail": detail})
    print(f"{'VERIFIED' if ok else 'FAILED  '} {name}{': ' + detail if detail else ''}")


def close(a: torch.Tensor, b: torch.Tensor, tol: float) -> tuple[bool, float]:
    err = (a.detach().cpu() - b.detach().cpu()).abs().max().item()
    return err <= tol * (1 + b.abs().max().item()), err


def median_time(fn: Callable[[], Any], rounds: int, cuda: bool) -> float:
    times = []
    for _ in range(rounds):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def stage_devices(dry_run: bool) -> tuple[torch.device, torch.device]:
    if dry_run:
        return torch.device("cpu"), torch.device("cpu")
    n = torch.cuda.device_count()
    return (torch.device("cuda", 0), torch.device("cuda", 1)) if n >= 2 else (
        torch.device("cpu"), torch.device("cuda", 0))


def check_resolve() -> None:
    auto = resolve_device("auto")
    check("resolve_device('auto') is CUDA", auto.type == "cuda", str(auto))
    n = torch.cuda.device_count()
    ok = all(resolve_device(f"cuda:{i}") == torch.device("cuda", i) for i in range(n))
    check(f"resolve_device('cuda:N') for N < {n}", ok)
    try:
        resolve_device(f"cuda:{n}")
        check(f"resolve_device('cuda:{n}') raises DeviceError", False, "no error")
    except DeviceError as e:
        check(f"resolve_device('cuda:{n}') raises DeviceError", True, str(e))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="run every check with CPU stages (verifies nothing about CUDA)")
    args = parser.parse_args(argv)
    dry = args.cpu_dry_run
    if not dry and not torch.cuda.is_available():
        print("no CUDA device visible to torch: nothing verified (use a GPU machine, or "
              "--cpu-dry-run to exercise the script)")
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False  # compare against CPU at float32 precision
    torch.backends.cudnn.allow_tf32 = False
    print(f"torch {torch.__version__}, CUDA devices: {torch.cuda.device_count()}"
          + (" (CPU dry run: CUDA is not being checked)" if dry else ""))
    if not dry:
        check_resolve()

    first, last = stage_devices(dry)
    model = resnet(20, num_classes=10, in_channels=3, width=16)
    params, state = model.init(random.key(0))
    x = random.normal(random.key(1), (args.batch, 3, 32, 32))
    plan = PlacementPlan((("conv1", first), ("bn1", first), ("layer1", first),
                          ("layer2", last)), default=last)
    print(f"plan: conv1, bn1, layer1 -> {first}; layer2, layer3, fc -> {last}")

    p, s = place(params, plan), place(state, plan, partial=True)
    wrong = [n for n, t in {**p, **s}.items() if t.device != plan.device_of(n)]
    check("place: every tensor on its planned device", not wrong, f"{len(p) + len(s)} tensors")

    ref_f = funcgraph.bind(model, state)
    ref = ref_f(params, x)
    f = funcgraph.bind(model, s)
    for m in (1, args.micro_batches):
        y = placed(f, plan, micro_batches=m)(p, x)
        ok, err = close(y, ref, 1e-4)
        check(f"placed (micro_batches={m}) output on {last} equals CPU run",
              ok and y.device == last, f"max |diff| {err:.2e}, device {y.device}")

    def loss(run: Callable[..., torch.Tensor], params: dict[str, torch.Tensor]) -> torch.Tensor:
        return run(params, x).square().mean()

    grads = torch.func.grad(lambda q: loss(placed(f, plan), q))(p)
    ref_grads = torch.func.grad(lambda q: loss(ref_f, q))(params)
    on_device = all(grads[n].device == plan.device_of(n) for n in grads)
    worst = max(close(grads[n], ref_grads[n], 1e-3)[1] for n in grads)
    ok = all(close(grads[n], ref_grads[n], 1e-3)[0] for n in grads)
    check("gradients on their parameters' devices", on_device, f"{len(grads)} tensors")
    check("gradients equal the CPU run", ok, f"max |diff| {worst:.2e}")

    dev = last
    t = trace(lambda a: torch.relu(a @ a))(torch.ones(8, 8, device=dev))
    check(f"trace records ops on {dev}", all(r.device == dev for r in t.ops), str(t.names()))
    try:
        with finite_check():
            torch.log(-torch.ones(4, device=dev))
        check(f"finite_check catches a NaN on {dev}", False, "no error")
    except NonFiniteError as e:
        check(f"finite_check catches a NaN on {dev}", e.record.device == dev, e.record.op)

    dp, ds = funcgraph.params.to(params, dev), funcgraph.params.to(state, dev)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "resnet.pt2"
        export(model, dp, ds, x[:4].to(dev), path=path)
        reloaded = torch.export.load(str(path)).module()
        ok, err = close(reloaded(x[:8].to(dev)), model.apply(dp, ds, x[:8].to(dev))[0], 1e-5)
        check(f"export on {dev}: reloaded program equals eager (batch 8, traced with 4)", ok,
              f"max |diff| {err:.2e}")

    cuda = not dry
    single = funcgraph.params.to(params, last), funcgraph.params.to(state, last)
    single_f = funcgraph.bind(model, single[1])
    xs = x.to(first)
    with torch.no_grad():
        base = median_time(lambda: single_f(single[0], x.to(last)), args.rounds, cuda)
        two = median_time(lambda: placed(f, plan)(p, xs), args.rounds, cuda)
        micro = median_time(lambda: placed(f, plan, micro_batches=args.micro_batches)(p, xs),
                            args.rounds, cuda)
    rows = [("single device", base), ("placed", two),
            (f"placed, {args.micro_batches} micro", micro)]
    print(f"\nforward, batch {args.batch}, median of {args.rounds} (wall clock):")
    for name, sec in rows:
        print(f"  {name:<24} {sec * 1e3:9.3f} ms   x{sec / base:5.2f} of single device")
        print(json.dumps({"variant": name, "median_s": sec, "ratio": sec / base}))
    failed = [r for r in RESULTS if not r["ok"]]
    print(f"\n{len(RESULTS) - len(failed)} checks verified, {len(failed)} failed"
          + (" (CPU dry run: nothing about CUDA was verified)" if dry else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    from records import recorded  # benchmarks/records.py: --record appends a record

    sys.exit(recorded("gpu_check")(main)())
