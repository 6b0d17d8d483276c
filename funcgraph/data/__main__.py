"""``python -m funcgraph.data``: generate a split of an embedded set, preview it, score the
1-NN baseline.

Example::

    python -m funcgraph.data --split evaluation --preview glyphs.png --baseline 600
    python -m funcgraph.data --dataset rgb-shapes --split test --baseline 600
    python -m funcgraph.data --dataset patterns --split test --baseline 600
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from .. import random
from ..errors import FuncgraphError
from .datasets import ClassDataset, save_preview
from .registry import dataset_names, dataset_type
from .tasks import TaskSpec, nearest_neighbour_accuracy

EMBEDDED = [n for n in dataset_names()
            if dataset_type(n).kind == "classification" and not dataset_type(n).reads_data_root]
"""The generated image sets of the dataset registry (glyphs, rgb-shapes, patterns): their
loaders take ``seed`` and ``cache_dir``; each previews and scores its held-out test split
unless told."""


def main(argv: list[str] | None = None) -> None:
    """Generate (or load) a split, then optionally preview it and score the 1-NN baseline.

    Example: ``python -m funcgraph.data --split evaluation --preview out.png
    --baseline 600`` (glyphs; ``--dataset rgb-shapes`` or ``--dataset patterns`` for the
    others) prints the load/generation time and the pixel-space 1-nearest-neighbour accuracy
    on 600 tasks with its 95% confidence interval.
    """
    parser = argparse.ArgumentParser(
        description=f"Generate a split of {', '.join(EMBEDDED)}; write a preview grid and/or "
                    "score the 1-NN baseline."
    )
    parser.add_argument("--dataset", default="glyphs", choices=EMBEDDED)
    parser.add_argument("--split", default=None, help="; ".join(
        f"{n}: {', '.join(dataset_type(n).splits)} (default {dataset_type(n).splits[-1]})"
        for n in EMBEDDED))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", type=Path, default=None, help="default: $FUNCGRAPH_CACHE")
    parser.add_argument("--preview", type=Path, default=None, help="PNG grid to write")
    parser.add_argument("--classes", type=int, default=12, help="preview rows (classes)")
    parser.add_argument("--drawings", type=int, default=10, help="preview columns (images)")
    parser.add_argument("--baseline", type=int, default=0, metavar="EPISODES", help="1-NN tasks")
    parser.add_argument("--tasks", default="5way1shot", help="task spec for --baseline")
    args = parser.parse_args(argv)
    wall, cpu = time.perf_counter(), time.process_time()
    entry = dataset_type(args.dataset)
    try:
        ds = entry.loader()(args.split or entry.splits[-1], seed=args.seed,
                            cache_dir=args.cache_dir)
    except FuncgraphError as e:  # an unknown split or a bad seed: a usage error, no traceback
        parser.error(str(e))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(
        f"{ds.name}: {ds.num_classes} classes x {ds.per_class} images, "
        f"loaded or generated in {wall:.1f} s ({cpu:.1f} s CPU)"
    )
    if args.preview is not None:
        step = max(1, ds.num_classes // args.classes)  # spread the rows over the alphabets
        rows = slice(None, step * args.classes, step)
        spread = ClassDataset(ds.images[rows], ds.class_names[rows], ds.name)
        out = save_preview(spread, args.preview, classes=args.classes, per_class=args.drawings)
        print(f"wrote {out}")
    if args.baseline > 0:
        spec = TaskSpec.parse(args.tasks)
        mean, ci = nearest_neighbour_accuracy(random.key(args.seed), ds, spec, args.baseline)
        print(f"pixel 1-NN {spec}, {args.baseline} tasks: {100 * mean:.1f}% +- {100 * ci:.1f}%")


if __name__ == "__main__":
    main()
