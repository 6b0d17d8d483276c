"""A throwaway PostgreSQL server for tests: a new cluster (``initdb``) in a temporary folder,
started with ``pg_ctl`` on a free loopback port with trust authentication, stopped and removed
afterwards.

PostgreSQL refuses to run as root; under root the cluster belongs to the ``postgres`` system
user (Debian's package makes it) and its commands run through ``runuser``. Where no server
binaries, no driver or no such user can be had, :func:`postgres_url` skips the test, saying
which; with ``FUNCGRAPH_REQUIRE_POSTGRES=1`` in the environment (``.ci/run`` sets it) it fails
instead, so CI cannot stay green by quietly not running it.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import pytest

REQUIRE = "FUNCGRAPH_REQUIRE_POSTGRES"
"""The environment switch that turns a missing prerequisite into a failure."""


def missing(reason: str) -> NoReturn:
    """Skip the test for ``reason``, or fail it where :data:`REQUIRE` is ``1``."""
    if os.environ.get(REQUIRE) == "1":
        pytest.fail(f"{reason} ({REQUIRE}=1: the PostgreSQL tests must run)", pytrace=False)
    pytest.skip(reason)


def _binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def postgres_url() -> Iterator[str]:
    """Start a cluster in a new temporary folder and yield its URL (database ``postgres``,
    user ``postgres``, no password); the cluster is stopped and its folder removed on exit.
    (The folder is made directly under the system's temporary directory: pytest's own are
    closed to other users, and the cluster's user must reach it.)"""
    try:
        import psycopg  # noqa: F401 - Optuna's RDB store reaches the server through it
    except ImportError:
        missing("the PostgreSQL driver (psycopg) is missing: pip install -e '.[postgres]'")
    initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
    if initdb is None or pg_ctl is None:
        missing("no PostgreSQL server binaries (initdb, pg_ctl); .ci/run installs them")
    prefix: list[str] = []
    if os.geteuid() == 0:
        runuser = shutil.which("runuser")
        try:
            import pwd

            user = pwd.getpwnam("postgres")
        except KeyError:
            missing("running as root and there is no postgres user to own the cluster")
        if runuser is None:
            missing("running as root and there is no runuser to start the cluster with")
        prefix = [runuser, "-u", "postgres", "--"]
    folder = Path(tempfile.mkdtemp(prefix="funcgraph-postgres-"))
    if prefix:
        os.chown(folder, user.pw_uid, user.pw_gid)
    data, port = folder / "data", _free_port()

    def run(*args: str) -> None:
        done = subprocess.run([*prefix, *args], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed: {done.stderr or done.stdout}")

    try:
        run(initdb, "-D", str(data), "-U", "postgres", "--auth=trust", "--no-sync", "-E",
            "UTF8")
    except RuntimeError:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    run(pg_ctl, "-D", str(data), "-l", str(folder / "server.log"), "-w", "-t", "60",
        "-o", f"-c listen_addresses=127.0.0.1 -p {port} -k {folder} -c fsync=off", "start")
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        run(pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(folder, ignore_errors=True)
