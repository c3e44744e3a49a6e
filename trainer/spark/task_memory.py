"""The memory Spark gives one task, read from a session's configuration (for the workers' shard budget)."""

from __future__ import annotations

from trainer.spark.java import parse_memory_mb


def task_memory_bytes(spark) -> int | None:
    """``spark.executor.memory`` divided over an executor's task slots (``spark.executor.cores`` /
    ``spark.task.cpus``), in bytes; None when the session does not say (a Spark Connect server may not)."""

    def setting(key: str) -> str | None:
        try:
            return spark.conf.get(key, None)
        except Exception:  # Spark Connect may refuse to show a static setting: then it is unknown
            return None

    memory = setting("spark.executor.memory")
    if not memory:
        return None
    try:
        total = parse_memory_mb(memory) * 1024 * 1024
        slots = max(1, int(setting("spark.executor.cores") or 1) // max(1, int(setting("spark.task.cpus") or 1)))
    except ValueError:
        return None
    return total // slots
