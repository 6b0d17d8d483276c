"""A spatially adaptive CNN: easy samples exit after the first block, the rest continue.

Trains the early-exit CNN briefly on glyph characters, then shows, per decision threshold, the
exit rate, the accuracy and the inference CPU time (exiting samples are gathered out of the
second block, so they cost nothing there).

Run: python examples/early_exit.py                  (about 11 s of CPU; glyphs cached after
                                                      the first run)

One torch thread by default (``--threads 0`` for torch's default): on a machine that other
jobs share, OpenMP threads spin-wait for a core and two threads can be many times slower
than one.
"""

from __future__ import annotations

import argparse
import time

import torch

from funcgraph import random
from funcgraph.models.early_exit import early_exit_cnn, early_exit_loss
from funcgraph.runs.train import glyph_classes
from funcgraph.train import adam
from funcgraph.train.supervised import Batch, class_split, sample_batch, train_step


def synthetic(classes: int, image_size: int) -> tuple[Batch, Batch]:
    """Noise around a per-class brightness: for ``--synthetic`` smoke runs without glyphs."""
    noise = random.uniform(random.key(7), (classes, 10, 1, image_size, image_size))
    images = 0.3 * noise + torch.arange(classes).reshape(-1, 1, 1, 1, 1) / classes
    return class_split(images, num_classes=classes, val_per_class=4)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--classes", type=int, default=20)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=28)
    parser.add_argument("--synthetic", action="store_true", help="generated noise, not glyphs")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (0: torch's default, one per core)")
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    if args.synthetic:
        train, val = synthetic(args.classes, args.image_size)
    else:
        train, val = glyph_classes("background", args.classes, 4, args.image_size)
    model = early_exit_cnn(num_classes=args.classes, width=args.width)
    params, state = model.init(random.key(0))
    opt = adam(3e-3)
    opt_state = opt.init(params)
    step = train_step(model, opt, loss_fn=early_exit_loss)
    for i in range(args.steps):
        k = random.fold_in(random.key(1), i)
        batch = sample_batch(random.fold_in(k, 0), train, 64)
        params, state, opt_state, metrics = step(params, state, opt_state, batch, k)
    print(f"after {args.steps} steps: train accuracy {metrics['accuracy']:.2f}, "
          f"exit rate {metrics['exit_rate']:.2f}")

    # Thresholds at quantiles of the continue-probability trace accuracy against exit rate;
    # 0.5 is the default. A good decision head exits the samples the exit head gets right.
    x, labels = val
    with torch.no_grad():
        p = model.apply(params, state, x)[0].continue_prob
    thresholds = [0.5] + [float(torch.quantile(p, q)) for q in (0.25, 0.5, 0.75)] + [1.0]
    print(f"{'threshold':>9}{'exit rate':>11}{'accuracy':>10}{'ms CPU':>8}")
    for threshold in [0.0, *thresholds]:
        m = early_exit_cnn(num_classes=args.classes, width=args.width, threshold=threshold)
        with torch.no_grad():
            m.apply(params, state, x)  # warm-up
            start = time.process_time()
            out, _ = m.apply(params, state, x)
            ms = 1e3 * (time.process_time() - start)
        accuracy = float((out.logits.argmax(-1) == labels).float().mean())
        print(f"{threshold:>9.3f}{float(out.exited.float().mean()):>11.2f}{accuracy:>10.2f}"
              f"{ms:>8.1f}")


if __name__ == "__main__":
    main()
