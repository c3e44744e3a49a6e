"""The task-side training loop: one long-lived Spark barrier task per worker.

`train_partition` runs inside a Python worker of an executor. It receives its
shard as Arrow record batches and holds it in memory, or streams a large one
through a local spill file (`trainer.runtime.feeding.shard`), builds the Keras model
once, pulls the center weights from the parameter server (from each of its
shards, see `trainer.ps.shard_client`), and trains with
plain ``model.fit`` on a single-threaded input pipeline (`trainer.runtime.feeding.feed`
or `trainer.runtime.feeding.stream`). The ``ParameterServerSync`` Keras callback
(`trainer.runtime.ps_worker.exchange`) does the exchange every ``window`` batches, at
every epoch end, or on a window sized by time, through the algorithm's pure
worker algorithms. It yields one Arrow record with the worker's history.

Validation. With validation rows in its shard (``trainer.data.validation``),
a worker evaluates the CENTER model (pulled from the server) on them at the end
of every epoch and reports the metrics with EPOCH_DONE; the driver weights
them by each worker's validation rows. The server's directives in its
replies are honoured: ``stop`` ends training at the next exchange (the
driver's EarlyStopping), ``learning_rate`` sets the optimizer's rate.

Epochs. Synchronous algorithms need every worker at every round, so each worker
makes exactly one pass over its own shard per epoch. Asynchronous algorithms with a
window *share* each epoch by default: the parameter server counts the batches
all workers report, and an epoch ends for everybody once they add up to one
pass over all the data. On a shared or uneven machine one worker often runs
20-30 % slower than another (measured on the 2-vCPU development machine); with
fixed passes the fast one would sit idle while the slow one finishes, with
shared epochs the fast one does more batches (another reshuffled pass over
its own shard) and the slow one fewer.

It knows nothing about how it was launched beyond the Spark task context,
which it imports when a task starts: this module imports neither pyspark nor
a Keras backend, so the loop's parts run where neither is installed
(``make bench-gpu``).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any, Iterator

import pyarrow as pa

from trainer.algorithms import ParameterServerAlgorithm
from trainer.ps.shard_client import connect_ps
from trainer.runtime.memory import peak_rss_bytes, reset_peak_rss
from trainer.runtime.process import holding_cores
from trainer.runtime.shipping import ModelSource
from trainer.runtime.stage_result import result_batch
from trainer.runtime.state import load_state
from trainer.runtime.ps_worker.exchange import make_sync_callback
from trainer.runtime.task_config import TaskConfig
from trainer.runtime.task_prologue import fresh_keras, receive_rows, start_barrier_task



@dataclass(kw_only=True)
class WorkerConfig(TaskConfig):
    """Everything a parameter-server worker task needs (`TaskConfig` and the algorithm, the server's ports)."""

    model: ModelSource
    algorithm: ParameterServerAlgorithm
    ps_ports: tuple[int, ...]  # one per shard of the parameter server, shard 0 first
    share_epochs: bool = True
    overlap: bool = False  # commit in the background, fold the reply a window later (delta algorithms)


def epoch_batches_budget(shard_rows: int, batch_size: int, num_workers: int) -> int:
    """Minibatches in one epoch over all workers: one pass over every (padded) shard."""
    return math.ceil(shard_rows / batch_size) * num_workers


def train_partition(config: WorkerConfig, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """One barrier task (the function given to ``mapInArrow(barrier=True)``); its cores are given back at its end."""
    return holding_cores(_train_partition(config, batches))


def _train_partition(config: WorkerConfig, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    start = start_barrier_task(config.keras_backend, config.env)
    task_start, ctx, worker, devices = start.time, start.ctx, start.index, start.devices
    reset_peak_rss()
    shard, validation, data_ready = receive_rows(config, batches)
    sizes = [int(s) for s in ctx.allGather(str(shard.rows))]
    if min(sizes) == 0:
        raise RuntimeError(
            f"Worker shards have sizes {sizes}: at least one worker received no rows. "
            "Use fewer workers or more rows."
        )
    shard.pad_to(max(sizes), seed=config.seed + worker)

    fresh_keras(config.seed + 1000 * config.attempt + worker)
    model = config.model.build()
    built = time.time()
    record: dict[str, Any] = {
        "worker": worker, "attempt": config.attempt, "rows": sizes[worker], "padded_rows": shard.padded_rows,
        "task_start": task_start, "data_ready": data_ready, "model_built": built,
        "commits": 0, "comm_s": 0.0, "epochs": [], "executor_pid": os.getpid(), **devices, **shard.info(),
        "exchange_s": {"state": 0.0, "payload": 0.0, "round_trip": 0.0, "load": 0.0},
    }
    client = connect_ps([(config.ps_host, port) for port in config.ps_ports], config.secret, worker,
                        config.attempt, config.io_timeout, split=config.algorithm.split_payload,
                        reply_codec=getattr(config.algorithm, "reply_codec", None))
    with client:
        center, meta = client.hello()
        start_epoch = int(meta.get("start_epoch", 0))
        load_state(model, list(center), with_optimizer=config.algorithm.exchanges_optimizer_state, strict=False)
        record["start_epoch"] = start_epoch
        shared = config.share_epochs and not config.algorithm.synchronous and config.algorithm.window is not None
        epoch_batches = epoch_batches_budget(shard.padded_rows, config.batch_size, len(sizes))
        record["shared_epochs"] = shared
        callback = make_sync_callback(client, config.algorithm, worker, record, epoch_batches if shared else None,
                                      validation if len(validation[0]) else None, config.validation_batch_size,
                                      overlap=config.overlap, epoch_batches=epoch_batches, workers=len(sizes))
        callback.begin(model, int(meta.get("version", 0)))
        feed = shard.feed(seed=config.seed + 1000 * config.attempt + worker)
        train_start, cpu_start = time.time(), time.process_time()
        for epoch in range(start_epoch, config.epochs):
            callback.start_epoch(epoch)
            # A shared epoch ends when the server has counted `epoch_batches` batches from all
            # workers: a faster worker goes on with a reshuffled pass over its shard,
            # a slower one stops early, and nobody waits for a straggler.
            while True:
                model.fit(**feed.fit_kwargs(config.batch_size), epochs=epoch + 1, initial_epoch=epoch, verbose=0,
                          callbacks=[callback])
                if not shared or callback.epoch_over or callback.stopped:
                    break
            callback.finish_epoch()
            if callback.stopped:
                record["stopped_at_epoch"] = epoch
                break
        callback.finish()
        train_s = time.time() - train_start
        record.update(
            train_s=train_s, end=time.time(), steps=callback.step,
            # cores this process kept busy while training (CPU seconds over wall seconds): at most the task's
            cores_used=(time.process_time() - cpu_start) / max(train_s, 1e-9),
            bytes_sent=client.bytes_sent, bytes_received=client.bytes_received, peak_rss_bytes=peak_rss_bytes(),
        )
    shard.close()  # deletes a spill file now (after a failure, when the shard is garbage-collected)
    yield result_batch(worker, record)
