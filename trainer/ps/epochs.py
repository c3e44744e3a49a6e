"""Which epochs a run has finished, from the parameter server's per-worker progress (pure)."""

from __future__ import annotations

import time
from typing import Any


def completed_epochs(epochs_done: dict[int, dict[str, Any]], num_workers: int) -> int:
    """Epochs that every worker ``0 .. num_workers - 1`` finished (0 when one finished none)."""
    done = [epochs_done.get(w) for w in range(num_workers)]
    return 0 if None in done else min(d["epoch"] for d in done) + 1  # type: ignore[index]


def uniform_progress(completed: int, num_workers: int) -> dict[int, dict[str, Any]]:
    """Per-worker progress saying that each of `num_workers` workers finished `completed` epochs.

    Used when the number of workers changes (a retry on fewer workers, a resume
    on another cluster): rows are dealt anew, so only the epochs everybody
    finished carry over.
    """
    if completed <= 0:
        return {}
    return {w: {"epoch": completed - 1, "logs": {}, "time": time.time()} for w in range(num_workers)}
