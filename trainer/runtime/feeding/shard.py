"""A worker's shard as it arrives from Spark, held in memory or streamed from local disk.

`receive_shard` reads the task's Arrow record batches once and decides how
to hold them (``Trainer(feed=...)``):

* ``"memory"``: numpy arrays, fed by `trainer.runtime.feeding.feed.ShardFeed`;
* ``"stream"``: a spill file in the executor's local directory
  (`trainer.runtime.feeding.spill`), fed by `trainer.runtime.feeding.stream.StreamFeed`;
* ``"auto"`` (the default): the batches are held in memory while their Arrow
  size stays within `budget` bytes; the first batch past it sends the
  batches held so far and all the following ones to a spill file. Small
  shards thus keep the in-memory path and nothing is written to disk.

The budget: ``Trainer(shard_budget_mb=...)`` when given, else a quarter of
the Python worker's memory limit (``spark.executor.pyspark.memory`` per
task, when set), else a quarter of ``spark.executor.memory`` per task slot
(worked out on the driver by ``trainer.spark.cluster_facts.task_memory_bytes``),
else `DEFAULT_BUDGET`. A quarter, because the in-memory path holds the shard up to four times at its
peak (the Arrow batches, one numpy copy, the padded copy, TensorFlow's
tensors); the streamed path holds a few buffers whatever the shard's size.

Both kinds share one interface: ``rows``, ``pad_to`` (repeat random rows so
that every worker has as many rows as the largest shard), ``feed`` and
``close``.
"""

from __future__ import annotations

import weakref
from typing import Iterator

import numpy as np
import pyarrow as pa

from trainer.runtime.feeding.arrow import arrow_to_numpy, pad_shard
from trainer.runtime.feeding.feed import ShardFeed
from trainer.runtime.memory import pyspark_memory_bytes
from trainer.runtime.feeding.spill import Spill
from trainer.runtime.feeding.stream import StreamFeed

FEEDS = ("auto", "memory", "stream")
MEMORY_FACTOR = 4  # the in-memory path's peak holds the shard about this many times
DEFAULT_BUDGET = 256 << 20


def shard_budget(explicit: int | None = None, task_memory: int | None = None) -> int:
    """Arrow bytes a shard may have and still be held in memory (see the module docstring)."""
    if explicit is not None:
        return int(explicit)
    limit = pyspark_memory_bytes() or task_memory
    return int(limit) // MEMORY_FACTOR if limit else DEFAULT_BUDGET


class MemoryShard:
    """The shard as numpy arrays."""

    kind = "memory"

    def __init__(self, x: np.ndarray, y: np.ndarray, received_bytes: int) -> None:
        self.x, self.y = x, y
        self.rows = len(x)
        self.received_bytes = received_bytes

    @property
    def padded_rows(self) -> int:
        return len(self.x)

    def pad_to(self, size: int, seed: int) -> None:
        self.x, self.y = pad_shard(self.x, self.y, size, seed=seed)

    def feed(self, seed: int | None) -> ShardFeed:
        return ShardFeed(self.x, self.y, seed=seed)

    def info(self) -> dict:
        return {"feed": self.kind, "shard_bytes": self.received_bytes, "spill_bytes": 0}

    def close(self) -> None:
        self.x = self.y = None  # type: ignore[assignment]


class SpilledShard:
    """The shard in a spill file on local disk; the file is deleted by `close` (or when the shard is
    garbage-collected, e.g. after a failed task)."""

    kind = "stream"

    def __init__(self, spill: Spill) -> None:
        spill.flush()
        self.spill = spill
        self.rows = spill.rows
        self._finalizer = weakref.finalize(self, spill.remove)

    @property
    def padded_rows(self) -> int:
        return self.spill.rows

    def pad_to(self, size: int, seed: int) -> None:
        """Append `size` - rows random repeats of the shard's rows (the in-memory path's `pad_shard`)."""
        missing = size - self.spill.rows
        if missing > 0:
            self.spill.append_arrays(*self.spill.take(np.random.default_rng(seed).integers(0, self.rows, missing)))
        self.spill.close_writer()

    def feed(self, seed: int | None) -> StreamFeed:
        self.spill.close_writer()
        return StreamFeed(self.spill, seed=seed)

    def info(self) -> dict:
        return {"feed": self.kind, "shard_bytes": self.spill.received_bytes, "spill_bytes": self.spill.nbytes}

    def close(self) -> None:
        self._finalizer()


def receive_shard(batches: Iterator[pa.RecordBatch], input_shape: tuple[int, ...], label_size: int | None, *,
                  feed: str = "auto", budget: int = DEFAULT_BUDGET,
                  directory: str | None = None) -> MemoryShard | SpilledShard:
    """Read the task's record batches once into a `MemoryShard` or a `SpilledShard` (module docstring)."""
    if feed not in FEEDS:
        raise ValueError(f"feed must be one of {', '.join(FEEDS)}. Received: feed={feed!r}")
    held: list[pa.RecordBatch] = []
    size = 0
    batches = iter(batches)
    for batch in batches:
        held.append(batch)
        size += batch.nbytes
        if feed == "stream" or (feed == "auto" and size > budget):
            break
    else:
        if feed != "stream":
            x, y = arrow_to_numpy(held, input_shape, label_size)
            return MemoryShard(x, y, size)
    spill = Spill(input_shape, label_size, directory)
    try:
        for batch in held:
            spill.append(batch)
        del held
        for batch in batches:
            spill.append(batch)
    except BaseException:
        spill.remove()
        raise
    return SpilledShard(spill)
