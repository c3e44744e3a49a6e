"""An elastic fit's task: one pass of one epoch over one chunk of the rows, in whichever Python worker Spark picks.

An elastic fit (``trainer.fit.elastic``) cuts the rows into chunks and runs
every epoch as one Spark job of one task per chunk
(``trainer.spark.elastic_launch``). `train_chunk` is that task:

1. **The process.** Spark keeps a Python worker for the executor's next task;
   the first chunk task of a fit in a process builds the Keras model and keeps
   it (`_PROCESSES`, by the fit's id), with its optimizer's state and its
   exchange cadence, so the next chunks in that process only load the center.
   The time from the task's start to the model built is the process's time to
   ready, sent with its HELLO (``member``).
2. **HELLO** names the epoch, the process and whether this is its first task
   (cold: a synchronous round waits for it from its first commit, not while
   its first step compiles). The process also sends a heartbeat
   every `HEARTBEAT_S` seconds from its first task on, on a connection of
   its own (``trainer.ps.members``). The server may say wait (the
   fit already trains on its maximum of workers; the task asks again every
   half second) and says how many batches of this chunk and epoch earlier
   attempts committed (``committed_batches``): a task re-run after its
   executor was lost skips them, so every row of the epoch is trained once.
3. **One pass** over the chunk in a fixed order (seeded by the fit's seed, the
   epoch and the chunk, the same for every attempt) with the worker's
   ``ParameterServerSync`` callback (``trainer.runtime.ps_worker.exchange``),
   whose commits count their batches; the batches left after the last window
   are committed before EPOCH_DONE, whose validation metrics are the center's on
   the chunk's validation rows.

The task's record (its stage row) names its chunk, epoch, Spark attempt and
process, the batches it skipped and the rows it trained.
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from trainer.ps.members import HEARTBEAT_S
from trainer.ps.shard_client import connect_ps
from trainer.runtime.collective.rates import ScaledRate
from trainer.runtime.process import executor_id, holding_cores, start_task
from trainer.runtime.ps_worker.exchange import make_sync_callback
from trainer.runtime.ps_worker.worker_task import WorkerConfig
from trainer.runtime.stage_result import result_batch
from trainer.runtime.state import load_state
from trainer.runtime.task_prologue import fresh_keras, receive_rows

#: Seconds a task waits before asking again when the server says wait (the fit trains on its maximum).
WAIT_S = 0.5


@dataclass(kw_only=True)
class ChunkConfig(WorkerConfig):
    """A chunk task's `WorkerConfig` and its epoch, the fit's id and the number of chunks (`num_workers` is the
    fit's maximum of workers)."""

    epoch: int
    fit_id: str
    chunks: int


@dataclass
class _Process:
    """What a Python worker keeps between the chunk tasks of one fit."""

    model: Any
    ready_s: float
    executor: str | None = None
    rate: Any = None  # the compiled learning rate scaled for the fit (elastic local SGD's), or None
    cadence: Any = None
    chunks: int = 0
    heartbeat: threading.Thread | None = None


_PROCESSES: dict[str, _Process] = {}


def train_chunk(config: ChunkConfig, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """One chunk task (the function given to ``mapInArrow``); its cores are given back at its end."""
    return holding_cores(_train_chunk(config, batches))


def _train_chunk(config: ChunkConfig, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    from pyspark import TaskContext  # the task's context: imported where a task runs

    start = start_task(TaskContext, config.keras_backend, config.env)
    chunk = start.index
    shard, validation, data_ready = receive_rows(config, batches, feed="memory")
    process = _process(config, chunk, start.time)
    member = {"host": socket.gethostname(), "pid": os.getpid(), "ready_s": process.ready_s,
              "executor": process.executor}
    if process.heartbeat is None:
        process.heartbeat = threading.Thread(target=_beat, args=(config, chunk, member), daemon=True,
                                             name="trainer-heartbeat")
        process.heartbeat.start()
    record: dict[str, Any] = {
        "worker": chunk, "chunk": chunk, "attempt": 0, "epoch": config.epoch,
        "spark_attempt": start.ctx.attemptNumber(), "member": f"{member['host']}:{member['pid']}",
        "first_in_process": process.chunks == 0, "ready_s": process.ready_s,
        "rows": shard.rows, "task_start": start.time, "data_ready": data_ready, "model_built": time.time(),
        "commits": 0, "comm_s": 0.0, "epochs": [], "executor_pid": os.getpid(), **start.devices, **shard.info(),
        "exchange_s": {"state": 0.0, "payload": 0.0, "round_trip": 0.0, "load": 0.0},
    }
    process.chunks += 1
    client = connect_ps([(config.ps_host, config.ps_ports[0])], config.secret, chunk, config.attempt,
                        config.io_timeout, reply_codec=getattr(config.algorithm, "reply_codec", None))
    with client:
        _one_pass(config, client, process, chunk, shard, validation, member, record, start.ctx.taskAttemptId())
        record.update(bytes_sent=client.bytes_sent, bytes_received=client.bytes_received)
    shard.close()
    yield result_batch(chunk, record)


def _one_pass(config: ChunkConfig, client, process: _Process, chunk: int, shard, validation, member: dict[str, Any],
              record: dict[str, Any], task: int) -> None:
    """HELLO, then one pass over the chunk's batches its earlier attempts did not commit (the module docstring)."""
    model = process.model
    center, meta = _hello(client, config.epoch, member, cold=process.cadence is None, task=task)
    load_state(model, list(center), with_optimizer=config.algorithm.exchanges_optimizer_state, strict=False)
    skipped = int(meta.get("committed_batches", 0))
    order = np.random.default_rng([config.seed, config.epoch, chunk]).permutation(shard.rows)
    order = order[skipped * config.batch_size:]
    chunk_batches = math.ceil(shard.rows / config.batch_size)
    callback = make_sync_callback(client, config.algorithm, chunk, record, None,
                                  validation if len(validation[0]) else None, config.validation_batch_size,
                                  overlap=config.overlap, epoch_batches=chunk_batches * config.chunks,
                                  workers=config.num_workers, count_batches=True)
    callback.rate = process.rate
    if process.cadence is not None:
        callback.cadence = process.cadence  # the window the process sized on its earlier chunks
    else:  # a joiner: no warm-up of its own when the fit's is over
        callback.cadence.fit_at(int(meta.get("version", 0)))
    callback.begin(model, int(meta.get("version", 0)))
    callback.step = config.epoch * chunk_batches + skipped  # the chunk's steps over the fit (progress)
    callback.start_epoch(config.epoch)
    train_start = time.time()
    if len(order):
        feed = shard.feed(seed=None)
        model.fit(**feed.fit_kwargs(config.batch_size, order=order), epochs=config.epoch + 1,
                  initial_epoch=config.epoch, verbose=0, callbacks=[callback])
        if callback.cadence.window is not None and callback.since and not callback.stopped:
            callback.exchange(callback.logs)  # the batches after the last window, before EPOCH_DONE
    callback.finish_epoch()
    callback.finish()
    process.cadence = callback.cadence
    record.update(train_s=time.time() - train_start, end=time.time(), steps=callback.step, skipped_batches=skipped,
                  trained_rows=len(order), stopped=callback.stopped)


def _process(config: ChunkConfig, chunk: int, task_start: float) -> _Process:
    """This Python worker's model for the fit, built by its first chunk task (other fits' models dropped)."""
    process = _PROCESSES.get(config.fit_id)
    if process is not None:
        return process
    _PROCESSES.clear()
    fresh_keras(config.seed + chunk)
    model = config.model.build()
    if config.algorithm.exchanges_optimizer_state:
        model.optimizer.build(model.trainable_variables)
    process = _PROCESSES[config.fit_id] = _Process(model, time.time() - task_start, executor_id())
    factor = getattr(config.algorithm, "rate_factor", 1.0)
    if factor != 1.0:  # elastic local SGD: the rate of a fixed fit of the maximum of workers
        process.rate = ScaledRate(model, factor)
        process.rate.apply()
    return process


def _beat(config: ChunkConfig, chunk: int, member: dict[str, Any]) -> None:
    """This process's heartbeat to the server, every `HEARTBEAT_S` seconds while the fit is this process's; it
    ends quietly when the server goes (the fit ended) or another fit takes the process."""
    try:
        with connect_ps([(config.ps_host, config.ps_ports[0])], config.secret, chunk, config.attempt,
                        config.io_timeout) as client:
            while config.fit_id in _PROCESSES:
                client.hello({"heartbeat": True, "member": member})
                time.sleep(HEARTBEAT_S)
    except Exception:  # the server stopped: nothing to tell
        return


def _hello(client, epoch: int, member: dict[str, Any], cold: bool, task: int) -> tuple[list, dict[str, Any]]:
    """HELLO until the server admits this task (it says wait while the fit trains on its maximum of workers);
    `cold`: the process's first task, whose first step compiles (a round waits for it from its first commit);
    `task`: its Spark task attempt, refused if the driver killed it (``trainer.ps.members``)."""
    while True:
        center, meta = client.hello({"epoch": epoch, "member": member, "cold": cold, "task": task})
        if not meta.get("wait"):
            return center, meta
        time.sleep(WAIT_S)
