"""Peak memory and time of one meta-step: implicit MAML against second-order MAML, by inner steps.

MAML keeps the autograd graph of every inner step until the query loss is differentiated, so
its memory grows with the steps; iMAML runs its inner loop without a graph and solves for the
meta-gradient with ``--cg-steps`` Hessian-vector products, so its memory should not. Each
``(algorithm, inner steps)`` runs in a fresh process: it builds conv4 and a meta-batch of
random 5-way 1-shot tasks (28x28, one channel), takes one warm-up meta-gradient, then
``--reps`` timed ones (the loop strategy: one task's graph at a time). Peak memory is the
kernel's high-water mark of resident memory over the timed steps (reset after the warm-up
through ``/proc/self/clear_refs``) less the resident memory before the first step; on CUDA,
``torch.cuda.max_memory_allocated`` over the timed steps less the memory allocated before
them. Time is the median step: wall clock, or with ``--clock cpu`` this process's CPU time,
which a machine shared with other work disturbs less (use it with ``--threads 1``).

Example (prints a table and one JSON line per measurement)::

    python benchmarks/imaml_memory.py --steps 1,5,10 --reps 3
    python benchmarks/imaml_memory.py --threads 1 --clock cpu   # on a busy machine
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from funcgraph import bind, random
from funcgraph.meta import MetaLearner, Task, imaml, maml, mean_task_grads
from funcgraph.models import conv4

ALGOS = ("maml", "imaml")


def make_tasks(args: argparse.Namespace, device: torch.device) -> Task:
    """A meta-batch of random ``ways``-way ``shots``-shot tasks, ``queries`` per class."""
    k = random.split(random.key(args.seed), 2)
    n, t = args.ways, args.meta_batch
    sx = random.uniform(k[0], (t, n * args.shots, 1, 28, 28))
    qx = random.uniform(k[1], (t, n * args.queries, 1, 28, 28))
    sy = torch.arange(n).repeat_interleave(args.shots).expand(t, -1).contiguous()
    qy = torch.arange(n).repeat_interleave(args.queries).expand(t, -1).contiguous()
    return Task(sx, sy, qx, qy).to(device)


def make_learner(args: argparse.Namespace, algo: str, steps: int, apply: object) -> MetaLearner:
    if algo == "maml":
        return maml(apply, inner_steps=steps, inner_lr=args.inner_lr)  # type: ignore[arg-type]
    return imaml(apply, inner_steps=steps, inner_lr=args.inner_lr,  # type: ignore[arg-type]
                 lam=args.lam, cg_steps=args.cg_steps, cg_tol=0.0)


def status_kib(field: str) -> int:
    """A ``/proc/self/status`` field in KiB (``VmRSS``, ``VmHWM``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise SystemExit(f"/proc/self/status has no {field}: this benchmark needs Linux")


def measure(args: argparse.Namespace, algo: str, steps: int) -> dict[str, object]:
    """One configuration in this process: ``{"peak_mib", "step_s", ...}``."""
    device = torch.device(args.device)
    model = conv4(args.ways)
    params, state = model.init(random.key(args.seed))
    params = {n: p.to(device) for n, p in params.items()}
    tasks = make_tasks(args, device)
    learner = make_learner(args, algo, steps, bind(model, state, train=True))

    def step() -> None:
        grads, loss, _ = mean_task_grads(learner.task_grad, params, tasks, strategy="loop")
        float(loss)  # waits for the device

    cuda = device.type == "cuda"
    before_kib = status_kib("VmRSS")
    step()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    else:
        Path("/proc/self/clear_refs").write_text("5")
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    times = []
    for _ in range(args.reps):
        start = clock()
        step()
        times.append(clock() - start)
    peak = (torch.cuda.max_memory_allocated(device) - before if cuda
            else (status_kib("VmHWM") - before_kib) * 1024)
    return {"algo": algo, "inner_steps": steps, "peak_mib": round(peak / 2**20, 1),
            "step_s": round(statistics.median(times), 4), "clock": args.clock,
            "device": device.type, "threads": torch.get_num_threads(), "reps": args.reps}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", default="1,5,10", help="inner steps to compare, comma-separated")
    p.add_argument("--ways", type=int, default=5)
    p.add_argument("--shots", type=int, default=1)
    p.add_argument("--queries", type=int, default=1)
    p.add_argument("--meta-batch", type=int, default=4)
    p.add_argument("--inner-lr", type=float, default=0.1)
    p.add_argument("--lam", type=float, default=1.0)
    p.add_argument("--cg-steps", type=int, default=5)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    p.add_argument("--only", default=None, help=argparse.SUPPRESS)  # internal: "ALGO:STEPS"
    args = p.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.only is not None:
        algo, steps = args.only.split(":")
        print(json.dumps(measure(args, algo, int(steps))))
        return
    rows = []
    for steps in (int(s) for s in args.steps.split(",")):
        for algo in ALGOS:
            out = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--only",
                                  f"{algo}:{steps}"], check=True, capture_output=True,
                                 text=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
    print(f"\n{'algo':<6} {'inner steps':>11} {'peak MiB':>9} {'step s':>8}")
    for r in rows:
        print(f"{r['algo']:<6} {r['inner_steps']:>11} {r['peak_mib']:>9} {r['step_s']:>8}")


if __name__ == "__main__":
    from records import recorded  # benchmarks/records.py: --record appends a record

    recorded("imaml_memory")(main)()
