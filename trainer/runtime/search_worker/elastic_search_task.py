"""An elastic search's task: one chunk of the rows served to the model hopper, in whichever Python worker Spark picks.

An elastic search (``ModelSelector(num_workers=(min, max))``) cuts its rows
into `max` chunks that Spark keeps and runs ordinary (not barrier) jobs of one
task per chunk (``trainer.spark.elastic_launch``, driven by
``trainer.selection.engine.elastic_search``). `serve_chunk` is that task:

1. **The process.** Spark keeps a Python worker for the executor's next task;
   the first task of a search in a process seeds Keras and keeps the built
   models there (`_PROCESSES`, by the search's id), so a later chunk in the
   same process builds and compiles nothing, and the driver does not send a
   state the process produced last (``keep``).
2. **HELLO** names the chunk's job (``round``), the process and its executor (a
   decommissioned executor's task ends after its unit in flight); the connection
   authenticates as worker = the chunk, attempt = Spark's task attempt id
   (unique in the application: a retried task is told apart from the lost one).
   The driver may say stop at once (a newer task holds the chunk, or no model
   needs it any more).
3. **Serve**: the fixed search's loop (`serve_units`): train what the driver
   hands out on this chunk, one sub-epoch at a time, until it says stop.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import pyarrow as pa

from trainer.runtime.process import executor_id, holding_cores, start_task
from trainer.runtime.search_worker.search_task import ConfigBuild, ModelCache, TaskSpec, load_shard, serve_units, \
    unit_totals
from trainer.runtime.stage_result import result_batch
from trainer.runtime.task_prologue import fresh_keras


@dataclass
class _SearchProcess:
    """What a Python worker keeps between the chunk tasks of one search."""

    keras: Any
    cache: ModelCache = field(default_factory=ModelCache)
    late: dict[str, ConfigBuild] = field(default_factory=dict)
    tasks: int = 0


_PROCESSES: dict[str, _SearchProcess] = {}


def serve_chunk(spec: TaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """One chunk task (the function given to ``mapInArrow``); its cores are given back at its end."""
    return holding_cores(_serve_chunk(spec, batches))


def _serve_chunk(spec: TaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    from pyspark import TaskContext  # the task's context: imported where a task runs

    start = start_task(TaskContext, spec.keras_backend, spec.env)
    chunk, task = start.index, int(start.ctx.taskAttemptId())
    data = load_shard(spec, batches)
    process = _PROCESSES.get(spec.search_id)
    if process is None:
        _PROCESSES.clear()  # another search's models
        process = _PROCESSES[spec.search_id] = _SearchProcess(fresh_keras(spec.task_seed + chunk))
    name = f"{socket.gethostname()}:{os.getpid()}"
    record = unit_totals({"worker": chunk, "chunk": chunk, "round": spec.round, "attempt": task,
                          "spark_attempt": start.ctx.attemptNumber(), "process": name,
                          "first_in_process": process.tasks == 0, "task_start": start.time,
                          "executor_pid": os.getpid(), **data.info, **start.devices})
    process.tasks += 1
    with spec.connect(chunk, task, spec.io_timeout) as client:
        reply = client.hello({"round": spec.round, "process": name, "rows": data.info["rows"],
                              "val_rows": data.info["val_rows"], "data_bytes": data.info["data_bytes"],
                              "pid": os.getpid(), "executor": executor_id()})
        if not reply.get("stop"):
            serve_units(client, spec, process.keras, process.cache, process.late, data, record)
        record.update(end=time.time(), bytes_sent=client.bytes_sent, bytes_received=client.bytes_received,
                      served=not reply.get("stop"))
    yield result_batch(chunk, record)
