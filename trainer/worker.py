"""The task-side training loop: one long-lived Spark barrier task per worker.

`train_partition` runs inside a Python worker of an executor. It receives its
shard as Arrow record batches, builds the Keras model once, pulls the center
weights from the parameter server, and trains with plain ``model.fit`` on a
single-threaded input pipeline (`trainer.feed`). The `ParameterServerSync`
Keras callback does the exchange every ``window`` batches (or at every epoch
end) through the algorithm's pure worker rules.
It yields one Arrow record with the worker's history.

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
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa

from .algorithms import Algorithm
from .data.validate import FEATURES, LABEL

RESULT_SCHEMA = pa.schema([("worker", pa.int32()), ("history", pa.string())])
RESULT_DDL = "worker int, history string"


@dataclass
class ModelSource:
    """How a task gets its model: a saved ``.keras`` file's bytes or a builder function."""

    keras_bytes: bytes | None = None
    builder: Callable[[], Any] | None = None
    custom_objects: dict[str, Any] | None = None

    def build(self):

        if self.builder is not None:
            return self.builder()
        return load_keras_bytes(self.keras_bytes, self.custom_objects)


@dataclass
class WorkerConfig:
    """Everything a worker task needs; serialized into the Spark task closure."""

    model: ModelSource
    algorithm: Algorithm
    ps_host: str
    ps_port: int
    secret: bytes
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


def load_keras_bytes(data: bytes, custom_objects=None):
    """Load a model saved with ``model.save('x.keras')`` from its bytes."""
    import keras

    with tempfile.TemporaryDirectory(prefix="trainer-model-") as tmp:
        path = os.path.join(tmp, "model.keras")
        with open(path, "wb") as fh:
            fh.write(data)
        return keras.saving.load_model(path, custom_objects=custom_objects, compile=True)


def model_to_bytes(model) -> bytes:
    with tempfile.TemporaryDirectory(prefix="trainer-model-") as tmp:
        path = os.path.join(tmp, "model.keras")
        model.save(path)
        with open(path, "rb") as fh:
            return fh.read()


def configure_process(cpus: int, gpus: list[str] | None, keras_backend: str, env: dict[str, str]) -> None:
    """Thread counts, GPU visibility and backend, set before TensorFlow/Keras is imported.

    TensorFlow and OpenMP read these variables when they start; a reused Python
    worker that already loaded TensorFlow keeps the pools of its first task,
    which had the same number of cores.
    """
    os.environ.update(env)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["KERAS_BACKEND"] = keras_backend
    for var in ("TF_NUM_INTRAOP_THREADS", "OMP_NUM_THREADS"):
        os.environ[var] = str(cpus)
    os.environ["TF_NUM_INTEROP_THREADS"] = "1" if cpus <= 2 else "2"
    if gpus is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)


def arrow_to_numpy(
    batches: Iterator[pa.RecordBatch], input_shape: tuple[int, ...], label_size: int | None
) -> tuple[np.ndarray, np.ndarray | None]:
    """Concatenate Arrow batches into (x, y) numpy arrays without per-row Python objects."""
    batches = list(batches)
    if not batches or sum(b.num_rows for b in batches) == 0:
        return np.zeros((0, *input_shape), np.float32), np.zeros((0,), np.float32)
    table = pa.Table.from_batches(batches)
    x = _flat_values(table.column(FEATURES)).reshape((table.num_rows, *input_shape))
    y = None
    if LABEL in table.column_names:
        labels = table.column(LABEL)
        if label_size is None:
            y = labels.combine_chunks().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
        else:
            y = _flat_values(labels).reshape((table.num_rows, label_size))
    return x, y


def _flat_values(column: pa.ChunkedArray) -> np.ndarray:
    return column.combine_chunks().flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)


def pad_shard(x: np.ndarray, y: np.ndarray, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Repeat random rows so that every worker has the same number of batches per epoch.

    Synchronous rules need every worker to reach each exchange; Spark's
    round-robin repartition leaves shards that differ by a few rows.
    """
    missing = size - len(x)
    if missing <= 0:
        return x, y
    idx = np.random.default_rng(seed).integers(0, len(x), size=missing)
    return np.concatenate([x, x[idx]]), np.concatenate([y, y[idx]])


def _get_weights(model, with_optimizer: bool) -> list[np.ndarray]:
    import keras

    weights = model.get_weights()
    if with_optimizer:
        weights += [keras.ops.convert_to_numpy(v) for v in model.optimizer.variables]
    return weights


def _set_weights(model, arrays: list[np.ndarray], with_optimizer: bool) -> None:
    n = len(model.weights)
    model.set_weights(arrays[:n])
    if with_optimizer and len(arrays) > n:
        if not model.optimizer.built:  # a retried or resumed worker gets the state before its first step
            model.optimizer.build(model.trainable_variables)
        opt_vars = model.optimizer.variables
        if len(arrays) - n != len(opt_vars):
            raise RuntimeError(
                f"Optimizer state from the server has {len(arrays) - n} arrays, "
                f"the local optimizer has {len(opt_vars)}."
            )
        for var, value in zip(opt_vars, arrays[n:]):
            var.assign(value)


def epoch_batches_budget(shard_rows: int, batch_size: int, num_workers: int) -> int:
    """Minibatches in one epoch over all workers: one pass over every (padded) shard."""
    return math.ceil(shard_rows / batch_size) * num_workers


def make_sync_callback(client, algorithm: Algorithm, worker: int, record: dict, budget: int | None):
    """Build the Keras callback (imported lazily: keras must load after configure_process).

    `budget` is the number of minibatches in one epoch over all workers when
    the workers share each epoch (asynchronous rules with a window), else None.
    """
    import keras

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
            self.logs: dict[str, float] = {}
            self.anchor: list[np.ndarray] = []

        def begin(self, model) -> None:
            self.set_model(model)
            if self.with_optimizer:
                model.optimizer.build(model.trainable_variables)
            self.anchor = _get_weights(model, self.with_optimizer)

        def start_epoch(self, epoch: int) -> None:
            self.epoch, self.epoch_over = epoch, False
            record["epochs"].append({"epoch": epoch, "start": time.time(), "batches": 0})

        def on_train_batch_end(self, batch, logs=None):
            self.step += 1
            self.since += 1
            record["epochs"][-1]["batches"] += 1
            if algorithm.window is not None and self.since >= algorithm.window:
                self.exchange(logs)

        def on_epoch_end(self, epoch, logs=None):
            self.logs = {k: float(v) for k, v in (logs or {}).items()}

        def finish_epoch(self) -> None:
            if algorithm.window is None:
                self.exchange(self.logs)
            record["epochs"][-1].update(end=time.time(), logs=self.logs)
            client.epoch_done(self.epoch, self.logs)

        def finish(self) -> None:
            if self.since:
                self.exchange(self.logs)

        def exchange(self, logs) -> None:
            started = time.perf_counter()
            weights = _get_weights(self.model, self.with_optimizer)
            payload = algorithm.worker_payload(weights, self.anchor)
            loss = float((logs or {}).get("loss", float("nan")))
            meta = {"worker": worker, "epoch": self.epoch, "step": self.step, "loss": loss}
            if budget is not None:
                meta["batches"] = self.since
            reply, reply_meta = client.commit(payload, meta)
            new_weights, self.anchor = algorithm.worker_apply(weights, self.anchor, reply)
            _set_weights(self.model, new_weights, self.with_optimizer)
            self.since = 0
            record["commits"] += 1
            record["comm_s"] += time.perf_counter() - started
            if budget is not None and reply_meta.get("epoch_batches", budget) >= budget:
                self.epoch_over = True
                self.model.stop_training = True

    return ParameterServerSync()


def train_partition(config: WorkerConfig, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Body of one barrier task (the function given to ``mapInArrow(barrier=True)``)."""
    from pyspark import BarrierTaskContext

    task_start = time.time()
    ctx = BarrierTaskContext.get()
    worker = ctx.partitionId()
    gpus = ctx.resources()["gpu"].addresses if "gpu" in ctx.resources() else None
    configure_process(max(1, int(ctx.cpus())), gpus, config.keras_backend, config.env)

    x, y = arrow_to_numpy(batches, config.input_shape, config.label_size)
    data_ready = time.time()
    sizes = [int(s) for s in ctx.allGather(str(len(x)))]
    if min(sizes) == 0:
        raise RuntimeError(
            f"Worker shards have sizes {sizes}: at least one worker received no rows. "
            "Use fewer workers or more rows."
        )
    x, y = pad_shard(x, y, max(sizes), seed=config.seed + worker)

    import keras

    from .feed import ShardFeed
    from .ps.client import PSClient

    keras.backend.clear_session()
    keras.utils.set_random_seed(config.seed + 1000 * config.attempt + worker)
    model = config.model.build()
    built = time.time()
    record: dict[str, Any] = {
        "worker": worker, "attempt": config.attempt, "rows": sizes[worker], "padded_rows": len(x),
        "task_start": task_start, "data_ready": data_ready, "model_built": built,
        "commits": 0, "comm_s": 0.0, "epochs": [], "executor_pid": os.getpid(),
    }
    client = PSClient(
        config.ps_host, config.ps_port, config.secret, worker=worker,
        attempt=config.attempt, timeout=config.io_timeout,
    )
    with client:
        client.connect()
        center, meta = client.hello()
        start_epoch = int(meta.get("start_epoch", 0))
        _set_weights(model, list(center), config.algorithm.exchanges_optimizer_state)
        record["start_epoch"] = start_epoch
        shared = config.share_epochs and not config.algorithm.synchronous and config.algorithm.window is not None
        budget = epoch_batches_budget(len(x), config.batch_size, len(sizes)) if shared else None
        record["shared_epochs"] = shared
        callback = make_sync_callback(client, config.algorithm, worker, record, budget)
        callback.begin(model)
        feed = ShardFeed(x, y, seed=config.seed + 1000 * config.attempt + worker)
        train_start = time.time()
        for epoch in range(start_epoch, config.epochs):
            callback.start_epoch(epoch)
            # A shared epoch ends when the server has counted `budget` batches from all
            # workers: a faster worker goes on with a reshuffled pass over its shard,
            # a slower one stops early, and nobody waits for a straggler.
            while True:
                model.fit(**feed.fit_kwargs(config.batch_size), epochs=epoch + 1, initial_epoch=epoch, verbose=0,
                          callbacks=[callback])
                if budget is None or callback.epoch_over:
                    break
            callback.finish_epoch()
        callback.finish()
        record.update(
            train_s=time.time() - train_start, end=time.time(), steps=callback.step,
            bytes_sent=client.bytes_sent, bytes_received=client.bytes_received,
        )
    yield pa.RecordBatch.from_pydict(
        {"worker": [worker], "history": [json.dumps(record)]}, schema=RESULT_SCHEMA
    )
