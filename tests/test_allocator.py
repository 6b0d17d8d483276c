"""keep_freed_memory: a freed large tensor's pages are reused, not faulted in again."""

from __future__ import annotations

import subprocess
import sys

import pytest

# The probe loads the run layer first, as every command does before it calls
# keep_freed_memory: in a process that has imported almost nothing, glibc sometimes cannot
# grow its heap in place for the 48 MB block (measured: about half of such bare probes still
# fault), and the state the commands run in is the one that matters.
PROBE = """
import resource, sys, torch
import funcgraph.runs
from funcgraph.allocator import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
faults = []
for _ in range(4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.zeros(12_000_000)  # 48 MB: above the largest mmap threshold glibc adapts to
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    del x
print(min(faults[1:]))
"""


def minor_faults_of_a_reused_allocation(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], check=True, capture_output=True,
                         text=True).stdout
    return int(out.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_keep_freed_memory_stops_page_faults_on_reallocation() -> None:
    default = minor_faults_of_a_reused_allocation("default")
    kept = minor_faults_of_a_reused_allocation("keep")
    assert default > 1000, "the default allocator maps 48 MB afresh (about 11,700 pages)"
    assert kept < default / 10, f"kept heap still faults: {kept} vs {default}"
