"""Scaling of meta-training from 1 to N processes on one machine (torch.distributed, gloo).

Runs ``funcgraph meta-train`` with the default model and data for a few steps, once per process
count, with threads per process set so that every configuration uses the same cores
(``cores // nproc`` each): the comparison is of parallel strategies on a fixed machine, not of
more hardware. Reports tasks/s (median over logged steps, first step excluded), the speed-up
over one process, and the communication share of a step (time inside the gradient all-reduce,
which includes waiting for the slower rank, divided by the step time).

Example::

    python benchmarks/distributed_scaling.py --steps 20 --nprocs 1 2
    python benchmarks/distributed_scaling.py --steps 20 --nprocs 1 2 --threads 1

``--threads`` fixes the threads of every process instead: ``--threads 1`` compares with one
process at meta-train's default (and fastest measured) setting of one thread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def threads_for(nproc: int, cores: int, threads: int | None) -> int:
    return threads if threads is not None else max(1, cores // nproc)


def run(nproc: int, steps: int, meta_batch: int, cores: int, out: Path,
        threads_each: int | None = None) -> list[dict]:
    threads = str(threads_for(nproc, cores, threads_each))
    env = {**os.environ, "OMP_NUM_THREADS": threads}
    cmd = [sys.executable, "-m", "funcgraph", "meta-train", "--tasks", "5way1shot",
           "--threads", threads,
           "--steps", str(steps), "--meta-batch", str(meta_batch), "--validate-every", "0",
           "--episodes", "10", "--strategy", "loop", "--out", str(out), "--nproc", str(nproc)]
    subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r.get("kind") == "train"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--meta-batch", type=int, default=32)
    ap.add_argument("--nprocs", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--threads", type=int, default=None,
                    help="threads per process for every configuration (default cores // nproc)"
                         "; --threads 1 compares N processes with one process at meta-train's "
                         "default of one thread")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for nproc in args.nprocs:
            records = run(nproc, args.steps, args.meta_batch, args.cores,
                          Path(tmp) / f"n{nproc}", args.threads)
            # metrics.jsonl logs every 10 steps a running rate; take per-record rates after the
            # first record (which includes warm-up).
            rates = [r["tasks_per_s"] for r in records[1:]] or [records[-1]["tasks_per_s"]]
            comm = [r["comm_s"] for r in records if "comm_s" in r]
            rows.append({"nproc": nproc,
                         "threads_each": threads_for(nproc, args.cores, args.threads),
                         "tasks_per_s": statistics.median(rates),
                         "comm_s_per_step": statistics.median(comm) if comm else 0.0,
                         "s_per_step": args.meta_batch / statistics.median(rates)})
    base = rows[0]["tasks_per_s"]
    print(f"{'nproc':>5} {'threads':>7} {'tasks/s':>8} {'speed-up':>8} {'comm share':>10}")
    for r in rows:
        r["speedup"] = r["tasks_per_s"] / base
        r["comm_share"] = r["comm_s_per_step"] / r["s_per_step"]
        print(f"{r['nproc']:>5} {r['threads_each']:>7} {r['tasks_per_s']:>8.2f} "
              f"{r['speedup']:>7.2f}x {100 * r['comm_share']:>9.1f}%")
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    from records import recorded  # benchmarks/records.py: --record appends a record

    recorded("distributed_scaling")(main)()
