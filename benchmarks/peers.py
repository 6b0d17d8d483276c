"""funcgraph's MAML meta-step against the real peers, learn2learn and higher, interleaved.

Each implementation runs in a process of its own (``benchmarks/peer_worker.py``), started
afresh for every round, in rounds whose order rotates, so that a load change on a shared
machine hits every side alike. Every process gets the same allocator setting (``--malloc``:
glibc's default, or ``shipped``, funcgraph's commands' setting passed through glibc's
``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_``) and the same thread count. Before any
timing, every implementation's meta-gradient is computed in float64 on a small batch and
compared with a plain-autograd loop; a mismatch above 1e-10 (relative) stops the benchmark.

learn2learn 0.2.0 does not install from the registry beside current torch; it builds from its
sdist with a current Cython in a venv of its own (``--peer-python`` names that venv's Python;
``benchmarks/peers_venv.sh`` builds it). A peer that does not import is skipped with one line.

Per setting (queries, threads) it prints, as JSON lines: the step's op-limit (each convolution
and matrix product of the reference step replayed alone, summed: ``peer_worker.py
--op-limit``); each implementation's profile (where one step's time goes, by kind of
operator); then one line per implementation: the step's wall seconds as median and quartiles
over the rounds, its ratio to learn2learn's median, its percentage of the op-limit, CPU
seconds and the process's peak resident memory (medians over rounds), and the CPU's name.

    python benchmarks/peers.py --peer-python l2l-venv/bin/python --threads 2 --queries 1,15
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
WORKER = HERE / "peer_worker.py"
PEERS = ("learn2learn", "higher")
SHIPPED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1)}


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def run_worker(python: str, implementation: str, data: Path, env: dict[str, str],
               *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, str(WORKER), implementation, str(data), *extra],
                          capture_output=True, text=True, env=env, check=False)


def check_gradients(pythons: dict[str, str], data: Path, env: dict[str, str],
                    scratch: Path) -> list[str]:
    """The implementations whose float64 meta-gradient matches plain autograd's (a peer that
    does not import is left out with one line; any other failure or mismatch stops here)."""
    grads: dict[str, dict[str, torch.Tensor]] = {}
    for name, python in pythons.items():
        out = scratch / f"{name}.pt"
        done = run_worker(python, name, data, env, "--check", str(out))
        if done.returncode != 0:
            if name in PEERS and "ModuleNotFoundError" in done.stderr:
                print(f"peers: {name} is not installed for {python}; skipped", file=sys.stderr)
                continue
            raise SystemExit(f"peers: {name}'s float64 check failed:\n{done.stderr[-2000:]}")
        grads[name] = torch.load(out)
    want = grads["autograd"]
    ref = torch.cat([g.flatten() for g in want.values()])
    for name, got in grads.items():
        diff = torch.cat([(got[n] - want[n]).flatten() for n in want])
        err = (diff.norm() / ref.norm()).item()
        print(json.dumps({"check": name, "dtype": "float64", "rel_grad_diff_vs_autograd": err}))
        if err > 1e-10:
            raise SystemExit(f"peers: {name}'s meta-gradient differs from autograd's ({err:.3g})")
    return list(grads)


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def time_setting(names: list[str], pythons: dict[str, str], data: Path, env: dict[str, str],
                 rounds: int, strategy: str) -> dict[str, list[dict[str, Any]]]:
    """``rounds`` fresh processes per implementation, the order rotating each round."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            done = run_worker(pythons[name], name, data, env, "--steps", "1",
                              "--strategy", strategy)
            if done.returncode != 0:
                raise SystemExit(f"peers: {name} failed in round {r}:\n{done.stderr[-2000:]}")
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    return runs


def worker_line(pythons: dict[str, str], name: str, data: Path, env: dict[str, str],
                *extra: str) -> dict[str, Any]:
    done = run_worker(pythons[name], name, data, env, *extra)
    if done.returncode != 0:
        raise SystemExit(f"peers: {name} {' '.join(extra)} failed:\n{done.stderr[-2000:]}")
    line: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return line


def summary(runs: dict[str, list[dict[str, Any]]], queries: int, threads: int,
            limit_s: float, args: argparse.Namespace) -> list[dict[str, Any]]:
    anchor = (statistics.median(r["wall_s"] for r in runs["learn2learn"])
              if "learn2learn" in runs else None)
    rows = []
    for name, results in runs.items():
        q1, median, q3 = quartiles([r["wall_s"] for r in results])
        rows.append({
            "implementation": name, "queries": queries, "threads": threads,
            "rounds": len(results), "wall_s_median": round(median, 4),
            "wall_s_q1": round(q1, 4), "wall_s_q3": round(q3, 4),
            "speedup_vs_learn2learn": round(anchor / median, 3) if anchor else None,
            "op_limit_s": limit_s, "pct_of_op_limit": round(100 * limit_s / median, 1),
            "cpu_s_median": round(statistics.median(r["cpu_s"] for r in results), 4),
            "peak_rss_mb_median": statistics.median(r["peak_rss_mb"] for r in results),
            "malloc": args.malloc, "meta_batch": args.meta_batch, "ways": 5, "shots": 1,
            "model": "conv4 pool, 64 filters, batch statistics", "cpu": cpu_name(),
            "strategy": args.strategy if name.startswith("funcgraph") else None})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peer-python", default=sys.executable,
                        help="the Python of the venv where learn2learn and higher import")
    parser.add_argument("--threads", default="2", help="comma-separated thread counts")
    parser.add_argument("--queries", default="1,15", help="comma-separated queries per class")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--meta-batch", type=int, default=32)
    parser.add_argument("--malloc", choices=("default", "shipped"), default="default")
    parser.add_argument("--strategy", default="auto", help="funcgraph's task strategy")
    parser.add_argument("--implementations",
                        default="learn2learn,higher,funcgraph-module,funcgraph-conv4")
    args = parser.parse_args(argv)
    from peer_worker import make_data

    timed = args.implementations.split(",")
    pythons = {name: args.peer_python if name in PEERS else sys.executable
               for name in ["autograd", *timed]}
    env = {**os.environ, **(SHIPPED_MALLOC if args.malloc == "shipped" else {})}
    with tempfile.TemporaryDirectory(prefix="funcgraph-peers-") as tmp:
        scratch = Path(tmp)
        torch.save(make_data(5, 2, 4), scratch / "check.pt")
        env["OMP_NUM_THREADS"] = "1"
        present = check_gradients(pythons, scratch / "check.pt", env, scratch)
        names = [n for n in timed if n in present]
        for queries in map(int, args.queries.split(",")):
            data = scratch / f"q{queries}.pt"
            torch.save(make_data(5, queries, args.meta_batch), data)
            for threads in map(int, args.threads.split(",")):
                env["OMP_NUM_THREADS"] = str(threads)
                limit = worker_line(pythons, "autograd", data, env, "--op-limit")["op_limit"]
                print(json.dumps({"queries": queries, "threads": threads, **limit}), flush=True)
                for name in names:
                    found = worker_line(pythons, name, data, env, "--profile",
                                        "--strategy", args.strategy)
                    print(json.dumps({"queries": queries, **found}), flush=True)
                runs = time_setting(names, pythons, data, env, args.rounds, args.strategy)
                for row in summary(runs, queries, threads, limit["op_limit_s"], args):
                    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    from records import recorded  # benchmarks/records.py: --record appends a record

    recorded("peers")(main)()
