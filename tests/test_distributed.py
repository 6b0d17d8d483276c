"""Data parallelism over torch.distributed (gloo, CPU, processes on loopback)."""

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from funcgraph import distributed, random
from funcgraph.errors import DistributedError
from funcgraph.train import load_checkpoint

sys.path.insert(0, str(Path(__file__).parent))
import dist_worker  # noqa: E402

WORKER = Path(__file__).parent / "dist_worker.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(world: int, *args: str, script: Path = WORKER) -> list[subprocess.Popen]:
    """One process per rank running ``script ARGS`` with torchrun's environment variables."""
    port = _free_port()
    procs = []
    for rank in range(world):
        env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
               "PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).parents[1])}
        procs.append(subprocess.Popen([sys.executable, str(script), *args], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def _wait(procs, timeout=120):
    outs = [p.communicate(timeout=timeout) for p in procs]
    return [p.returncode for p in procs], outs


def _single_process(steps: int) -> dict:
    opt = dist_worker.adam(0.05)
    params = {"w": torch.zeros(3, 1, dtype=torch.float64), "b": torch.zeros(1, dtype=torch.float64)}
    state = opt.init(params)
    env = distributed.DistEnv()
    for step in range(steps):
        keys = distributed.rank_keys(random.fold_in(random.key(7), step), 32, env)
        params, state = opt.update(params, dist_worker.meta_grad(params, keys), state)
    return params


def test_shards_are_disjoint_and_cover_the_batch():
    envs = [distributed.DistEnv(rank=r, world_size=4) for r in range(4)]
    covered = [i for e in envs for i in distributed.shard(32, e)]
    assert covered == list(range(32))
    k = random.key(3)
    assert torch.equal(torch.cat([distributed.rank_keys(k, 32, e) for e in envs]),
                       random.split(k, 32)), "the ranks' keys, in rank order, are split(k, 32)"
    with pytest.raises(DistributedError, match="does not split evenly over 4"):
        distributed.shard(30, envs[0])


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    """An uninterrupted 2-rank run of 4 steps."""
    out = tmp_path_factory.mktemp("dist") / "straight"
    codes, outs = _wait(_launch(2, "--out", str(out), "--steps", "4"))
    assert codes == [0, 0], outs
    groups, _ = load_checkpoint(out / "final")
    return groups["params"]


def test_two_ranks_of_16_tasks_equal_one_rank_of_32(straight_run):
    expected = _single_process(4)
    for n in expected:
        torch.testing.assert_close(straight_run[n], expected[n], rtol=1e-12, atol=1e-14)


def test_resumed_two_rank_run_equals_uninterrupted(tmp_path, straight_run):
    codes, outs = _wait(_launch(2, "--out", str(tmp_path / "a"), "--steps", "2"))
    assert codes == [0, 0], outs
    codes, outs = _wait(_launch(2, "--out", str(tmp_path / "a"), "--steps", "4", "--resume"))
    assert codes == [0, 0], outs
    resumed, _ = load_checkpoint(tmp_path / "a" / "final")
    for n in straight_run:
        assert torch.equal(resumed["params"][n], straight_run[n]), f"{n} differs after resume"


def test_dead_rank_ends_the_job_with_a_clear_error(tmp_path):
    started = time.monotonic()
    procs = _launch(2, "--out", str(tmp_path / "r"), "--steps", "50", "--die-rank", "1",
                    "--die-at", "2", "--timeout", "30")
    codes, outs = _wait(procs, timeout=120)
    assert time.monotonic() - started < 120, "the surviving rank hung"
    assert codes[1] == 17
    assert codes[0] == 2, outs[0]
    assert "distributed:" in outs[0][1] and "rank 0" in outs[0][1]
    # Whatever checkpoint rank 0 left is complete and verifies.
    groups, meta = load_checkpoint(tmp_path / "r" / "checkpoints" / "last")
    assert meta["step"] == 2 and set(groups["params"]) == {"w", "b"}


LEAVE_SCRIPT = """
import os, torch
from funcgraph import distributed
env = distributed.init("gloo", timeout_s=30)
torch.func.grad(lambda p: p.square().sum())(torch.ones(3))  # imports torch._dynamo lazily
distributed.all_reduce_mean({"g": torch.ones(3)}, env)
distributed.shutdown(env)
tasks = os.listdir("/proc/self/task")
print(sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in tasks))
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="lists threads through /proc")
def test_leaving_the_group_after_a_torch_func_transform_stops_gloo_threads(tmp_path):
    """A group left after torch.func's first transform must not outlive ``shutdown``.

    torch.func imports torch.distributed.nn lazily, whose functions bind ``group.WORLD`` as
    defaults; imported after joining, that pinned the group, its gloo threads outlived the
    job, and a worker thread could abort the process at exit ("terminate called without an
    active exception", a rank exiting -6 after finishing its work).
    """
    script = tmp_path / "leave.py"
    script.write_text(LEAVE_SCRIPT)
    codes, outs = _wait(_launch(2, script=script))
    assert codes == [0, 0], outs
    for rank, (stdout, _) in enumerate(outs):
        threads = stdout.strip().splitlines()[-1]
        assert "gloo" not in threads, f"rank {rank}, threads left after shutdown: {threads}"


def test_single_process_env_is_a_no_op():
    env = distributed.init()
    assert env == distributed.DistEnv() and env.is_main and not env.active
    g = {"w": torch.tensor([1.5, -2.0]), "b": torch.tensor(3.0)}
    out = distributed.all_reduce_mean(g, env)
    assert set(out) == {"w", "b"}, out
    # One process: the mean over ranks is the value itself, bit for bit, and g is untouched.
    assert torch.equal(out["w"], torch.tensor([1.5, -2.0])) and torch.equal(out["b"],
                                                                            torch.tensor(3.0))
    assert torch.equal(g["w"], torch.tensor([1.5, -2.0])), "the argument was mutated"
    distributed.assert_in_sync(g, env, 0)


def _one_and_two_processes(args: list[str], tmp_path: Path) -> tuple[dict, dict, dict]:
    """Run the CLI ``args`` with ``--nproc 2`` (torchrun, gloo) and in this process; return
    both ``last`` checkpoints' params and the 2-process checkpoint's metadata."""
    from typer.testing import CliRunner

    from funcgraph.cli import app

    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
           "PYTHONPATH": str(Path(__file__).parents[1])}
    done = subprocess.run([sys.executable, "-m", "funcgraph", *args, "--nproc", "2", "--out",
                           str(tmp_path / "two")], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "one")])
    assert result.exit_code == 0, result.output
    two, meta_two = load_checkpoint(tmp_path / "two" / "checkpoints" / "last")
    one, _ = load_checkpoint(tmp_path / "one" / "checkpoints" / "last")
    return one["params"], two["params"], meta_two


def test_meta_train_nproc_2_equals_one_process(tmp_path):
    """`funcgraph meta-train --nproc 2` ends where one process ends."""
    one, two, meta = _one_and_two_processes(
        ["meta-train", "--dataset", "sinusoid", "--steps", "3", "--meta-batch", "8",
         "--validate-every", "0", "--episodes", "4"], tmp_path)
    assert meta["world_size"] == 2
    for n in one:
        torch.testing.assert_close(two[n], one[n], rtol=1e-5, atol=1e-6)


def test_train_nproc_2_equals_one_process(tmp_path):
    """`funcgraph train --nproc 2` averages gradients over half-batches: same params as one."""
    one, two, meta = _one_and_two_processes(
        ["train", "--model", "rnn", "--steps", "3", "--batch-size", "8", "--validate-every",
         "0"], tmp_path)
    assert meta["world_size"] == 2
    # float32 Adam divides by sqrt of tiny second moments, which magnifies summation-order
    # rounding; 1e-5 is 1% of one step (lr 1e-3), far below what a missing all-reduce gives.
    for n in one:
        torch.testing.assert_close(two[n], one[n], rtol=1e-4, atol=1e-5)


def test_search_on_two_ranks_stays_in_sync_and_writes_once(tmp_path):
    """First-order DARTS search on 2 ranks: every epoch end checks that both ranks hold the
    same params (a divergence would fail the job), and rank 0 writes the outputs.

    Not compared with one process: batch norm normalises each rank's slice with its own
    statistics (data parallelism without synchronised batch norm), which changes the numbers.
    """
    worker = Path(__file__).parent / "dist_search_worker.py"
    procs = _launch(2, str(tmp_path / "two"), script=worker)
    codes, outs = _wait(procs)
    assert codes == [0, 0], outs
    _, meta = load_checkpoint(tmp_path / "two" / "checkpoints" / "last")
    assert meta["world_size"] == 2 and meta["step"] == 4
    history = (tmp_path / "two" / "alpha_history.jsonl").read_text().splitlines()
    assert len(history) == 2, "each epoch end must be written once (by rank 0 alone)"
    assert json.loads((tmp_path / "two" / "genotype.json").read_text())["normal"]


def test_second_order_search_refuses_to_run_distributed(tmp_path):
    from funcgraph.errors import ConfigError
    from funcgraph.nas import BilevelConfig, SearchConfig
    from funcgraph.runs import run_search

    cfg = SearchConfig(C=2, layers=3, epochs=1, batch_size=8, stop_skips=None,
                       bilevel=BilevelConfig(order="second"))
    import dist_search_worker

    with pytest.raises(ConfigError, match="--order second runs in one process"):
        run_search(tmp_path / "r", dist_search_worker.data(), cfg, show_progress=False,
                   env=distributed.DistEnv(rank=0, world_size=2))
