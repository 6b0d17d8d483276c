"""Batch norm's variance over (batch, H, W): ``x.var(unbiased=False)`` against the two-pass
``(x - mean).square().mean()`` that ``funcgraph.nn.batch_norm`` uses inside transforms.

The same value (checked in float64 below); the question is the CPU time on the small maps of
a DARTS supernet (docs/darts.md) and of conv4 (docs/meta-learning.md). Each case is timed
forward, forward+backward (``torch.autograd.grad`` of the variance's sum) and under
``torch.func.grad`` (as inside the DARTS search step and MAML's vmap), interleaved over
``--rounds`` rounds; the medians of the process's CPU time per call are printed, with the
ratio ``x.var / two-pass``.

    OMP_NUM_THREADS=1 python benchmarks/batch_norm_variance.py [--rounds 7] [--calls 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
from torch import Tensor

DIMS = (0, 2, 3)
SHAPES = [(32, 48, 16, 16), (32, 16, 16, 16), (32, 32, 8, 8), (32, 64, 4, 4), (80, 64, 14, 14)]


def var_builtin(x: Tensor) -> Tensor:
    return x.var(dim=DIMS, unbiased=False)


def var_two_pass(x: Tensor) -> Tensor:
    mean = x.mean(dim=DIMS, keepdim=True)
    return (x - mean).square().mean(dim=DIMS)


def per_call(fn: Callable[[], object], calls: int) -> float:
    start = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - start) / calls


def time_shape(shape: tuple[int, ...], rounds: int, calls: int) -> None:
    x64 = torch.randn(shape, dtype=torch.float64)
    torch.testing.assert_close(var_builtin(x64), var_two_pass(x64), rtol=1e-12, atol=0)
    x = torch.randn(shape)
    xg = x.clone().requires_grad_()
    g_builtin = torch.func.grad(lambda t: var_builtin(t).sum())
    g_two_pass = torch.func.grad(lambda t: var_two_pass(t).sum())
    cases = {
        "forward": (lambda: var_builtin(x), lambda: var_two_pass(x)),
        "forward+backward": (lambda: torch.autograd.grad(var_builtin(xg).sum(), xg),
                             lambda: torch.autograd.grad(var_two_pass(xg).sum(), xg)),
        "torch.func.grad": (lambda: g_builtin(x), lambda: g_two_pass(x)),
    }
    for mode, (a, b) in cases.items():
        a(), b()  # warm-up
        ta, tb = [], []
        for _ in range(rounds):
            ta.append(per_call(a, calls))
            tb.append(per_call(b, calls))
        ma, mb = statistics.median(ta), statistics.median(tb)
        print(f"{str(shape):>18}  {mode:>16}  {ma * 1e6:10.1f}  {mb * 1e6:13.1f}  "
              f"{ma / mb:5.2f}x")
        print(json.dumps({"shape": list(shape), "mode": mode, "x.var_us": ma * 1e6,
                          "two_pass_us": mb * 1e6, "ratio": ma / mb}))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), CPU time per call")
    print(f"{'shape':>18}  {'mode':>16}  {'x.var (us)':>10}  {'two-pass (us)':>13}  ratio")
    for shape in SHAPES:
        time_shape(shape, args.rounds, args.calls)


if __name__ == "__main__":
    from records import recorded  # benchmarks/records.py: --record appends a record

    recorded("batch_norm_variance")(main)()
