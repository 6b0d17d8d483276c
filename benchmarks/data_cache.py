"""The decoded image cache, and task sampling against a meta-step.

**Cache.** Writes a folder of ``--images`` JPEGs (default 60,000 at 84x84, mini-ImageNet's
size; ``--source-size`` makes them larger, like raw ImageNet photos, which are then
resized) as ``ROOT/train/CLASS/*.jpg`` over ``--classes`` classes, then times
:func:`funcgraph.data.load_folder` on it: the first load (list, decode on the thread pool,
write the cache) with an empty cache directory, then ``--reps`` cached loads (list and stat
the files, memory-map the cache). The JPEGs were just written, so they are in the page cache:
a cold disk adds its read time to the first load only.

**Sampling vs a meta-step.** Loads the ``rgb-shapes`` train split from the cache, times
sampling a meta-batch of ``--meta-batch`` tasks (default 32 of 5-way 1-shot, 15 queries,
84x84) ``--reps`` times, and ``--step-reps`` second-order MAML meta-steps (meta-gradient of
the batch and an Adam update) of conv4's mini-ImageNet configuration (RGB, ``pool``, 32
filters) on such a batch, after one untimed warm-up step; the ratio says how much of a
meta-training step the data costs.

Prints a table and one JSON line per measurement. Example::

    python benchmarks/data_cache.py                      # 60,000 images
    python benchmarks/data_cache.py --images 6000 --step-reps 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from funcgraph import bind, random
from funcgraph.data import TaskSpec, load_folder, load_rgb_shapes, sample_tasks
from funcgraph.data.images import default_workers
from funcgraph.meta import Task, maml, mean_task_grads
from funcgraph.models import conv4
from funcgraph.train import adam


def write_jpegs(root: Path, images: int, classes: int, size: int, workers: int) -> None:
    """``images`` photo-like JPEGs (a smooth random colour field plus grain, quality 90)
    spread evenly over ``classes`` folders of ``root/train``."""

    def one(i: int) -> None:
        rng = np.random.default_rng(i)
        coarse = Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8))
        field = np.asarray(coarse.resize((size, size), Image.Resampling.BICUBIC), np.int16)
        grain = rng.integers(-12, 13, (size, size, 3), dtype=np.int16)
        pixels = np.clip(field + grain, 0, 255).astype(np.uint8)
        folder = root / "train" / f"class{i % classes:03d}"
        Image.fromarray(pixels).save(folder / f"{i:06d}.jpg", quality=90)

    for c in range(classes):
        (root / "train" / f"class{c:03d}").mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, range(images)))


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def emit(rows: list[dict[str, object]], row: dict[str, object]) -> None:
    rows.append(row)
    print(json.dumps(row), flush=True)


def cache_figures(args: argparse.Namespace, rows: list[dict[str, object]]) -> None:
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root, cache = Path(tmp) / "images", Path(tmp) / "cache"
        source = args.source_size or args.size
        made = timed(lambda: write_jpegs(root, args.images, args.classes, source, args.workers))
        megabytes = sum(f.stat().st_size for f in root.rglob("*.jpg")) / 1e6
        emit(rows, {"what": f"write {source}px jpegs (setup)", "images": args.images,
                    "seconds": made, "jpeg_mb": round(megabytes, 1)})

        def load() -> None:
            load_folder(root, "train", image_size=args.size, cache_dir=cache,
                        workers=args.workers)

        first = timed(load)
        cache_mb = sum(f.stat().st_size for f in cache.iterdir()) / 1e6
        emit(rows, {"what": f"first load (decode to {args.size}px + cache write)",
                    "images": args.images,
                    "workers": args.workers, "seconds": first, "cache_mb": round(cache_mb, 1),
                    "images_per_s": args.images / first})
        again = [timed(load) for _ in range(args.reps)]
        emit(rows, {"what": "cached load (stat + mmap)", "images": args.images,
                    "runs": args.reps, "median_s": statistics.median(again),
                    "min_s": min(again), "speedup": first / statistics.median(again)})


def sampling_vs_step(args: argparse.Namespace, rows: list[dict[str, object]]) -> None:
    ds = load_rgb_shapes("train", cache_dir=args.rgb_cache)  # generated on the first run
    spec = TaskSpec.parse(args.tasks)
    keys = [random.key(i) for i in range(args.reps)]
    sample = [timed(lambda k=k: sample_tasks(k, ds, spec, args.meta_batch)) for k in keys]
    emit(rows, {"what": f"sample {args.meta_batch} tasks {spec} from rgb-shapes (cached)",
                "runs": args.reps, "median_s": statistics.median(sample), "min_s": min(sample)})

    model = conv4(spec.ways, in_channels=3, hidden=32, image_size=ds.image_shape[1],
                  variant="pool")
    params, state = model.init(random.key(0))
    learner = maml(bind(model, state, train=True), inner_steps=args.inner_steps,
                   inner_lr=args.inner_lr)
    optimiser = adam(1e-3)
    opt_state = optimiser.init(params)
    tasks = Task.of(sample_tasks(random.key(99), ds, spec, args.meta_batch))

    def step() -> None:
        grads, _, _ = mean_task_grads(learner.task_grad, params, tasks, strategy=args.strategy)
        optimiser.update(params, grads, opt_state)  # dropped: the same params every rep

    step()  # warm-up
    steps = [timed(step) for _ in range(args.step_reps)]
    median = statistics.median(steps)
    emit(rows, {"what": f"MAML meta-step, conv4 pool 32 RGB, {args.inner_steps} inner step(s), "
                        f"{args.strategy}", "runs": args.step_reps, "median_s": median,
                "min_s": min(steps),
                "step_over_sampling": median / statistics.median(sample)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=60_000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--size", type=int, default=84, help="image size loaded")
    parser.add_argument("--source-size", type=int, default=None,
                        help="side of the JPEGs written (default: --size)")
    parser.add_argument("--workers", type=int, default=default_workers())
    parser.add_argument("--reps", type=int, default=5, help="cached loads; task samplings")
    parser.add_argument("--dir", type=Path, default=None, help="scratch folder (default: tmp)")
    parser.add_argument("--rgb-cache", type=Path, default=None,
                        help="cache directory of rgb-shapes (default: $FUNCGRAPH_CACHE)")
    parser.add_argument("--tasks", default="5way1shot")
    parser.add_argument("--meta-batch", type=int, default=32)
    parser.add_argument("--inner-steps", type=int, default=1)
    parser.add_argument("--inner-lr", type=float, default=0.01)
    parser.add_argument("--strategy", default="loop", choices=("loop", "vmap"))
    parser.add_argument("--step-reps", type=int, default=3)
    parser.add_argument("--skip", choices=("cache", "step"), default=None,
                        help="leave out one of the two measurements")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{args.workers} decode workers")
    rows: list[dict[str, object]] = []
    if args.skip != "cache":
        cache_figures(args, rows)
    if args.skip != "step":
        sampling_vs_step(args, rows)
    print(f"\n{'measurement':<62} {'runs':>4} {'seconds':>9}")
    for row in rows:
        seconds = row.get("median_s", row.get("seconds"))
        print(f"{row['what']:<62} {row.get('runs', 1):>4} {seconds:>9.3f}")


if __name__ == "__main__":
    from records import recorded  # benchmarks/records.py: --record appends a record

    recorded("data_cache")(main)()
