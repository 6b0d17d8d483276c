"""Early-exit CNN: inference time against exit rate, versus running every sample to the end.

The decision threshold is set to quantiles of the batch's continue-probabilities, so a chosen
fraction of samples exits after the first block; exiting samples are gathered out of the second
block (``index_select``/``index_copy``). The baseline is the same model and batch with every
sample continuing (threshold 0). Thresholds are interleaved round-robin; each figure is the
median over ``--reps`` of process CPU time (robust when other jobs share the cores).

Run::

    python benchmarks/early_exit.py --batch-size 256 --reps 15
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from funcgraph import random
from funcgraph.models.early_exit import early_exit_cnn


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--image-size", type=int, default=28)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    x = random.uniform(random.key(1), (args.batch_size, 1, args.image_size, args.image_size))
    probe = early_exit_cnn(num_classes=100, width=args.width)
    params, state = probe.init(random.key(0))
    with torch.no_grad():
        p = probe.apply(params, state, x)[0].continue_prob
    targets = [0.0, 0.25, 0.5, 0.75, 0.9, 1.0]
    models = {r: early_exit_cnn(num_classes=100, width=args.width,
                                threshold=0.0 if r == 0 else float(torch.quantile(p, r)))
              for r in targets}
    times: dict[float, list[float]] = {r: [] for r in targets}
    rates: dict[float, float] = {}
    with torch.no_grad():
        for rep in range(args.reps + 1):
            for r, model in models.items():
                start = time.process_time()
                out, _ = model.apply(params, state, x)
                elapsed = time.process_time() - start
                rates[r] = float(out.exited.float().mean())
                if rep > 0:  # the first round is warm-up
                    times[r].append(elapsed)
    base = statistics.median(times[0.0])
    print(f"early-exit CNN, width {args.width}, batch {args.batch_size}, {args.image_size}px, "
          f"{args.threads} thread(s), median CPU of {args.reps} reps")
    print(f"{'exit rate':>10}{'ms/batch':>10}{'speed-up':>10}{'ideal':>8}")
    for r in targets:
        t = statistics.median(times[r])
        share = 1.0 - statistics.median(times[1.0]) / base  # the second block's share
        ideal = 1.0 / (1.0 - rates[r] * share)
        print(f"{rates[r]:>10.2f}{1e3 * t:>10.1f}{base / t:>10.2f}{ideal:>8.2f}")
        print(json.dumps({"benchmark": "early_exit", "exit_rate": rates[r], "ms": 1e3 * t,
                          "speedup": base / t, "ideal_speedup": ideal,
                          "batch_size": args.batch_size}))


if __name__ == "__main__":
    from records import recorded  # benchmarks/records.py: --record appends a record

    recorded("early_exit")(main)()
