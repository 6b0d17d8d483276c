"""A tiny first-order DARTS search run as one process per rank by test_distributed.py; the
same function runs in one process for the reference."""

import sys

import torch

from funcgraph import distributed, random
from funcgraph.nas import SearchConfig, SearchData
from funcgraph.runs import run_search

CFG = SearchConfig(C=2, layers=3, epochs=2, batch_size=8, stop_skips=None, select="argmax")
"""Derived by argmax: rank 0's selection by perturbation would be most of the run's time and
is no part of what the ranks share (tests/test_nas_perturbation.py tests it)."""


def data() -> SearchData:
    k = random.split(random.key(0), 2)
    labels = torch.arange(16) % 3
    return SearchData(random.uniform(k[0], (16, 1, 4, 4)), labels,
                      random.uniform(k[1], (16, 1, 4, 4)), labels, 3, "synthetic")


def main() -> int:
    env = distributed.init("gloo", timeout_s=90)
    run_search(sys.argv[1], data(), CFG, show_progress=False, env=env)
    distributed.shutdown(env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
