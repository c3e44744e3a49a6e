"""The worker's C allocator keeps freed large blocks (trainer.runtime.allocator): no page faults per exchange."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trainer.runtime.allocator import keep_freed_memory

# Frees four 3 MB arrays at once, as an exchange frees its copies of the weights: with glibc's
# defaults the heap's top is trimmed and the next round faults every page in again.
_CHURN = """
import resource, sys
import numpy as np
if sys.argv[1] == "keep":
    from trainer.runtime.allocator import keep_freed_memory
    assert keep_freed_memory()

def churn():
    for _ in range(20):
        arrays = [np.ones(750_000, np.float32) for _ in range(4)]
        del arrays

churn()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
churn()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
"""


def _faults_per_round(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", _CHURN, mode], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def test_freed_blocks_are_reused_without_page_faults():
    if not keep_freed_memory():
        pytest.skip("the C library is not glibc: nothing to tune")
    default, kept = _faults_per_round("default"), _faults_per_round("keep")
    assert default > 1000, f"glibc's defaults were expected to fault the pages in again ({default:.0f} per round)"
    assert kept < default / 10, f"{kept:.0f} page faults per round with the blocks kept, {default:.0f} without"


def test_configuring_a_task_process_keeps_freed_blocks():
    script = ("from trainer.runtime import allocator, process\n"
              "process.configure_process(1, None, 'tensorflow', {})\n"
              "print(allocator._applied)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(keep_freed_memory())
