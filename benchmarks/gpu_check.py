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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import funcgraph
from funcgraph import random
from funcgraph.debug import NonFiniteError, finite_check, trace
from funcgraph.errors import DeviceError
from funcgraph.export import export
from funcgraph.model import Model
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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="run every check with CPU stages (verifies nothing about CUDA)")
    return parser.parse_args(argv)


@dataclass(frozen=True)
class Split:
    """The ResNet split over two devices: conv1, bn1 and layer1 on ``first``, the rest on
    ``last``.

    Attributes:
        plan: the placement plan.
        first: the first stages' device.
        last: the last stages' device (the output's).
        params: the params, each on its planned device.
        state: the state, likewise.
        forward: the model bound to the placed state (run it under ``placed``).
    """

    plan: PlacementPlan
    first: torch.device
    last: torch.device
    params: dict[str, torch.Tensor]
    state: dict[str, torch.Tensor]
    forward: Callable[..., torch.Tensor]


def check_place(model: Model, params: dict[str, torch.Tensor], state: dict[str, torch.Tensor],
                dry: bool) -> Split:
    """Plan the split (printed), place params and state, and check that every tensor sits on
    its planned device."""
    first, last = stage_devices(dry)
    plan = PlacementPlan((("conv1", first), ("bn1", first), ("layer1", first),
                          ("layer2", last)), default=last)
    print(f"plan: conv1, bn1, layer1 -> {first}; layer2, layer3, fc -> {last}")
    on_plan, state_on_plan = place(params, plan), place(state, plan, partial=True)
    wrong = [n for n, t in {**on_plan, **state_on_plan}.items() if t.device != plan.device_of(n)]
    check("place: every tensor on its planned device", not wrong,
          f"{len(on_plan) + len(state_on_plan)} tensors")
    return Split(plan, first, last, on_plan, state_on_plan, funcgraph.bind(model, state_on_plan))


def check_placed(split: Split, ref: torch.Tensor, x: torch.Tensor, micro_batches: int) -> None:
    """The placed forward, whole and in ``micro_batches``: its output on the last device and
    equal to the single-device CPU run ``ref``."""
    for m in (1, micro_batches):
        y = placed(split.forward, split.plan, micro_batches=m)(split.params, x)
        ok, err = close(y, ref, 1e-4)
        check(f"placed (micro_batches={m}) output on {split.last} equals CPU run",
              ok and y.device == split.last, f"max |diff| {err:.2e}, device {y.device}")


def check_gradients(split: Split, ref_forward: Callable[..., torch.Tensor],
                    params: dict[str, torch.Tensor], x: torch.Tensor) -> None:
    """Gradients through ``torch.func.grad`` of the placed forward: each on its parameter's
    device and equal to the CPU run's."""

    def loss(run: Callable[..., torch.Tensor], params: dict[str, torch.Tensor]) -> torch.Tensor:
        """A scalar of the output: its mean square."""
        return run(params, x).square().mean()

    grads = torch.func.grad(lambda q: loss(placed(split.forward, split.plan), q))(split.params)
    ref_grads = torch.func.grad(lambda q: loss(ref_forward, q))(params)
    on_device = all(grads[n].device == split.plan.device_of(n) for n in grads)
    worst = max(close(grads[n], ref_grads[n], 1e-3)[1] for n in grads)
    ok = all(close(grads[n], ref_grads[n], 1e-3)[0] for n in grads)
    check("gradients on their parameters' devices", on_device, f"{len(grads)} tensors")
    check("gradients equal the CPU run", ok, f"max |diff| {worst:.2e}")


def check_debug_tools(dev: torch.device) -> None:
    """``trace`` records ops on ``dev``; ``finite_check`` catches a NaN born there."""
    traced = trace(lambda a: torch.relu(a @ a))(torch.ones(8, 8, device=dev))
    check(f"trace records ops on {dev}", all(r.device == dev for r in traced.ops),
          str(traced.names()))
    try:
        with finite_check():
            torch.log(-torch.ones(4, device=dev))
        check(f"finite_check catches a NaN on {dev}", False, "no error")
    except NonFiniteError as e:
        check(f"finite_check catches a NaN on {dev}", e.record.device == dev, e.record.op)


def check_export(model: Model, params: dict[str, torch.Tensor], state: dict[str, torch.Tensor],
                 x: torch.Tensor, dev: torch.device) -> None:
    """``export`` of the params moved to ``dev``, traced with batch 4: the reloaded program
    on batch 8 equals the eager model."""
    dev_params, dev_state = funcgraph.params.to(params, dev), funcgraph.params.to(state, dev)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "resnet.pt2"
        export(model, dev_params, dev_state, x[:4].to(dev), path=path)
        reloaded = torch.export.load(str(path)).module()
        ok, err = close(reloaded(x[:8].to(dev)),
                        model.apply(dev_params, dev_state, x[:8].to(dev))[0], 1e-5)
        check(f"export on {dev}: reloaded program equals eager (batch 8, traced with 4)", ok,
              f"max |diff| {err:.2e}")


def forward_times(model: Model, params: dict[str, torch.Tensor], state: dict[str, torch.Tensor],
                  split: Split, x: torch.Tensor, args: argparse.Namespace, cuda: bool
                  ) -> list[tuple[str, float]]:
    """Median forward seconds, no grad: the whole model on the last device, placed, and
    placed with ``--micro-batches``."""
    single_params = funcgraph.params.to(params, split.last)
    single_forward = funcgraph.bind(model, funcgraph.params.to(state, split.last))
    xs = x.to(split.first)
    with torch.no_grad():
        base = median_time(lambda: single_forward(single_params, x.to(split.last)), args.rounds,
                           cuda)
        whole = median_time(lambda: placed(split.forward, split.plan)(split.params, xs),
                            args.rounds, cuda)
        micro = median_time(lambda: placed(split.forward, split.plan,
                                           micro_batches=args.micro_batches)(split.params, xs),
                            args.rounds, cuda)
    return [("single device", base), ("placed", whole),
            (f"placed, {args.micro_batches} micro", micro)]


def print_times(rows: list[tuple[str, float]], args: argparse.Namespace) -> None:
    """Each row's time and its ratio to the single-device run (the first row), with its
    JSON line."""
    base = rows[0][1]
    print(f"\nforward, batch {args.batch}, median of {args.rounds} (wall clock):")
    for name, sec in rows:
        print(f"  {name:<24} {sec * 1e3:9.3f} ms   x{sec / base:5.2f} of single device")
        print(json.dumps({"variant": name, "median_s": sec, "ratio": sec / base}))


def main(argv: list[str] | None = None) -> int:
    """Run every check (CUDA's own only on CUDA), then the timing; exit 1 when a check
    failed or no CUDA device is visible without ``--cpu-dry-run``."""
    args = parse_args(argv)
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

    model = resnet(20, num_classes=10, in_channels=3, width=16)
    params, state = model.init(random.key(0))
    x = random.normal(random.key(1), (args.batch, 3, 32, 32))
    split = check_place(model, params, state, dry)
    ref_forward = funcgraph.bind(model, state)
    check_placed(split, ref_forward(params, x), x, args.micro_batches)
    check_gradients(split, ref_forward, params, x)
    check_debug_tools(split.last)
    check_export(model, params, state, x, split.last)
    print_times(forward_times(model, params, state, split, x, args, cuda=not dry), args)
    failed = [r for r in RESULTS if not r["ok"]]
    print(f"\n{len(RESULTS) - len(failed)} checks verified, {len(failed)} failed"
          + (" (CPU dry run: nothing about CUDA was verified)" if dry else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    from records import recorded  # benchmarks/records.py: --record appends a record

    sys.exit(recorded("gpu_check")(main)())
