"""What do pure functions cost? funcgraph models against the equivalent ``nn.Module``.

For an MLP, a conv4 (both built with ``funcgraph.nn.serial``), conv4's first batch norm
alone (``bn``) and a one-layer LSTM (``funcgraph.nn.lstm``), each timed against the
``nn.Module`` with the same parameter names:

* ``forward``: evaluation-mode forward;
* ``forward+backward``: training-mode forward, then the gradient of a scalar loss w.r.t. every
  parameter.

Variants: ``module`` (eager ``nn.Module``, the baseline of every ratio), ``funcgraph``
(``model.apply`` eager; gradients by ``torch.autograd.grad``, exactly like the module), and
for forward+backward ``funcgraph func.grad`` (``torch.func.grad`` of the pure loss, the way
funcgraph's algorithms take gradients), then ``torch.compile`` and ``torch.export`` of both
sides (``module compile``, ``funcgraph compile``, ``module export``, ``funcgraph export``).

Before timing, every funcgraph model is checked against its module with
``funcgraph.testing.assert_matches_module`` (outputs, running statistics and gradients).
Timings are interleaved: each round times every variant once (order rotated per round;
each sample repeats its call for about ``--sample-ms``), so load
changes on a shared machine hit all variants alike; the table reports the median over
``--rounds`` rounds and the ratio to ``module`` measured in the same
run. One thread by default (``--threads``), timed by the process's CPU time
(``time.process_time``), which a busy shared machine does not inflate with time spent waiting
to be scheduled; ``--clock wall`` times wall-clock instead.

Example (prints a table, then one JSON line per row)::

    python benchmarks/overhead.py                        # everything, about 5 min on 1 core
    python benchmarks/overhead.py --models mlp,bn --no-compile --no-export --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

import funcgraph as fg
from funcgraph import random
from funcgraph.params import Params, State
from funcgraph.testing import assert_matches_module


@dataclass
class Case:
    """One model in both worlds, with an input and a scalar loss of the output."""

    name: str
    model: fg.Model
    module: nn.Module
    x: Any
    loss: Callable[[Any], Tensor]


def mlp_case(batch: int) -> Case:
    model = fg.nn.serial(fg.nn.linear(64, 256), fg.nn.relu(), fg.nn.linear(256, 256),
                         fg.nn.relu(), fg.nn.linear(256, 10))
    module = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                           nn.Linear(256, 10))
    x = random.normal(random.key(1), (batch, 64))
    return Case("mlp", model, module, x, lambda y: y.square().mean())


def conv4_case(batch: int, *, norm: bool = True) -> Case:
    """The MAML conv4 (pool variant) on 28x28 images: 4 x [conv3x3(64), BN, ReLU, maxpool2].

    ``norm=False`` (the ``conv4-nobn`` case) drops the batch norms, to separate their cost
    from that of everything else.
    """

    def block(c_in: int) -> fg.Model:
        layers = {"conv": fg.nn.conv2d(c_in, 64, 3, padding=1)}
        layers.update({"norm": fg.nn.batch_norm(64)} if norm else {})
        return fg.nn.serial({**layers, "relu": fg.nn.relu(), "pool": fg.nn.max_pool2d(2)})

    def module_block(c_in: int) -> nn.Module:
        layers: OrderedDict[str, nn.Module] = OrderedDict(conv=nn.Conv2d(c_in, 64, 3, padding=1))
        layers.update({"norm": nn.BatchNorm2d(64)} if norm else {})
        layers.update(relu=nn.ReLU(), pool=nn.MaxPool2d(2))
        return nn.Sequential(layers)

    model = fg.nn.serial(block(1), block(64), block(64), block(64), fg.nn.flatten(),
                         fg.nn.linear(64, 5))
    module = nn.Sequential(module_block(1), module_block(64), module_block(64), module_block(64),
                           nn.Flatten(), nn.Linear(64, 5))
    x = random.normal(random.key(2), (batch, 1, 28, 28))
    return Case("conv4" if norm else "conv4-nobn", model, module, x,
                lambda y: y.square().mean())


def bn_case(batch: int) -> Case:
    """conv4's first batch norm alone, (B, 64, 28, 28): isolates the cost of funcgraph's
    mean/var batch norm against the fused native kernel of ``nn.BatchNorm2d``."""
    x = random.normal(random.key(4), (batch, 64, 28, 28))
    return Case("bn", fg.nn.batch_norm(64), nn.BatchNorm2d(64), x, lambda y: y.square().mean())


class _LSTMOutput(nn.Module):
    """``nn.LSTM`` returning only the output sequence; takes ``(inputs, lengths=None)``."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(16, 32, batch_first=True)

    def forward(self, x: tuple[Tensor, None]) -> Tensor:
        return self.lstm(x[0])[0]


def lstm_case(batch: int) -> Case:
    model = fg.nn.composite("lstm_out", {"lstm": fg.nn.lstm(16, 32)},
                            lambda run, x: run("lstm", x)[0])  # the output sequence
    x = (random.normal(random.key(3), (batch, 20, 16)), None)
    return Case("lstm", model, _LSTMOutput(), x, lambda y: y.square().mean())


class _Pure(nn.Module):
    """A funcgraph Model as an ``nn.Module`` taking ``(params, state, x)`` as inputs, so
    ``torch.export`` keeps the params as inputs and gradients can flow to them."""

    def __init__(self, model: fg.Model, train: bool) -> None:
        super().__init__()
        self.model = model
        self.train_mode = train

    def forward(self, params: Params, state: State, x: Any) -> Any:
        return self.model.apply(params, state, x, train=self.train_mode)[0]


Timed = Callable[[], Any]


def variants(case: Case, mode: str, *, compile_: bool, export: bool) -> dict[str, Timed]:
    """The callables to time for one case and mode; each runs one step."""
    train = mode == "forward+backward"
    params, state = case.model.init(random.key(0))
    module = case.module.train(train)
    module.load_state_dict({**params, **state})
    leaf = {n: p.detach().requires_grad_() for n, p in params.items()}
    ours: list[Tensor] = list(leaf.values())
    theirs: list[Tensor] = list(module.parameters())

    def pure(p: Params, x: Any) -> Any:
        return case.model.apply(p, state, x, train=train)[0]

    # name -> (forward call, the tensors its gradient is taken w.r.t.)
    calls: dict[str, tuple[Callable[[], Any], list[Tensor]]] = {
        "module": (lambda: module(case.x), theirs),
        "funcgraph": (lambda: pure(leaf, case.x), ours),
    }
    if compile_:
        compiled_module = torch.compile(module)
        compiled_pure = torch.compile(pure)
        calls["module compile"] = (lambda: compiled_module(case.x), theirs)
        calls["funcgraph compile"] = (lambda: compiled_pure(leaf, case.x), ours)
    if export:
        exported_module = torch.export.export(module, (case.x,)).module()
        exported_pure = torch.export.export(_Pure(case.model, train), (leaf, state, case.x))
        runnable = exported_pure.module()
        calls["module export"] = (lambda: exported_module(case.x),
                                  list(exported_module.parameters()))
        calls["funcgraph export"] = (lambda: runnable(leaf, state, case.x), ours)
    if not train:
        return {name: _no_grad(f) for name, (f, _) in calls.items()}
    timed = {name: _with_grad(case.loss, f, wrt) for name, (f, wrt) in calls.items()}
    timed["funcgraph func.grad"] = lambda: torch.func.grad(
        lambda p: case.loss(pure(p, case.x)))(params)
    return timed


def _with_grad(loss: Callable[[Any], Tensor], f: Callable[[], Any], wrt: list[Tensor]) -> Timed:
    return lambda: torch.autograd.grad(loss(f()), wrt)


def _no_grad(f: Callable[[], Any]) -> Timed:
    def run() -> Any:
        with torch.no_grad():
            return f()

    return run


def time_interleaved(
    calls: dict[str, Timed], rounds: int, sample_s: float, clock: Callable[[], float]
) -> dict[str, list[float]]:
    """Seconds per call, one sample per variant per round, variant order rotated per round.

    Each sample repeats its call enough times to last about ``sample_s`` (calibrated on the
    warm-up), so fast and slow variants are measured with the same timer resolution.
    """
    iters = {}
    for name, f in calls.items():  # warm-up: compilation, allocator, lazy init; calibration
        for _ in range(2):
            f()
        start = clock()
        f()
        iters[name] = max(1, round(sample_s / max(clock() - start, 1e-6)))
    names = list(calls)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            start = clock()
            for _ in range(iters[name]):
                calls[name]()
            samples[name].append((clock() - start) / iters[name])
    return samples


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,conv4,bn,lstm",
                        help="comma-separated subset of mlp, conv4, conv4-nobn, bn, lstm")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--sample-ms", type=float, default=20.0,
                        help="length of one timing sample (calls are repeated to fill it)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="cpu: the process's CPU time (robust on a shared machine); wall")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile variants")
    parser.add_argument("--no-export", action="store_true", help="skip torch.export variants")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    builders: dict[str, Callable[[int], Case]] = {
        "mlp": mlp_case, "conv4": conv4_case, "conv4-nobn": lambda b: conv4_case(b, norm=False),
        "bn": bn_case, "lstm": lstm_case,
    }
    rows = []
    for name in args.models.split(","):
        case = builders[name](args.batch)
        assert_matches_module(case.model, case.module, case.x, train=True)
        for mode in ("forward", "forward+backward"):
            calls = variants(case, mode, compile_=not args.no_compile, export=not args.no_export)
            samples = time_interleaved(calls, args.rounds, args.sample_ms / 1e3, clock)
            base = statistics.median(samples["module"])
            for variant, s in samples.items():
                med = statistics.median(s)
                q1, _, q3 = statistics.quantiles(s, n=4) if len(s) > 1 else (med, med, med)
                rows.append({"bench": "overhead", "model": name, "mode": mode,
                             "variant": variant, "median_ms": round(med * 1e3, 4),
                             "iqr_ms": round((q3 - q1) * 1e3, 4),
                             "ratio_vs_module": round(med / base, 3), "batch": args.batch,
                             "rounds": args.rounds, "sample_ms": args.sample_ms,
                             "threads": args.threads, "clock": args.clock,
                             "torch": torch.__version__})
    print(f"{'model':<10} {'mode':<17} {'variant':<20} {'median ms':>10} {'IQR ms':>8} "
          f"{'vs module':>9}")
    for r in rows:
        print(f"{r['model']:<10} {r['mode']:<17} {r['variant']:<20} {r['median_ms']:>10.3f} "
              f"{r['iqr_ms']:>8.3f} {r['ratio_vs_module']:>8.2f}x")
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    from records import recorded  # benchmarks/records.py: --record appends a record

    recorded("overhead")(main)()
