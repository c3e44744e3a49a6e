"""The worker process's resident memory, read from ``/proc`` (Linux; None elsewhere).

A training task resets the kernel's high-water mark of its process's resident
set size (RSS) when it starts and reads it when it ends: Python workers are
reused from task to task, and without the reset a task would report the peak
of an earlier one. The history records the result (``peak_rss_bytes``); the
out-of-core benchmark compares it with the shard's size.
"""

from __future__ import annotations

import os

_STATUS = "/proc/self/status"


def reset_peak_rss() -> bool:
    """Set this process's peak RSS (``VmHWM``) back to its current RSS; False where that is impossible."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # 5: reset the peak RSS only (Documentation/filesystems/proc.rst)
        return True
    except OSError:
        return False


def _status_kib(field: str) -> int | None:
    try:
        with open(_STATUS) as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def rss_bytes() -> int | None:
    """This process's resident set size now (``VmRSS``), or None."""
    kib = _status_kib("VmRSS")
    return None if kib is None else kib * 1024


def peak_rss_bytes() -> int | None:
    """This process's peak resident set size since it started or since `reset_peak_rss` (``VmHWM``), or None."""
    kib = _status_kib("VmHWM")
    return None if kib is None else kib * 1024


def pyspark_memory_bytes() -> int | None:
    """The Python worker's memory limit that Spark sets from ``spark.executor.pyspark.memory``
    (per task slot, in ``PYSPARK_EXECUTOR_MEMORY_MB``), or None when it is not set."""
    value = os.environ.get("PYSPARK_EXECUTOR_MEMORY_MB")
    try:
        return int(value) * 1024 * 1024 if value else None
    except ValueError:
        return None
