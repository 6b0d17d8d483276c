"""How the factory gets parameter shapes: ``init`` with the key on meta vs on the CPU.

``python benchmarks/factory_meta_init.py [--repeats 3]``

For a few reference models, times (CPU seconds, ``time.process_time``, median of
``--repeats`` after one warm-up) three ways of getting meta params:

* ``meta key``: ``model.init`` with the key and the default device on meta: every Threefry
  op runs through torch's Python meta kernels (the baseline);
* ``meta default device``: CPU key, default device meta, large draws redirected to meta;
* ``factory``: :func:`funcgraph.factory.meta_init` (draws as shapes only, under
  :func:`funcgraph.random.shapes_only`; large constants on meta).

Prints a table and one JSON line per model with the ratios against the baseline.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from funcgraph import random
from funcgraph.factory.meta_tensors import meta_draws, meta_init, to_meta
from funcgraph.model import Model


def _meta_key(model: Model) -> None:
    with torch.device("meta"):
        model.init(random.key(0))


def _meta_default_device(model: Model) -> None:
    with meta_draws() as key:
        params, _ = model.init(key)
    to_meta(params)


def _factory(model: Model) -> None:
    meta_init(model)


def cpu_seconds(fn: Callable[[Model], None], model: Model, repeats: int) -> float:
    fn(model)  # warm-up: first calls of meta kernels pay one-time setup
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn(model)
        times.append(time.process_time() - start)
    return statistics.median(times)


def models() -> dict[str, Callable[[], Model]]:
    from funcgraph.models.conv4 import conv4
    from funcgraph.models.resnet import resnet
    from funcgraph.nas import search_network

    return {"conv4": lambda: conv4(5), "resnet20": lambda: resnet(20),
            "darts_search(C=2, 3 cells)": lambda: search_network(2, 3, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    ways = {"meta key": _meta_key, "meta default device": _meta_default_device,
            "factory": _factory}
    header = f"{'model':28s}" + "".join(f"{w:>22s}" for w in ways) + f"{'speed-up':>10s}"
    print(header)
    for name, make in models().items():
        model = make()
        seconds = {w: cpu_seconds(fn, model, args.repeats) for w, fn in ways.items()}
        base = seconds["meta key"]
        print(f"{name:28s}" + "".join(f"{s:21.3f}s" for s in seconds.values())
              + f"{base / seconds['factory']:9.1f}x")
        print(json.dumps({"model": name, "cpu_s": seconds, "repeats": args.repeats,
                          "speedup_vs_meta_key": {w: base / s for w, s in seconds.items()}}))


if __name__ == "__main__":
    from records import recorded  # benchmarks/records.py: --record appends a record

    recorded("factory_meta_init")(main)()
