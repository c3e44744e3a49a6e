"""The user API: ``Trainer(...).fit(df)`` returns a `FittedModel`.

Example:
    >>> from trainer import Trainer, ADAG, LocalCluster
    >>> with LocalCluster(workers=2) as cluster:
    ...     spark = cluster.session()
    ...     fitted = Trainer(model, algorithm=ADAG(window=12), num_workers=2,
    ...                      batch_size=32, epochs=4).fit(df)
    ...     fitted.evaluate(test_df)
    ...     predictions = fitted.transform(test_df)

`fit` checks everything it can before any training job starts (arguments,
model, columns, values, cluster slots), then starts a parameter server in this
driver, runs ONE barrier stage of `num_workers` long-lived tasks, and always
stops the server (also on error or Ctrl-C). Lost executors are retried up to
`max_retries` times; retried workers resume from the server's current weights
at the first epoch not every worker finished. A retry waits `retry_timeout`
seconds for the lost slots (Spark standalone relaunches a killed executor),
then continues on the slots left, down to `min_workers`: the history's events
record each failed attempt and each change in the number of workers.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import sysconfig
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .algorithms import Algorithm, get_algorithm
from .data.validate import DataSpec, feature_column, prepare_frame
from .launch import (
    ClusterCapacityError, TrainingFailedError, available_slots, is_infrastructure_failure, run_barrier_job,
    wait_for_slots,
)
from .ps.server import uniform_progress
from .progress import TrainingProgress
from .schedules import planned_steps
from .worker import (
    RESULT_DDL, ModelSource, WorkerConfig, arrow_to_numpy, configure_process, load_keras_bytes,
    model_to_bytes, train_partition,
)

log = logging.getLogger("trainer")


def ship_by_value(*objects: Any) -> None:
    """Make Spark serialize user code (builder functions, custom layers) by value.

    cloudpickle pickles functions and classes of importable modules by
    reference, which fails on executors that do not have the user's script or
    test module on their path. Modules outside site-packages and the standard
    library are shipped whole; a ``functools.partial`` ships its function's module.

    Raises TypeError, before any cluster work, for an object that cannot be
    serialized (a closure over a lock, an open file, a live session, ...).
    """
    from pyspark import cloudpickle

    stdlib = sysconfig.get_paths()["stdlib"]
    for given in objects:
        obj = given
        while isinstance(obj, functools.partial):
            obj = obj.func
        module = sys.modules.get(getattr(obj, "__module__", None) or "")
        path = getattr(module, "__file__", None) or ""
        if module is not None and module.__name__ != "__main__" and module.__name__.split(".")[0] != "trainer" \
                and path and "-packages" not in path and not path.startswith(stdlib):
            cloudpickle.register_pickle_by_value(module)
        try:
            cloudpickle.dumps(given)
        except Exception as exc:
            raise TypeError(
                f"{given!r} cannot be sent to the executors: {type(exc).__name__}: {exc}. Define the model "
                "function (and custom objects) at module level, or make it capture only picklable values "
                "(numbers, strings, functions), and build Keras objects inside it."
            ) from exc


def _identity(batches):
    yield from batches


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
    return value


@dataclass
class TrainingHistory:
    """What happened during `fit`.

    Attributes:
        updates: one dict per parameter-server update (time, worker, version,
            staleness, bytes_in, bytes_out, epoch, step, loss, kind).
        workers: one dict per worker task (rows, commits, comm_s, bytes_sent,
            bytes_received, timings, per-epoch logs); retried tasks appear once
            per attempt.
        epochs: per epoch: wall time over all workers, batches trained by
            all workers and the mean of the workers' Keras logs (loss, metrics).
        events: notable events (retries, server-side rejections).
        timings: wall_s, data_delivery_s, model_build_s, train_s, epoch_s.
    """

    algorithm: str
    num_workers: int
    updates: list[dict] = field(default_factory=list)
    workers: list[dict] = field(default_factory=list)
    epochs: list[dict] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def num_updates(self) -> int:
        return len(self.updates)

    @property
    def bytes_moved(self) -> int:
        return sum(u["bytes_in"] + u["bytes_out"] for u in self.updates)

    @property
    def loss(self) -> list[float]:
        """Mean training loss of the workers at the end of each epoch."""
        return [e.get("loss", float("nan")) for e in self.epochs]

    def to_frame(self):
        """Parameter-server updates as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame(self.updates)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def build(cls, algorithm: Algorithm, num_workers: int, ps, workers: list[dict], job_start: float,
              job_end: float, events: list[dict]) -> "TrainingHistory":
        final = [w for w in workers if w["attempt"] == max(x["attempt"] for x in workers)]
        epochs = []
        for epoch in sorted({e["epoch"] for w in final for e in w["epochs"] if "end" in e}):
            parts = [e for w in final for e in w["epochs"] if e["epoch"] == epoch and "end" in e]
            entry = {"epoch": epoch, "time_s": max(p["end"] for p in parts) - min(p["start"] for p in parts),
                     "batches": sum(p.get("batches", 0) for p in parts)}
            for key in parts[0]["logs"]:
                entry[key] = float(np.mean([p["logs"].get(key, np.nan) for p in parts]))
            epochs.append(entry)
        first = [w for w in workers if w["attempt"] == 0] or workers
        timings = {
            "wall_s": job_end - job_start,
            "data_delivery_s": max(w["data_ready"] for w in first) - job_start,
            "model_build_s": max(w["model_built"] - w["data_ready"] for w in first),
            "train_s": max(w["train_s"] for w in final),
            "epoch_s": float(np.mean([e["time_s"] for e in epochs])) if epochs else float("nan"),
        }
        return cls(
            algorithm=algorithm.describe(), num_workers=num_workers,
            updates=[asdict(u) for u in ps.updates], workers=sorted(workers, key=lambda w: (w["attempt"], w["worker"])),
            epochs=epochs, events=list(ps.events) + events, timings=timings,
        )


class Trainer:
    """Data-parallel training of a Keras 3 model on a Spark DataFrame.

    Args:
        model: a compiled ``keras.Model`` with a defined input shape, or a function
            with no arguments returning one (called once on the driver and once
            per worker task; use it for models that do not serialize).
        algorithm: an `Algorithm` instance (``ADAG(window=12)``) or its name.
        num_workers: Integer. Number of long-lived worker tasks (one per slot).
        batch_size: Integer. Minibatch size on each worker.
        epochs: Integer. Passes over each worker's shard.
        features_col: String or list of strings. An array or Spark ML Vector
            column, or several numeric columns; flattened rows are reshaped to
            the model's input shape.
        label_col: String. Numeric or array/Vector label column.
        custom_objects: Dict. Custom layers/losses/metrics for deserialization.
        seed: Integer. Seeds Keras on every worker (``seed + worker``).
        ps_host: String or None. Address executors use to reach the parameter
            server; default ``$TRAINER_PS_HOST`` or ``spark.driver.host``.
        ps_port: Integer. 0 picks a free port; default ``$TRAINER_PS_PORT`` or 0.
        ps_bind_host: String or None. Address the server listens on; default
            ``$TRAINER_PS_BIND`` or `ps_host` (never all interfaces unless asked).
        io_timeout: Float. Seconds the server and workers wait for each other.
        slot_timeout: Float. Seconds to wait for `num_workers` free task slots.
        max_retries: Integer. Re-runs of the training stage after lost executors.
        retry_timeout: Float. Seconds a retry waits for the lost task slots to
            come back (Spark standalone relaunches a killed executor; a lost
            machine or container may never return).
        min_workers: Integer. After `retry_timeout`, a retry continues on the
            slots left if there are at least `min_workers` (rows are dealt anew
            over the surviving workers, training resumes from the server's
            weights at the first epoch not all workers finished); with fewer,
            fit fails with ClusterCapacityError. ``min_workers=num_workers``
            never shrinks.
        checkpoint_dir: String or None. Directory where the parameter server's
            state is saved atomically every `checkpoint_every` updates, at every
            epoch all workers finished, and when training stops (also on error
            or Ctrl-C); ``fit(df, resume_from=checkpoint_dir)`` continues from it.
        checkpoint_every: Integer. Server updates between two checkpoints.
        on_update: Callable or None. Called on the driver with every
            parameter-server update (a `trainer.ps.UpdateRecord`: time, worker,
            version, staleness, bytes, epoch, step, loss); keep it fast.
        verbose: Bool. Progress bar and INFO logs on the driver.
        check_data: Bool. Scan the data once for nulls/NaN/inf and label ranges.
        share_epochs: Bool. With an asynchronous algorithm and a window, an
            epoch ends when all workers together have trained on as many
            batches as one pass over the data (counted by the parameter
            server): a faster worker trains on more batches of its shard, a
            slower one on fewer, and nobody waits for a straggler. False makes
            every worker pass exactly once over its own shard per epoch (as
            synchronous algorithms always do).
    """

    def __init__(
        self,
        model: Any,
        *,
        algorithm: Algorithm | str = "adag",
        num_workers: int = 2,
        batch_size: int = 32,
        epochs: int = 1,
        features_col: str | list[str] = "features",
        label_col: str = "label",
        custom_objects: dict[str, Any] | None = None,
        seed: int = 0,
        ps_host: str | None = None,
        ps_port: int | None = None,
        ps_bind_host: str | None = None,
        io_timeout: float = 600.0,
        slot_timeout: float = 10.0,
        max_retries: int = 2,
        retry_timeout: float = 60.0,
        min_workers: int = 1,
        checkpoint_dir: str | os.PathLike | None = None,
        checkpoint_every: int = 100,
        on_update: Callable[[Any], None] | None = None,
        verbose: bool = True,
        check_data: bool = True,
        share_epochs: bool = True,
    ) -> None:
        self.algorithm = get_algorithm(algorithm)
        self.num_workers = _positive_int("num_workers", num_workers)
        self.algorithm.check_workers(self.num_workers)
        self.batch_size = _positive_int("batch_size", batch_size)
        self.epochs = _positive_int("epochs", epochs)
        if not (callable(model) or hasattr(model, "get_weights")):
            raise TypeError(
                f"`model` must be a compiled keras.Model or a function returning one. Received: {type(model)}"
            )
        self.model = model
        self.features_col = features_col
        self.label_col = label_col
        self.custom_objects = custom_objects
        self.seed = int(seed)
        self.ps_host = ps_host
        self.ps_port = ps_port
        self.ps_bind_host = ps_bind_host
        self.io_timeout = float(io_timeout)
        self.slot_timeout = float(slot_timeout)
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"`max_retries` must be an integer >= 0. Received: max_retries={max_retries!r}")
        self.max_retries = max_retries
        self.retry_timeout = float(retry_timeout)
        self.min_workers = _positive_int("min_workers", min_workers)
        if self.min_workers > self.num_workers:
            raise ValueError(f"`min_workers` must be <= num_workers={self.num_workers}. Received: "
                             f"min_workers={min_workers}")
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = _positive_int("checkpoint_every", checkpoint_every)
        self.on_update = on_update
        self.verbose = bool(verbose)
        self.check_data = bool(check_data)
        self.share_epochs = bool(share_epochs)

    # -- helpers -------------------------------------------------------------
    def _driver_model(self):
        import keras

        if isinstance(self.model, keras.Model):
            ship_by_value(*(self.custom_objects or {}).values())
            return self.model, ModelSource(keras_bytes=model_to_bytes(self.model), custom_objects=self.custom_objects)
        model = self.model()
        if not isinstance(model, keras.Model):
            raise TypeError(f"The model function must return a keras.Model. Received: {type(model)}")
        ship_by_value(self.model, *(self.custom_objects or {}).values())
        return model, ModelSource(builder=self.model, custom_objects=self.custom_objects)

    def _ps_addresses(self, spark) -> tuple[str, str, int]:
        conf = spark.sparkContext.getConf()
        host = self.ps_host or os.environ.get("TRAINER_PS_HOST") or conf.get("spark.driver.host", "127.0.0.1")
        bind = self.ps_bind_host or os.environ.get("TRAINER_PS_BIND") or host
        port = self.ps_port if self.ps_port is not None else int(os.environ.get("TRAINER_PS_PORT", "0"))
        return host, bind, port

    def _check_resume(self, checkpoint, model) -> tuple[list, int, dict]:
        from .checkpoint import CheckpointError

        weights = model.get_weights()
        saved = checkpoint.center[: len(weights)]
        shapes = [w.shape for w in weights]
        if len(saved) != len(weights) or [a.shape for a in saved] != shapes:
            raise CheckpointError(
                f"The checkpoint holds {len(saved)} weight arrays of shapes {[a.shape for a in saved][:4]}..., "
                f"the model has {len(weights)} of shapes {shapes[:4]}...: it belongs to another model."
            )
        center = checkpoint.center if self.algorithm.exchanges_optimizer_state else saved
        log.info("Resuming from version %d, %d epoch(s) completed", checkpoint.version, checkpoint.completed_epochs)
        # Any worker count may resume: rows are dealt anew, the epochs everybody finished carry over.
        return center, checkpoint.version, uniform_progress(checkpoint.completed_epochs, self.num_workers)

    def _workers_for_retry(self, spark, workers: int, events: list[dict]) -> int:
        """Wait for `num_workers` slots; after `retry_timeout` continue on what is left (>= min_workers)."""
        try:
            wait_for_slots(spark, self.num_workers, self.retry_timeout)
            slots = self.num_workers
        except ClusterCapacityError as error:
            slots = error.slots if error.slots is not None else available_slots(spark)
            if slots < self.min_workers:
                raise ClusterCapacityError(
                    f"After losing executors only {slots} task slot(s) came back within retry_timeout="
                    f"{self.retry_timeout:.0f} s, fewer than min_workers={self.min_workers}: training stops. "
                    "The parameter server's last state is in the checkpoint if checkpoint_dir was set; "
                    "resume with fit(df, resume_from=...) once the cluster is back."
                ) from None
        if slots != workers:
            log.warning("Continuing on %d workers (was %d)", slots, workers)
            events.append({"time": time.time(), "event": "workers_changed", "from": workers, "to": slots})
        return slots

    # -- fit -------------------------------------------------------------------
    def fit(self, df, resume_from: str | os.PathLike | None = None) -> "FittedModel":
        """Train on `df` and return a `FittedModel` (see the class docstring).

        `resume_from` is the `checkpoint_dir` of an interrupted run with the same
        model and algorithm: training continues from its weights at the first
        epoch not every worker finished (and keeps checkpointing there unless
        another `checkpoint_dir` is set).
        """
        import keras

        from .checkpoint import Checkpointer, load_checkpoint
        from .ps import ParameterServer, new_secret

        started = time.time()
        model, source = self._driver_model()
        resumed = load_checkpoint(resume_from) if resume_from is not None else None
        center, version, epochs_done = model.get_weights(), 0, {}
        if resumed is not None:
            center, version, epochs_done = self._check_resume(resumed, model)
        frame, spec = prepare_frame(
            df, self.features_col, self.label_col, model,
            min_rows=self.num_workers, check_values=self.check_data,
        )
        spark = df.sparkSession
        wait_for_slots(spark, self.num_workers, self.slot_timeout)
        log.info(
            "Training %s on %d rows with %d workers, %s, batch %d, %d epochs (checks took %.1f s)",
            model.name, spec.num_rows, self.num_workers, self.algorithm.describe(), self.batch_size,
            self.epochs, time.time() - started,
        )
        if spec.num_rows < 1000 * self.num_workers:
            # Round-robin from a single partition deals rows evenly; from many tiny
            # partitions it can leave a worker without any row. The identity map
            # keeps the optimizer from collapsing coalesce(1) into the repartition.
            frame = frame.coalesce(1).mapInArrow(_identity, frame.schema)
        host, bind, port = self._ps_addresses(spark)
        steps = planned_steps(spec.num_rows, self.num_workers, self.batch_size)
        progress = TrainingProgress(steps * self.num_workers * self.epochs, self.num_workers, self.epochs,
                                    enabled=self.verbose)
        secret = new_secret()
        checkpointer: Checkpointer | None = None
        callbacks: list[Callable] = [progress.update] + ([self.on_update] if self.on_update else [])
        server = ParameterServer(
            self.algorithm, center, self.num_workers, secret, host=bind, port=port,
            io_timeout=self.io_timeout, round_timeout=self.io_timeout,
            on_update=lambda record: [cb(record) for cb in callbacks],
            on_epoch_done=lambda worker, epoch: checkpointer and checkpointer.on_epoch_done(worker, epoch),
            version=version, epochs_done=epochs_done,
        )
        checkpoint_dir = self.checkpoint_dir if self.checkpoint_dir is not None else resume_from
        if checkpoint_dir is not None:
            checkpointer = Checkpointer(checkpoint_dir, server, self.checkpoint_every, {
                "num_workers": self.num_workers, "algorithm": self.algorithm.describe(), "epochs": self.epochs,
                "model": model.name, "num_weights": len(model.weights),
            })
            callbacks.append(checkpointer.on_update)
        events: list[dict] = []
        if resumed is not None:
            events.append({"time": time.time(), "event": "resumed", "from": str(resume_from),
                           "version": version, "completed_epochs": resumed.completed_epochs})
        results: list[dict] = []
        try:
            _, bound_port = server.start()
            job_start = time.time()
            workers = self.num_workers
            for attempt in range(self.max_retries + 1):
                config = WorkerConfig(
                    model=source, algorithm=self.algorithm, ps_host=host, ps_port=bound_port, secret=secret,
                    num_workers=workers, batch_size=self.batch_size, epochs=self.epochs,
                    input_shape=spec.input_shape, label_size=spec.label_size, attempt=attempt, seed=self.seed,
                    io_timeout=self.io_timeout, keras_backend=keras.backend.backend(),
                    share_epochs=self.share_epochs,
                )
                try:
                    rows = run_barrier_job(
                        frame, workers, functools.partial(train_partition, config), RESULT_DDL,
                        description=f"trainer: {model.name} {self.algorithm.describe()} attempt {attempt}",
                    )
                except TrainingFailedError as exc:
                    retry = attempt < self.max_retries and is_infrastructure_failure(exc.__cause__)
                    events.append({"time": time.time(), "event": "attempt_failed", "attempt": attempt,
                                   "error": str(exc), "retry": retry})
                    if not retry:
                        raise
                    log.warning("Attempt %d failed (%s); retrying from the server's current weights", attempt, exc)
                    workers = self._workers_for_retry(spark, workers, events)
                    server.resize(workers)
                    progress.restart(workers)
                    continue
                results.extend(json.loads(r.history) for r in rows)
                break
            job_end = time.time()
        finally:
            server.stop()
            progress.close()
            if checkpointer is not None:
                checkpointer.save()
        model.set_weights(server.center()[: len(model.weights)])
        history = TrainingHistory.build(self.algorithm, self.num_workers, server, results, job_start, job_end, events)
        log.info(
            "Trained in %.1f s (%.1f s per epoch, data delivery %.1f s), %d updates, %.1f MB moved",
            history.timings["wall_s"], history.timings["epoch_s"], history.timings["data_delivery_s"],
            history.num_updates, history.bytes_moved / 1e6,
        )
        return FittedModel(model, history, self.features_col, self.label_col, spec, self.custom_objects)


_MODEL_CACHE: dict[str, Any] = {}
_CACHE_LOCK = threading.Lock()


def _cached_model(key: str, data: bytes, custom_objects):
    """One deserialized model per Python worker process and fitted model."""
    with _CACHE_LOCK:
        if key not in _MODEL_CACHE:
            while len(_MODEL_CACHE) >= 2:
                _MODEL_CACHE.pop(next(iter(_MODEL_CACHE)))
            _MODEL_CACHE[key] = load_keras_bytes(data, custom_objects)
        return _MODEL_CACHE[key]


def _task_setup(backend: str) -> None:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    configure_process(max(1, int(ctx.cpus())) if ctx else 1, None, backend, {})


class FittedModel:
    """A trained model: the Keras model, its `TrainingHistory`, and distributed inference."""

    def __init__(self, keras_model, history: TrainingHistory, features_col, label_col, spec: DataSpec,
                 custom_objects=None) -> None:
        self.keras_model = keras_model
        self.history = history
        self.features_col = features_col
        self.label_col = label_col
        self.spec = spec
        self.custom_objects = custom_objects
        self._bytes: bytes | None = None
        self._key = uuid.uuid4().hex

    def _model_bytes(self) -> bytes:
        if self._bytes is None:
            self._bytes = model_to_bytes(self.keras_model)
        return self._bytes

    def transform(self, df, output_col: str = "prediction", batch_size: int = 1024):
        """Return `df` with `output_col` added: the model's outputs for every row.

        Runs on the executors (``predict_batch_udf``; the model is loaded once per
        Python worker). Multi-unit outputs become array<float>, single-unit ones float.
        """
        import keras
        from pyspark.ml.functions import predict_batch_udf
        from pyspark.sql import types as T

        from .data.validate import model_io, resolve_input_shape

        input_shape, units, _ = model_io(self.keras_model)
        shape = list(resolve_input_shape(input_shape, self.spec.feature_size))
        data, key, objects, backend = self._model_bytes(), self._key, self.custom_objects, keras.backend.backend()
        scalar = units == 1

        def make_predict_fn():
            _task_setup(backend)
            model = _cached_model(key, data, objects)

            def predict(x: np.ndarray) -> np.ndarray:
                out = np.asarray(model.predict_on_batch(x.astype(np.float32, copy=False)))
                return out.reshape(len(x)) if scalar else out.reshape(len(x), -1)

            return predict

        return_type = T.FloatType() if scalar else T.ArrayType(T.FloatType())
        udf = predict_batch_udf(make_predict_fn, return_type=return_type, batch_size=batch_size,
                                input_tensor_shapes=[shape])
        return df.withColumn(output_col, udf(feature_column(df, self.features_col)))

    def evaluate(self, df, batch_size: int = 1024) -> dict[str, float]:
        """Loss and compiled metrics on `df`, computed on the executors.

        Each partition is evaluated with ``model.evaluate``; results are averaged
        weighted by row count, which is exact for loss, accuracy, MAE, MSE and any
        other per-sample mean, and approximate for metrics such as AUC.
        """
        import keras
        import pyarrow as pa

        frame, spec = prepare_frame(df, self.features_col, self.label_col, self.keras_model)
        data, key, objects, backend = self._model_bytes(), self._key, self.custom_objects, keras.backend.backend()
        schema = pa.schema([("count", pa.int64()), ("metrics", pa.string())])

        def evaluate_partition(batches):
            x, y = arrow_to_numpy(batches, spec.input_shape, spec.label_size)
            if len(x) == 0:
                return
            _task_setup(backend)
            model = _cached_model(key, data, objects)
            metrics = model.evaluate(x, y, batch_size=batch_size, verbose=0, return_dict=True)
            yield pa.RecordBatch.from_pydict(
                {"count": [len(x)], "metrics": [json.dumps({k: float(v) for k, v in metrics.items()})]},
                schema=schema,
            )

        rows = frame.mapInArrow(evaluate_partition, "count long, metrics string").collect()
        total = sum(r["count"] for r in rows)
        parts = [(r["count"], json.loads(r["metrics"])) for r in rows]
        return {k: sum(n * m[k] for n, m in parts) / total for k in parts[0][1]}

    def save(self, path: str | os.PathLike) -> Path:
        """Write ``model.keras``, ``history.json`` and ``fitted.json`` into directory `path`."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        self.keras_model.save(out / "model.keras")
        (out / "history.json").write_text(json.dumps(self.history.to_dict(), default=float))
        meta = {"features_col": self.features_col, "label_col": self.label_col, "spec": asdict(self.spec)}
        (out / "fitted.json").write_text(json.dumps(meta))
        return out

    @classmethod
    def load(cls, path: str | os.PathLike, custom_objects=None) -> "FittedModel":
        import keras

        src = Path(path)
        meta = json.loads((src / "fitted.json").read_text())
        spec = meta["spec"]
        spec = DataSpec(spec["num_rows"], spec["feature_size"], tuple(spec["input_shape"]), spec["label_size"])
        model = keras.saving.load_model(src / "model.keras", custom_objects=custom_objects)
        history = TrainingHistory(**json.loads((src / "history.json").read_text()))
        return cls(model, history, meta["features_col"], meta["label_col"], spec, custom_objects)
