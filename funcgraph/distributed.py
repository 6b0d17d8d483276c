"""Data-parallel training on ``torch.distributed``: shard tasks, all-reduce one gradient dict.

Pure functions make data parallelism small: every rank holds the same params, computes the
gradient of its slice of the (meta-)batch, and one all-reduce of the flattened gradient dict
gives every rank the same mean gradient, hence the same update. Launch with ``torchrun``
(``torchrun --nproc-per-node 2 -m funcgraph meta-train ...``) or let
``funcgraph meta-train --nproc 2`` spawn the processes; ranks come from the environment
variables torchrun sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``...).

Process-group timeouts are set, so a rank that dies ends the others with a
:class:`DistributedError` instead of a hang.
"""

from __future__ import annotations

import functools
import importlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor

from . import random
from .errors import ConfigError, DistributedError
from .params import Params
from .random import Key


@dataclass(frozen=True)
class DistEnv:
    """Where this process stands in the job. A single process is rank 0 of world size 1."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes progress, metrics and checkpoints."""
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1


def launched_by_torchrun() -> bool:
    """True when the environment carries a torchrun rank assignment."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def available_backends() -> list[str]:
    """The ``torch.distributed`` backends this torch build has (``gloo`` on CPU builds)."""
    if not dist.is_available():
        return []
    checks = {"gloo": dist.is_gloo_available, "nccl": dist.is_nccl_available,
              "mpi": dist.is_mpi_available}
    return [name for name, available in checks.items() if available()]


def check_backend(backend: str) -> None:
    """Refuse a backend this torch build lacks, before any process is started."""
    if backend == "auto":
        return
    have = available_backends()
    if backend not in have:
        raise ConfigError(f"--backend {backend}: not available in this torch build "
                          f"(available: {', '.join(have) or 'none'}; or auto)")


def init(
    backend: str = "auto", *, timeout_s: float = 120.0, device: torch.device | None = None
) -> DistEnv:
    """Join the process group described by the environment (a no-op single-process env when
    not launched by torchrun). ``backend="auto"`` picks ``nccl`` for CUDA devices, else
    ``gloo``. Threads per process are set to ``cores // local_world_size`` so processes on one
    machine do not oversubscribe it.
    """
    if not launched_by_torchrun():
        return DistEnv()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    if backend == "auto":
        backend = "nccl" if device is not None and device.type == "cuda" else "gloo"
    check_backend(backend)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(local_world, 1)))
    if not dist.is_initialized():
        # torch.distributed.nn binds ``group.WORLD`` as default arguments when first imported,
        # and torch.func imports it lazily (through torch._dynamo) on the first transform.
        # Imported after the group exists, it pins the default group for good:
        # destroy_process_group then leaves gloo's threads running, and one of them can abort
        # the process at exit ("terminate called without an active exception"). Imported
        # here, while no group exists, it binds None.
        importlib.import_module("torch.distributed.nn")

        try:
            dist.init_process_group(
                backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s)
            )
        except (RuntimeError, ValueError) as e:
            raise DistributedError(f"distributed: could not join the process group: {e}") from None
    return DistEnv(rank, world, local_rank, backend)


def shutdown(env: DistEnv, *, wait: bool = True) -> None:
    """Leave the process group (safe to call for a single-process env).

    With ``wait`` the ranks meet at a barrier first, so no rank leaves while a peer still
    works (rank 0 writing the last files). After a failure pass ``wait=False``: the peers may
    be gone, and the job is ending anyway. Once left, the group's gloo threads are gone (see
    :func:`init` for what could keep them).
    """
    if env.active and dist.is_initialized():
        if wait:
            _collective(env, "final barrier", dist.barrier)
        dist.destroy_process_group()


@contextmanager
def joined(env: DistEnv) -> Iterator[DistEnv]:
    """``with joined(env): ...`` leaves the process group when the block ends: after a
    barrier when it succeeded, at once when it raised."""
    try:
        yield env
    except BaseException:
        shutdown(env, wait=False)
        raise
    shutdown(env)


def barrier(env: DistEnv) -> None:
    """Wait until every rank gets here (no-op for a single process)."""
    if env.active:
        _collective(env, "barrier", dist.barrier)


def shard(total: int, env: DistEnv) -> range:
    """This rank's contiguous, disjoint slice of ``range(total)``; ranks cover it exactly."""
    if total % env.world_size:
        raise DistributedError(
            f"distributed: a batch of {total} does not split evenly over "
            f"{env.world_size} processes; choose a multiple of {env.world_size}"
        )
    per = total // env.world_size
    return range(env.rank * per, (env.rank + 1) * per)


def rank_keys(step_key: Key, total: int, env: DistEnv) -> Tensor:
    """The keys of this rank's items: slice ``shard(total)`` of ``split(step_key, total)``.

    Every rank derives the same ``total`` keys from the shared step key and takes its own
    slice, so the union over ranks is exactly the batch a single process would draw.
    """
    s = shard(total, env)
    return random.split(step_key, total)[s.start : s.stop]


def _collective(env: DistEnv, what: str, fn: Callable[[], object]) -> None:
    try:
        fn()
    except RuntimeError as e:
        raise DistributedError(
            f"distributed: {what} failed on rank {env.rank} (another rank died or timed out): "
            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
        ) from None


def all_reduce_mean(grads: Params, env: DistEnv, *, bucket_bytes: int = 25 * 2**20) -> Params:
    """Mean of ``grads`` over ranks, as one all-reduce per bucket of flattened tensors.

    Tensors are grouped by dtype and device, concatenated into buckets of at most
    ``bucket_bytes`` (one collective for a small model), summed and divided by the world size.
    """
    if not env.active:
        return dict(grads)
    buckets: list[list[str]] = []
    groups: dict[tuple[torch.dtype, torch.device], list[str]] = {}
    for name, g in grads.items():
        groups.setdefault((g.dtype, g.device), []).append(name)
    for names in groups.values():
        current: list[str] = []
        size = 0
        for name in names:
            nbytes = grads[name].numel() * grads[name].element_size()
            if current and size + nbytes > bucket_bytes:
                buckets.append(current)
                current, size = [], 0
            current.append(name)
            size += nbytes
        buckets.append(current)
    out: Params = {}
    for bucket in buckets:
        flat = torch.cat([grads[n].reshape(-1) for n in bucket])
        _collective(env, "gradient all-reduce", functools.partial(dist.all_reduce, flat))
        flat = flat / env.world_size
        for n, piece in zip(bucket, flat.split([grads[n].numel() for n in bucket]), strict=True):
            out[n] = piece.view_as(grads[n])
    return {n: out[n] for n in grads}


def checksum(params: Params) -> Tensor:
    """A cheap float64 fingerprint of a params dict: (sum, sum of squares) over all entries."""
    total = torch.zeros(2, dtype=torch.float64)
    for name in sorted(params):
        p = params[name].detach().to("cpu", torch.float64)
        total = total + torch.stack([p.sum(), p.square().sum()])
    return total


def assert_in_sync(params: Params, env: DistEnv, step: int) -> None:
    """Raise :class:`DistributedError` unless every rank holds bit-identical params (by
    checksum). Call every K steps: it costs one tiny all-gather."""
    if not env.active:
        return
    mine = checksum(params)
    gathered = [torch.zeros_like(mine) for _ in range(env.world_size)]
    _collective(env, "params checksum", lambda: dist.all_gather(gathered, mine))
    if any(not torch.equal(g, gathered[0]) for g in gathered):
        sums = ", ".join(f"rank {i}: {float(g[0]):.17g}" for i, g in enumerate(gathered))
        raise DistributedError(f"distributed: params diverged across ranks at step {step} ({sums})")


def without_option(argv: Sequence[str], option: str) -> list[str]:
    """``argv`` without ``option`` and its value (``--opt V`` or ``--opt=V``)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == option:
            skip = True
        elif not arg.startswith(option + "="):
            out.append(arg)
    return out


def spawn(nproc: int, argv: Sequence[str], *, nnodes: int = 1) -> int:
    """Run ``python -m funcgraph ARGV`` in ``nproc`` processes under torchrun on this machine
    (loopback rendezvous); returns the launcher's exit code. What ``--nproc`` does."""
    if nproc < 1:
        raise DistributedError(f"distributed: --nproc must be >= 1, got {nproc}")
    cmd = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
        f"--nnodes={nnodes}", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0",
        "-m", "funcgraph", *argv,
    ]
    return subprocess.call(cmd)


__all__ = [
    "DistEnv",
    "all_reduce_mean",
    "assert_in_sync",
    "barrier",
    "checksum",
    "init",
    "joined",
    "launched_by_torchrun",
    "rank_keys",
    "shard",
    "shutdown",
    "spawn",
    "without_option",
]
