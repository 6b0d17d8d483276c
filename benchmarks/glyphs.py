"""Generating every split of the glyph set from an empty cache.

Times :func:`funcgraph.data.load_glyphs` for the background, validation and evaluation splits
into a fresh cache folder of its own (a temporary folder, removed afterwards), so nothing
outside the repository is named and nothing cached before counts. Prints one JSON line with
the wall and CPU seconds of the generation (this process's CPU time; Python start-up and
``import funcgraph`` are not included, they are on the line as ``import_s``).

    OMP_NUM_THREADS=1 python benchmarks/glyphs.py --record
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

SPLITS = ("background", "validation", "evaluation")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    import torch

    from funcgraph.data import load_glyphs

    import_s = time.perf_counter() - started
    with tempfile.TemporaryDirectory(prefix="funcgraph-glyphs-") as cache:
        wall, cpu = time.perf_counter(), time.process_time()
        classes = [len(load_glyphs(split, seed=args.seed, cache_dir=Path(cache)).class_names)
                   for split in SPLITS]
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(json.dumps({"what": "generate glyphs, every split, empty cache",
                      "splits": dict(zip(SPLITS, classes, strict=True)),
                      "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                      "import_s": round(import_s, 2), "threads": torch.get_num_threads(),
                      "seed": args.seed}))


if __name__ == "__main__":
    from records import recorded  # benchmarks/records.py: --record appends a record

    recorded("glyphs")(main)()
