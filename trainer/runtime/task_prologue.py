"""The prologue the training tasks repeat, written once: start, receive the rows, start Keras afresh.

Every training task (``ps_worker/worker_task.py``, ``ps_worker/chunk_task.py``,
``collective/collective_task.py``, ``search_worker/search_task.py``) begins
the same way, in this order:

1. set up its process and read its Spark context (`start_barrier_task`, or
   ``trainer.runtime.process.start_task`` for a task that is not a barrier
   task: the time, the context, the partition, the devices for the record);
2. receive its rows: Arrow to numpy, the shard in memory or in a spill file,
   the validation rows apart (`receive_rows`; the model-selection task, which
   keeps both sets in memory in a canonical order, reads its own);
3. import Keras after its process was set up (TensorFlow reads its settings
   when it starts), clear the session a reused Python worker kept and seed it
   (`fresh_keras`).

The collective task starts no Keras in the task's own process (its training
process does) and only reads its context and resources; it shares step 2.
Nothing here imports pyspark or a Keras backend at module level.
"""

from __future__ import annotations

import time
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from trainer.runtime.feeding.arrow import ValidationRows
from trainer.runtime.feeding.shard import MemoryShard, SpilledShard, receive_shard, shard_budget
from trainer.runtime.process import TaskStart, start_task
from trainer.runtime.task_config import TaskConfig

__all__ = ["start_barrier_task", "receive_rows", "fresh_keras"]


def start_barrier_task(keras_backend: str, env: dict[str, str]) -> TaskStart:
    """`start_task` for a barrier task; pyspark's context is imported here, where a task runs."""
    from pyspark import BarrierTaskContext

    return start_task(BarrierTaskContext, keras_backend, env)


def receive_rows(config: TaskConfig, batches: Iterator[pa.RecordBatch], feed: str | None = None,
                 ) -> tuple[MemoryShard | SpilledShard, tuple[np.ndarray, np.ndarray], float]:
    """(the shard, the validation rows (x, y), the time they were read) of a task's record batches: the shard in
    memory or streamed through a local spill file (``trainer.runtime.feeding.shard``; `feed` instead of the
    config's), the validation rows (if any) kept aside in memory."""
    rows = ValidationRows(batches)
    shard = receive_shard(iter(rows), config.input_shape, config.label_size, feed=feed or config.feed,
                          budget=shard_budget(config.shard_budget, config.task_memory))
    return shard, rows.arrays(config.input_shape, config.label_size), time.time()


def fresh_keras(seed: int) -> Any:
    """Keras, imported after the task's process was set up, its session cleared and its random state seeded."""
    import keras  # after start_task: TensorFlow reads its settings when it starts

    keras.backend.clear_session()
    keras.utils.set_random_seed(seed)
    return keras
