"""The task-side training loop: one long-lived Spark barrier task per worker.

`train_partition` runs inside a Python worker of an executor. It receives its
shard as Arrow record batches and holds it in memory, or streams a large one
through a local spill file (`trainer.runtime.shard`), builds the Keras model
once, pulls the center weights from the parameter server (from each of its
shards, see `trainer.ps.shard_client`), and trains with
plain ``model.fit`` on a single-threaded input pipeline (`trainer.runtime.feed`
or `trainer.runtime.stream`). The `ParameterServerSync`
Keras callback does the exchange every ``window`` batches (or at every epoch
end) through the algorithm's pure worker rules.
It yields one Arrow record with the worker's history.

Validation. With validation rows in its shard (``trainer.data.validation``),
a worker evaluates the CENTER model (pulled from the server) on them at the end
of every epoch and reports the metrics with EPOCH_DONE; the driver weights
them by each worker's validation rows. The server's directives in its
replies are honoured: ``stop`` ends training at the next exchange (the
driver's EarlyStopping), ``learning_rate`` sets the optimizer's rate.

Epochs. Synchronous rules need every worker at every round, so each worker
makes exactly one pass over its own shard per epoch. Asynchronous rules with a
window *share* each epoch by default: the parameter server counts the batches
all workers report, and an epoch ends for everybody once they add up to one
pass over all the data. On a shared or uneven machine one worker often runs
20-30 % slower than another (measured on the 2-vCPU development machine); with
fixed passes the fast one would sit idle while the slow one finishes, with
shared epochs the fast one does more batches (another reshuffled pass over
its own shard) and the slow one fewer.

It knows nothing about how it was launched beyond the Spark task context.
"""

from __future__ import annotations

import json
import math
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
from pyspark import BarrierTaskContext

from trainer.algorithms import Algorithm
from trainer.algorithms.delta import fold_late, overlappable
from trainer.ps.shard_client import connect_ps
from trainer.runtime.arrow import ValidationRows
from trainer.runtime.inference import validation_logs
from trainer.runtime.memory import peak_rss_bytes, reset_peak_rss
from trainer.runtime.process import setup_barrier_task
from trainer.runtime.shard import receive_shard, shard_budget
from trainer.runtime.shipping import ModelSource
from trainer.runtime.state import load_state, model_state

RESULT_SCHEMA = pa.schema([("worker", pa.int32()), ("history", pa.string())])
RESULT_DDL = "worker int, history string"


@dataclass
class WorkerConfig:
    """Everything a worker task needs; serialized into the Spark task closure."""

    model: ModelSource
    algorithm: Algorithm
    ps_host: str
    ps_ports: tuple[int, ...]  # one per shard of the parameter server, shard 0 first
    secret: Any = field(repr=False)  # the server's Credentials (secret, frame MAC, TLS fingerprint): never shown
    num_workers: int
    batch_size: int
    epochs: int
    input_shape: tuple[int, ...]
    label_size: int | None
    attempt: int = 0
    seed: int = 0
    io_timeout: float = 600.0
    keras_backend: str = "tensorflow"
    env: dict[str, str] = field(default_factory=dict)
    share_epochs: bool = True
    validation_batch_size: int = 256
    feed: str = "auto"  # how the shard is held: trainer.runtime.shard
    shard_budget: int | None = None  # bytes; None: derived from task_memory or the worker's limit
    task_memory: int | None = None  # spark.executor.memory per task slot, in bytes, if known
    overlap: bool = False  # commit in the background, fold the reply a window later (delta rules)


def epoch_batches_budget(shard_rows: int, batch_size: int, num_workers: int) -> int:
    """Minibatches in one epoch over all workers: one pass over every (padded) shard."""
    return math.ceil(shard_rows / batch_size) * num_workers


def make_sync_callback(client, algorithm: Algorithm, worker: int, record: dict, budget: int | None,
                       validation: tuple | None = None, validation_batch_size: int = 256, overlap: bool = False):
    """Build the Keras callback (imported lazily: keras must load after configure_process).

    `budget` is the number of minibatches in one epoch over all workers when
    the workers share each epoch (asynchronous rules with a window), else None;
    `validation` is this worker's (x, y) validation rows, or None. With
    `overlap` (delta rules with a window only) a commit's round trip runs on a
    thread of its own while the next window trains; its reply is folded in at
    the next exchange (``trainer.algorithms.delta.fold_late``), and every
    epoch end waits for it.
    """
    import keras  # deferred: TensorFlow starts only when a model is needed

    class ParameterServerSync(keras.callbacks.Callback):
        """Exchanges with the parameter server every `window` batches; ends shared epochs.

        One instance lives through every ``fit`` call of a task: `begin` once,
        then `start_epoch`/`finish_epoch` around the passes of each epoch, then
        `finish`.
        """

        def __init__(self) -> None:
            super().__init__()
            self.with_optimizer = algorithm.exchanges_optimizer_state
            self.since = 0
            self.step = 0
            self.epoch = 0
            self.epoch_over = False
            self.stopped = False  # the driver said stop
            self.logs: dict[str, float] = {}
            self.anchor: list[np.ndarray] = []
            self.residual: list[np.ndarray] | None = None  # what a lossy codec left for the next commit
            self.overlap = overlap and overlappable(algorithm)
            self.in_flight: Future | None = None  # the commit whose reply is not folded in yet (overlap)
            # Center versions: of the connection's last reply, and of the center the weights stem from
            # (older with a commit in flight, or after a validation pull); the difference is staleness
            # the server cannot see (COMMIT meta "unseen", trainer.ps.commits).
            self.seen_version = self.base_version = 0
            self.sender = ThreadPoolExecutor(1, thread_name_prefix="ps-commit") if self.overlap else None

        def begin(self, model, version: int = 0) -> None:
            """Start from the center of version `version` (HELLO's) already loaded into `model`."""
            self.seen_version = self.base_version = version
            self.set_model(model)
            if self.with_optimizer:
                model.optimizer.build(model.trainable_variables)
            self.anchor = model_state(model, self.with_optimizer)

        def start_epoch(self, epoch: int) -> None:
            self.epoch, self.epoch_over = epoch, False
            record["epochs"].append({"epoch": epoch, "start": time.time(), "batches": 0})

        # The exchange runs when the next batch begins or the pass ends, never in a batch-END
        # hook: with one, Keras turns every batch's logs into Python floats on the training
        # thread; without, it does so on its own thread, as for plain Keras.
        def on_train_batch_begin(self, batch, logs=None):
            if algorithm.window is not None and self.since >= algorithm.window and not self.stopped:
                self.exchange(None)
            self.step += 1
            self.since += 1
            record["epochs"][-1]["batches"] += 1

        def on_epoch_end(self, epoch, logs=None):
            self.logs = {k: float(v) for k, v in (logs or {}).items()}
            if algorithm.window is not None and self.since >= algorithm.window and not self.stopped:
                self.exchange(self.logs)

        def running_loss(self) -> float:
            """The epoch's mean training loss so far (Keras's loss tracker), without waiting for batch logs."""
            tracker = next((m for m in self.model.metrics if m.name == "loss"), None)
            return float("nan") if tracker is None else float(tracker.result())

        def finish_epoch(self) -> None:
            self.fold_in_flight()
            if algorithm.window is None and not self.stopped:
                self.exchange(self.logs)
            if self.stopped:
                return
            if validation is not None:
                self.logs.update(self.validate_center())
            record["epochs"][-1].update(end=time.time(), logs=self.logs)
            self.follow(client.epoch_done(self.epoch, self.logs))

        def validate_center(self) -> dict[str, float]:
            """The center's metrics on this worker's validation rows (its own weights stay)."""
            center, self.seen_version = client.pull()
            own = self.model.get_weights()
            self.model.set_weights(list(center[: len(own)]))
            logs = validation_logs(self.model, *validation, validation_batch_size)
            self.model.set_weights(own)
            return {**logs, "rows": float(record["rows"]), "val_rows": float(len(validation[0]))}

        def follow(self, meta: dict) -> None:
            """Honour the server's directives: a new learning rate, or stop."""
            rate = meta.get("learning_rate")
            if rate is not None and float(self.model.optimizer.learning_rate) != rate:
                self.model.optimizer.learning_rate = rate
            if meta.get("stop"):
                self.stopped = self.model.stop_training = True

        def finish(self) -> None:
            if self.since and not self.stopped:
                self.exchange(self.logs)
            self.fold_in_flight()
            if self.sender is not None:
                self.sender.shutdown()

        def exchange(self, logs) -> None:
            started = time.perf_counter()
            weights = model_state(self.model, self.with_optimizer)
            got_state = time.perf_counter()
            payload, self.residual = algorithm.worker_commit(weights, self.anchor, self.residual)
            encoded = time.perf_counter()
            loss = float(logs["loss"]) if logs and "loss" in logs else self.running_loss()
            meta = {"worker": worker, "epoch": self.epoch, "step": self.step, "loss": loss}
            if budget is not None:
                meta["batches"] = self.since
            if self.overlap:
                reply, reply_meta = self.wait_in_flight()
                self.seen_version = reply_meta.get("version", self.seen_version)
                self.note_unseen(meta, in_flight=reply is not None)
                replied = time.perf_counter()
                self.follow(reply_meta)
                if reply is None:  # nothing was in flight: the weights stay, the progress is on its way
                    self.anchor = weights
                else:
                    self.anchor = fold_late(reply, weights, self.anchor, out=weights)
                    load_state(self.model, self.anchor, with_optimizer=self.with_optimizer, strict=False)
                    self.base_version = self.seen_version
                # Sent once the reply is loaded: sealing and sending 4 MB on the other thread meanwhile
                # would compete with the fold and the load for the GIL and the memory bus.
                self.in_flight = self.sender.submit(client.commit, payload, meta)
            else:
                self.note_unseen(meta, in_flight=False)
                reply, reply_meta = client.commit(payload, meta)
                replied = time.perf_counter()
                self.stem_from(reply_meta)
                self.follow(reply_meta)
                if self.stopped and not reply:  # a synchronous round ended by the driver: nothing to apply
                    return
                new_weights, self.anchor = algorithm.worker_apply(weights, self.anchor, reply)
                load_state(self.model, new_weights, with_optimizer=self.with_optimizer, strict=False)
            self.since = 0
            record["commits"] += 1
            done = time.perf_counter()
            record["comm_s"] += done - started
            for part, seconds in (("state", got_state - started), ("payload", encoded - got_state),
                                  ("round_trip", replied - encoded), ("load", done - replied)):
                record["exchange_s"][part] += seconds
            self.check_epoch_over(reply_meta)

        def check_epoch_over(self, reply_meta: dict) -> None:
            """A shared epoch ends once the server counted its batches; ({}: no reply, nothing to check)."""
            if budget is not None and reply_meta and reply_meta.get("epoch_batches", budget) >= budget:
                self.epoch_over = True
                self.model.stop_training = True

        def note_unseen(self, meta: dict, in_flight: bool) -> None:
            """Tell the server the commits of the others that the payload's base has not seen beyond the
            last reply: with a commit in flight, whose reply counted that commit too (hence the
            -1), or after a validation pull."""
            unseen = self.seen_version - self.base_version - int(in_flight)
            if unseen > 0 and not algorithm.synchronous:
                meta["unseen"] = unseen

        def stem_from(self, reply_meta: dict) -> None:
            """The weights now stem from this reply's center, the connection's last."""
            self.base_version = self.seen_version = reply_meta.get("version", self.seen_version)

        def wait_in_flight(self) -> tuple[list[np.ndarray] | None, dict]:
            """The reply of the commit in flight (an error it met is raised here), or (None, {})."""
            pending, self.in_flight = self.in_flight, None
            return pending.result() if pending is not None else (None, {})

        def fold_in_flight(self) -> None:
            """Wait for the commit in flight and fold its reply in; the weights then have no progress in
            flight, so the anchor is the center itself."""
            if self.in_flight is None:
                return
            started = time.perf_counter()
            reply, reply_meta = self.wait_in_flight()
            weights = model_state(self.model, self.with_optimizer)
            folded = fold_late(reply, weights, self.anchor, out=weights)
            load_state(self.model, folded, with_optimizer=self.with_optimizer, strict=False)
            self.anchor = list(reply)
            self.stem_from(reply_meta)
            record["comm_s"] += time.perf_counter() - started
            self.follow(reply_meta)
            self.check_epoch_over(reply_meta)

    return ParameterServerSync()


def train_partition(config: WorkerConfig, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Body of one barrier task (the function given to ``mapInArrow(barrier=True)``)."""
    task_start = time.time()
    ctx = BarrierTaskContext.get()
    worker = ctx.partitionId()
    devices = setup_barrier_task(ctx, config.keras_backend, config.env)
    reset_peak_rss()

    # In memory, or streamed from a local spill file when the shard is large (trainer.runtime.shard);
    # validation rows (if any) are kept aside in memory.
    rows = ValidationRows(batches)
    shard = receive_shard(iter(rows), config.input_shape, config.label_size, feed=config.feed,
                          budget=shard_budget(config.shard_budget, config.task_memory))
    validation = rows.arrays(config.input_shape, config.label_size)
    data_ready = time.time()
    sizes = [int(s) for s in ctx.allGather(str(shard.rows))]
    if min(sizes) == 0:
        raise RuntimeError(
            f"Worker shards have sizes {sizes}: at least one worker received no rows. "
            "Use fewer workers or more rows."
        )
    shard.pad_to(max(sizes), seed=config.seed + worker)

    import keras  # after setup_barrier_task: TensorFlow reads its settings when it starts

    keras.backend.clear_session()
    keras.utils.set_random_seed(config.seed + 1000 * config.attempt + worker)
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
        budget = epoch_batches_budget(shard.padded_rows, config.batch_size, len(sizes)) if shared else None
        record["shared_epochs"] = shared
        callback = make_sync_callback(client, config.algorithm, worker, record, budget,
                                      validation if len(validation[0]) else None, config.validation_batch_size,
                                      overlap=config.overlap)
        callback.begin(model, int(meta.get("version", 0)))
        feed = shard.feed(seed=config.seed + 1000 * config.attempt + worker)
        train_start = time.time()
        for epoch in range(start_epoch, config.epochs):
            callback.start_epoch(epoch)
            # A shared epoch ends when the server has counted `budget` batches from all
            # workers: a faster worker goes on with a reshuffled pass over its shard,
            # a slower one stops early, and nobody waits for a straggler.
            while True:
                model.fit(**feed.fit_kwargs(config.batch_size), epochs=epoch + 1, initial_epoch=epoch, verbose=0,
                          callbacks=[callback])
                if budget is None or callback.epoch_over or callback.stopped:
                    break
            callback.finish_epoch()
            if callback.stopped:
                record["stopped_at_epoch"] = epoch
                break
        callback.finish()
        record.update(
            train_s=time.time() - train_start, end=time.time(), steps=callback.step,
            bytes_sent=client.bytes_sent, bytes_received=client.bytes_received, peak_rss_bytes=peak_rss_bytes(),
        )
    shard.close()  # deletes a spill file now (after a failure, when the shard is garbage-collected)
    yield pa.RecordBatch.from_pydict(
        {"worker": [worker], "history": [json.dumps(record)]}, schema=RESULT_SCHEMA
    )
