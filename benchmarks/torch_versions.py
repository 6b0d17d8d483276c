"""Run the test suite against other torch releases, each in a fresh virtual environment.

funcgraph declares ``torch>=2.11,<2.15``. For each version asked for, this creates a venv
under ``--venvs``, installs ``torch==VERSION`` with pip, then this checkout's ``.[test]``
(which keeps that torch: the range admits it), prints the versions installed and runs
``python -m pytest -q -p no:cacheprovider`` from the repository root (so the checkout is what
is imported). Output goes to ``<venvs>/torch-VERSION.log`` as well as the terminal; a summary
line per version ends the run, and the exit code is non-zero if any version failed.

    python benchmarks/torch_versions.py                       # 2.11.0 and 2.14.1
    python benchmarks/torch_versions.py 2.12.1 --venvs /tmp/fg-venvs -- -x tests/test_meta_maml.py

What installs where: PyPI has only CUDA builds of torch for Linux x86_64 (the CPU-only wheels
live on download.pytorch.org), so where pip reaches only PyPI each venv is a CUDA build of
several GB that also runs on the CPU; pip takes wheels from a local cache or index where it
has one. Check ``df -h`` first.

Results of one run each are in docs/testing.md ("Other torch releases").
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_VERSIONS = ["2.11.0", "2.14.1"]


def sh(cmd: list[str], log, *, cwd: Path = ROOT) -> int:  # type: ignore[no-untyped-def]
    """Run ``cmd``, streaming its output to the terminal and to ``log``; its exit code."""
    line = f"$ {' '.join(cmd)}\n"
    sys.stdout.write(line)
    log.write(line)
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    assert proc.stdout is not None
    for out in proc.stdout:
        sys.stdout.write(out)
        log.write(out)
    return proc.wait()


def run_version(version: str, venvs: Path, pytest_args: list[str]) -> tuple[str, float]:
    env_dir = venvs / f"torch-{version}"
    python = env_dir / "bin" / "python"
    start = time.perf_counter()
    with open(venvs / f"torch-{version}.log", "w") as log:
        if not python.exists():
            venv.create(env_dir, with_pip=True)
        steps = [
            [str(python), "-m", "pip", "install", "-q", f"torch=={version}"],
            [str(python), "-m", "pip", "install", "-q", f"{ROOT}[test]"],
            [str(python), "-c", "import torch, onnx, onnxruntime; print('torch', "
             "torch.__version__, '| onnx', onnx.__version__, '| onnxruntime', "
             "onnxruntime.__version__)"],
        ]
        for cmd in steps:
            if sh(cmd, log) != 0:
                return f"install failed: {' '.join(cmd[2:])}", time.perf_counter() - start
        code = sh([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args],
                  log)
    seconds = time.perf_counter() - start
    return ("tests passed" if code == 0 else f"pytest exit code {code}"), seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("versions", nargs="*", default=DEFAULT_VERSIONS)
    parser.add_argument("--venvs", type=Path, default=Path("/tmp/funcgraph-torch-venvs"),
                        help="where the venvs and logs go (reused if present)")
    args, pytest_args = parser.parse_known_args(argv)
    pytest_args = [a for a in pytest_args if a != "--"]
    args.venvs.mkdir(parents=True, exist_ok=True)
    results = {v: run_version(v, args.venvs, pytest_args) for v in args.versions}
    print()
    for version, (outcome, seconds) in results.items():
        print(f"torch {version}: {outcome} ({seconds / 60:.1f} min, log "
              f"{args.venvs / f'torch-{version}.log'})")
    return 0 if all(o == "tests passed" for o, _ in results.values()) else 1


if __name__ == "__main__":
    from records import recorded  # benchmarks/records.py: --record appends a record

    sys.exit(recorded("torch_versions")(main)())
