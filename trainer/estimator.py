"""The user API: ``Trainer(...).fit(df)`` returns a `trainer.fitted.FittedModel`.

Example:
    >>> from trainer import Trainer, LocalCluster
    >>> with LocalCluster(workers=2) as cluster:
    ...     spark = cluster.session()
    ...     fitted = Trainer(model, num_workers=2, batch_size=32, epochs=4).fit(df)
    ...     fitted.evaluate(test_df)
    ...     predictions = fitted.transform(test_df)

The path of one fit goes one way. `Trainer.fit` plans: it checks everything it
can before any training job starts (arguments, model, checkpoint, columns,
values, cluster slots) and builds the model source and the two-column frame.
It then starts a parameter server in this driver and hands ONE barrier stage
of `num_workers` long-lived tasks (``trainer.runtime.worker``) to
``trainer.spark.launch.run_stage_with_retries``, which re-runs it after lost
executors (``max_retries``; a retry waits `retry_timeout` seconds for the lost
slots, then continues on the slots left, down to `min_workers`; retried workers
resume from the server's current weights at the first epoch not every worker
finished). The workers' records come back once and become the
`TrainingHistory`. The server always stops (also on error or Ctrl-C).

``fit(df, validation=val_df or a fraction)`` deals the validation rows into
the same stage: every worker validates the center model on its share at the
end of each epoch. ``fit(df, callbacks=[...])`` runs Keras callbacks on the
driver on the center model at every epoch end (``trainer.callbacks``: which run
where, how EarlyStopping stops the workers). ``mlflow=True`` logs the fit
(``trainer.tracking``).

When the parameter server refuses a commit (NaN or inf: the training
diverged; another dtype or model), the worker's task fails and `fit` stops
with a `TrainingFailedError` carrying the server's reason (worker, weight,
step, and what to change), never retrying: the center keeps the last good
weights and only those are checkpointed. A final checkpoint that cannot be
written (a full disk) is a warning and a ``checkpoint_failed`` event: the
fitted model is still returned, and the error of a failed fit stays the
error raised.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from trainer.algorithms import ADAG, Algorithm, get_algorithm, with_compression
from trainer.algorithms.delta import overlappable
from trainer.callbacks import EpochCallbacks, check_callbacks
from trainer.checkpoint import Checkpoint, Checkpointer, load_checkpoint
from trainer.data.validate import DataSpec, model_io, prepare_frame
from trainer.data.validation import split_validation, tag_validation, validation_frame
from trainer.errors import CheckpointError
from trainer.fit_stage import run_fit_stage
from trainer.fitted import FittedModel, TrainingHistory
from trainer.lr_schedules import planned_steps
from trainer.progress import TrainingProgress
from trainer.ps.epoch_end import EpochEndHook, EpochEnds
from trainer.ps.layout import check_shards, shard_layout
from trainer.ps.records import DEFAULT_HISTORY_SIZE
from trainer.ps.server import ParameterServer, uniform_progress
from trainer.ps.shards import ShardedParameterServer
from trainer.runtime.shard import FEEDS
from trainer.runtime.shipping import ModelSource, pack_model, ship_by_value
from trainer.runtime.state import optimizer_of
from trainer.runtime.worker import WorkerConfig, train_partition
from trainer.spark.launch import RetryPolicy, driver_addresses, wait_for_slots
from trainer.spark.memory import task_memory_bytes
from trainer.spark.resources import check_gpus_per_worker, stage_profile
from trainer.tracking import RunLogger, epoch_logger, fit_params
from trainer.transport.session import check_frame_mac
from trainer.transport.tls import TlsIdentity
from trainer.transport.wire import new_secret

log = logging.getLogger("trainer")


def warn_slow_choice(algorithm: Algorithm, model) -> None:
    """Warn where an explicit choice is known to learn far slower than plain Keras: ADAG at the learning rate
    of one Keras process (it divides every commit by its window)."""
    rule = getattr(algorithm, "inner", algorithm)  # a compressed rule wraps the delta rule
    optimizer = getattr(model, "optimizer", None)
    if not isinstance(rule, ADAG) or optimizer is None:
        return
    try:
        rate = float(optimizer.learning_rate)
        default = float(type(optimizer)().learning_rate)
    except (TypeError, ValueError):  # a schedule, or an optimizer without defaults: no advice
        return
    if rate <= default:
        warnings.warn(
            f"ADAG divides every commit by its window ({rule.window}): at {type(optimizer).__name__}'s default "
            f"learning rate ({rate:g}), tuned for one Keras process, the center moves about 1/{rule.window} as far "
            "per batch and learns far slower than plain Keras. Fix: raise the learning rate about "
            f"{rule.window}x, or leave `algorithm` out (the default learns like plain Keras, docs/algorithms.md).",
            UserWarning, stacklevel=3,
        )


def _identity(batches):
    yield from batches


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
    return value


@dataclass
class _Plan:
    """What `Trainer.fit` decided before any training job: the model, the data and where to start from."""

    model: Any  # the driver's keras.Model; it receives the trained weights
    source: ModelSource
    frame: Any  # the two-column DataFrame the workers read
    spec: DataSpec
    center: list
    version: int
    epochs_done: dict
    resumed: Checkpoint | None
    profile: Any = None  # the stage's ResourceProfile (GPUs per task), None for the session's defaults
    validation_rows: int = 0


class Trainer:
    """Data-parallel training of a Keras 3 model on a Spark DataFrame.

    Args:
        model: a compiled ``keras.Model`` with a defined input shape, or a function
            with no arguments returning one (called once on the driver and once
            per worker task; use it for models that do not serialize).
        algorithm: an `Algorithm` instance (``DynSGD(window=5)``) or its name.
            The default, ``"downpour"``, is ``DOWNPOUR(window="auto")``: every
            batch of every worker moves the center once, as in plain Keras, on
            a window sized by time (docs/algorithms.md: why, and the table
            against plain Keras at 1 to 8 workers).
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
        checkpoint_keep: Integer. Checkpoint versions kept (``resume_from``
            falls back to the previous one when the newest is damaged).
        on_update: Callable or None. Called on the driver with every
            parameter-server update (a `trainer.ps.UpdateRecord`: time, worker,
            version, staleness, bytes, epoch, step, loss); keep it fast.
        gpus_per_worker: Integer. GPUs each worker task gets (a stage-level Spark
            ResourceProfile; the task sees only the devices Spark assigned it
            through CUDA_VISIBLE_DEVICES). 0 keeps the session's defaults. The
            session needs spark.executor.resource.gpu.amount, or fit fails
            before any Spark job with the settings to add (docs/clusters.md).
        verbose: Bool. Progress bar and INFO logs on the driver.
        check_data: Bool. Scan the data once for nulls/NaN/inf and label ranges.
        share_epochs: Bool. With an asynchronous algorithm and a window, an
            epoch ends when all workers together have trained on as many
            batches as one pass over the data (counted by the parameter
            server): a faster worker trains on more batches of its shard, a
            slower one on fewer, and nobody waits for a straggler. False makes
            every worker pass exactly once over its own shard per epoch (as
            synchronous algorithms always do).
        compression: String or None. Lossy encoding of the deltas workers
            commit (DOWNPOUR, ADAG, DynSGD): ``"fp16"``, ``"bf16"`` (half the
            bytes) or ``"topk:F"`` (the largest fraction F of each tensor),
            with error feedback; None or ``"none"`` sends them exactly.
        compress_replies: Bool. With a compression, the parameter server's
            replies travel through it too: each is the change of the center
            since what that worker holds (half the bytes with bf16; what a
            reply drops comes in the next), see docs/algorithms.md. Off by
            default: replies are the exact center.
        mlflow: Bool. Log the fit to MLflow (the active run, or a new one
            under the current tracking URI): parameters, per-epoch metrics and
            the final model with its signature; see ``trainer.tracking``.
        tls: Bool. Encrypt the connections between the workers and the
            parameter server with TLS (a throw-away certificate per fit,
            pinned by the workers); see docs/security.md.
        frame_mac: Bool or String. A MAC on every frame between the workers
            and the parameter server: True (the default, Poly1305), False, or
            ``"poly1305"``, ``"hmac-sha256"``, ``"blake2b"``; its cost is in
            docs/security.md.
        history_size: Integer. Parameter-server updates kept in
            ``history.update_log`` (the totals count every update).
        feed: String. How each worker holds its shard: ``"memory"`` (numpy
            arrays), ``"stream"`` (an Arrow spill file in the executor's local
            directory, read one block at a time through a bounded shuffle
            buffer: the worker's memory does not grow with the shard) or
            ``"auto"`` (in memory unless the shard's Arrow size exceeds
            `shard_budget_mb`); see ``trainer.runtime.shard``.
        shard_budget_mb: Float or None. The largest shard (Arrow MB) that
            ``feed="auto"`` holds in memory; default a quarter of
            ``spark.executor.pyspark.memory`` per task when set, else a quarter
            of ``spark.executor.memory`` per task slot.
        on_epoch_end: Callable or None. Called on the driver once per epoch
            that every worker finished, with ``(epoch, center arrays, time)``;
            it runs on the parameter server's thread, so keep it fast (see
            ``trainer.ps.epoch_end``).
        ps_shards: Integer. Endpoints the parameter server is sharded over
            (threads of this driver, each with its own port: `ps_port`,
            `ps_port` + 1, ... when a port is given). The model is cut into
            parts of equal bytes; every worker sends each shard its part of a
            commit at once. It helps when the server is the bottleneck and the
            driver has a free core per shard (docs/guide.md); 1 (the default)
            is one endpoint. Not for rules that keep optimizer state on the
            server (``SyncAveraging(average_optimizer_state=True)``).
        overlap: Bool. Hide the round trip of each commit: a worker sends its
            commit on a thread of its own and trains the next window meanwhile,
            then folds the reply in (the center plus the progress it has not
            seen). Its view of the center is one window older; it tells the
            server the commits it has not seen, so DynSGD's staleness counts
            them. For delta rules with a window (DOWNPOUR, ADAG, DynSGD,
            compressed or not); False (the default) waits for every reply.
    """

    def __init__(
        self,
        model: Any,
        *,
        algorithm: Algorithm | str = "downpour",
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
        gpus_per_worker: int = 0,
        verbose: bool = True,
        check_data: bool = True,
        share_epochs: bool = True,
        compression: str | None = None,
        compress_replies: bool = False,
        mlflow: bool = False,
        checkpoint_keep: int = 2,
        tls: bool = False,
        frame_mac: bool | str = True,
        history_size: int = DEFAULT_HISTORY_SIZE,
        feed: str = "auto",
        shard_budget_mb: float | None = None,
        on_epoch_end: EpochEndHook | None = None,
        ps_shards: int = 1,
        overlap: bool = False,
    ) -> None:
        self.algorithm = with_compression(get_algorithm(algorithm), compression, replies=compress_replies)
        self.ps_shards = check_shards(ps_shards, self.algorithm)
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
        self.gpus_per_worker = check_gpus_per_worker(gpus_per_worker)
        self.verbose = bool(verbose)
        self.check_data = bool(check_data)
        self.share_epochs = bool(share_epochs)
        self.mlflow = bool(mlflow)
        self.checkpoint_keep = _positive_int("checkpoint_keep", checkpoint_keep)
        self.tls = bool(tls)
        self.frame_mac = check_frame_mac(frame_mac)
        self.history_size = _positive_int("history_size", history_size)
        if feed not in FEEDS:
            raise ValueError(f"`feed` must be one of {', '.join(map(repr, FEEDS))}. Received: feed={feed!r}")
        self.feed = feed
        if shard_budget_mb is not None and (isinstance(shard_budget_mb, bool) or
                                            not isinstance(shard_budget_mb, (int, float)) or shard_budget_mb <= 0):
            raise ValueError(f"`shard_budget_mb` must be a number > 0 or None. Received: "
                             f"shard_budget_mb={shard_budget_mb!r}")
        self.shard_budget_mb = shard_budget_mb
        self.on_epoch_end = on_epoch_end
        self.overlap = bool(overlap)
        if self.overlap and not overlappable(self.algorithm):
            raise ValueError(f"`overlap=True` needs a delta rule with a window (downpour, adag, dynsgd). Received: "
                             f"{self.algorithm.describe()}. Fix: use one of those rules or overlap=False.")

    # -- planning ---------------------------------------------------------------
    def _driver_model(self):
        import keras  # deferred: TensorFlow starts only when a fit does

        if isinstance(self.model, keras.Model):
            model_io(self.model)  # compiled, with a loss: a DataValidationError before any cluster work
            optimizer_of(self.model)  # built: the workers' copies and the callbacks' files hold its variables
            package = pack_model(self.model, self.custom_objects)
            return self.model, ModelSource(keras_bytes=package.data, custom_objects=package.custom_objects)
        model = self.model()
        if not isinstance(model, keras.Model):
            raise TypeError(f"The model function must return a keras.Model. Received: {type(model)}")
        model_io(model)
        optimizer_of(model)
        ship_by_value(self.model, *(self.custom_objects or {}).values())
        return model, ModelSource(builder=self.model, custom_objects=self.custom_objects)

    def _check_resume(self, checkpoint: Checkpoint, model) -> tuple[list, int, dict]:
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

    def _plan(self, df, resume_from, validation=None) -> _Plan:
        """Every check before cluster work: the model, the checkpoint, the data, the free slots."""
        started = time.time()
        df, validation = split_validation(df, validation, self.seed)
        model, source = self._driver_model()
        warn_slow_choice(self.algorithm, model)
        resumed = load_checkpoint(resume_from) if resume_from is not None else None
        center, version, epochs_done = model.get_weights(), 0, {}
        if resumed is not None:
            center, version, epochs_done = self._check_resume(resumed, model)
        if self.ps_shards > 1:
            shard_layout(center, self.ps_shards)  # a model too small for the shards fails here
        frame, spec = prepare_frame(
            df, self.features_col, self.label_col, model, min_rows=self.num_workers, check_values=self.check_data,
        )
        vframe, vrows = validation_frame(validation, self.features_col, self.label_col, model, spec,
                                         check_values=self.check_data)
        if vframe is not None:
            frame = tag_validation(frame, vframe)
        profile = stage_profile(df.sparkSession, self.gpus_per_worker)
        wait_for_slots(df.sparkSession, self.num_workers, self.slot_timeout, profile)
        log.info(
            "Training %s on %d rows with %d workers, %s, batch %d, %d epochs (checks took %.1f s)",
            model.name, spec.num_rows, self.num_workers, self.algorithm.describe(), self.batch_size,
            self.epochs, time.time() - started,
        )
        if spec.num_rows + vrows < 1000 * self.num_workers:
            # Round-robin from a single partition deals rows evenly; from many tiny
            # partitions it can leave a worker without any row. The identity map
            # keeps the optimizer from collapsing coalesce(1) into the repartition.
            frame = frame.coalesce(1).mapInArrow(_identity, frame.schema)
        return _Plan(model, source, frame, spec, center, version, epochs_done, resumed, profile, vrows)

    # -- fit -------------------------------------------------------------------
    def fit(self, df, resume_from: str | os.PathLike | None = None, *, validation: Any = None,
            callbacks: list | None = None) -> FittedModel:
        """Train on `df` and return a `FittedModel` (see the class docstring).

        Args:
            df: Spark DataFrame with the feature and label columns.
            resume_from: the `checkpoint_dir` of an interrupted run with the same
                model and algorithm: training continues from its weights at the
                first epoch not every worker finished (and keeps checkpointing
                there unless another `checkpoint_dir` is set).
            validation: a DataFrame with the same columns, a fraction in (0, 1)
                of `df` to hold out (``randomSplit`` with `seed`), or None. The
                center model is validated on the executors at every epoch end;
                ``history.epochs`` gets ``val_loss`` and the other metrics.
            callbacks: Keras callbacks run on the driver on the center model at
                every epoch end (EarlyStopping, ModelCheckpoint, ReduceLROnPlateau,
                CSVLogger, TensorBoard, ...); see ``trainer.callbacks``.
        """
        if not self.mlflow:
            return self._fit(df, resume_from, validation, callbacks, None)
        with RunLogger(run_name=f"trainer {self.algorithm.name} x{self.num_workers}") as run:
            return self._fit(df, resume_from, validation, callbacks, run)

    def _fit(self, df, resume_from, validation, callbacks, run: RunLogger | None) -> FittedModel:
        if getattr(self.algorithm, "collective", False):  # AllReduce: the backend's collectives, no server loop
            from trainer.collective_fit import fit_collective  # deferred: only collective fits need it

            return fit_collective(self, df, resume_from, validation, callbacks, run)
        import keras  # deferred: TensorFlow starts only when a fit does

        identity = TlsIdentity.generate() if self.tls else None  # a missing tool fails before any cluster work
        spark = df.sparkSession
        host, bind, port = driver_addresses(spark, self.ps_host, self.ps_bind_host, self.ps_port, self.ps_shards)
        plan = self._plan(df, resume_from, validation)
        callbacks = check_callbacks(callbacks, plan.model, plan.validation_rows > 0)
        if run is not None:
            run.log_params(fit_params(self, plan.model, plan.spec.num_rows, plan.validation_rows))
            callbacks.append(epoch_logger(run))
        epoch_callbacks = EpochCallbacks(plan.model, callbacks, self.num_workers, self.epochs)
        steps = planned_steps(plan.spec.num_rows, self.num_workers, self.batch_size)
        progress = TrainingProgress(steps * self.num_workers * self.epochs, self.num_workers, self.epochs,
                                    enabled=self.verbose)
        secret = new_secret()
        checkpointer: Checkpointer | None = None
        hooks: list[Callable] = [progress.update, epoch_callbacks.on_update] + ([self.on_update] if self.on_update
                                                                                else [])
        epoch_ends = EpochEnds(self.on_epoch_end) if self.on_epoch_end is not None else None

        def on_epoch_done(worker: int, epoch: int) -> None:
            if checkpointer is not None:
                checkpointer.on_epoch_done(worker, epoch)
            epoch_callbacks.on_epoch_done(worker, epoch)
            if epoch_ends is not None:
                epoch_ends.on_epoch_done(worker, epoch)

        server = (ParameterServer if self.ps_shards == 1 else functools.partial(
            ShardedParameterServer, shards=self.ps_shards))(
            self.algorithm, plan.center, self.num_workers, secret, host=bind, port=port,
            io_timeout=self.io_timeout, round_timeout=self.io_timeout,
            on_update=lambda record: [hook(record) for hook in hooks],
            on_epoch_done=on_epoch_done, version=plan.version, epochs_done=plan.epochs_done,
            weight_names=[w.path for w in plan.model.weights], frame_mac=self.frame_mac, tls=identity or False,
            history_size=self.history_size,
        )
        if epoch_ends is not None:
            epoch_ends.bind(server)
        shard_budget = None if self.shard_budget_mb is None else int(self.shard_budget_mb * 1024 * 1024)
        task_memory = task_memory_bytes(spark)
        checkpoint_dir = self.checkpoint_dir if self.checkpoint_dir is not None else resume_from
        if checkpoint_dir is not None:
            checkpointer = Checkpointer(checkpoint_dir, server, self.checkpoint_every, {
                "num_workers": self.num_workers, "algorithm": self.algorithm.describe(), "epochs": self.epochs,
                "model": plan.model.name, "num_weights": len(plan.model.weights),
            }, keep=self.checkpoint_keep)
            hooks.append(checkpointer.on_update)
        events: list[dict] = []
        if plan.resumed is not None:
            events.append({"time": time.time(), "event": "resumed", "from": str(resume_from),
                           "version": plan.version, "completed_epochs": plan.resumed.completed_epochs})

        def make_task(attempt: int, workers: int):
            server.start_attempt(attempt)  # leftover tasks of an older attempt are refused from now on
            return functools.partial(train_partition, WorkerConfig(
                model=plan.source, algorithm=self.algorithm, ps_host=host,
                ps_ports=tuple(p for _, p in server.addresses),
                secret=server.credentials,
                num_workers=workers, batch_size=self.batch_size, epochs=self.epochs,
                input_shape=plan.spec.input_shape, label_size=plan.spec.label_size, attempt=attempt,
                seed=self.seed, io_timeout=self.io_timeout, keras_backend=keras.backend.backend(),
                share_epochs=self.share_epochs, feed=self.feed, shard_budget=shard_budget, task_memory=task_memory,
                overlap=self.overlap,
            ))

        def on_retry(workers: int) -> None:
            server.resize(workers)
            progress.restart(workers)
            epoch_callbacks.restart(workers)

        stage, job_start, job_end = run_fit_stage(
            plan.frame, self.num_workers, make_task,
            RetryPolicy(self.max_retries, self.retry_timeout, self.min_workers),
            f"trainer: {plan.model.name} {self.algorithm.describe()}", server=server, progress=progress,
            epoch_callbacks=epoch_callbacks, checkpointer=checkpointer, checkpoint_dir=checkpoint_dir,
            events=events, on_retry=on_retry, profile=plan.profile)
        epoch_callbacks.finish(server.center())  # the final weights, then on_train_end (restore_best_weights)
        if epoch_callbacks.stopped_epoch is not None:
            events.append({"time": time.time(), "event": "stopped_by_callback", "epoch": epoch_callbacks.stopped_epoch})
        results = [json.loads(r.history) for r in stage.rows]
        history = TrainingHistory.build(self.algorithm.describe(), self.num_workers, server, results, job_start,
                                        job_end, events)
        if epoch_callbacks.stopped_epoch is not None:  # epochs some workers ended after the stop are not reported
            history.epochs = [e for e in history.epochs if e["epoch"] <= epoch_callbacks.stopped_epoch]
        reported = {e["epoch"]: e for e in epoch_callbacks.epochs}
        for entry in history.epochs:
            entry.update({k: v for k, v in reported.get(entry["epoch"], {}).items() if k not in entry})
        log.info(
            "Trained in %.1f s (%.1f s per epoch, data delivery %.1f s), %d updates, %.1f MB moved",
            history.timings["wall_s"], history.timings["epoch_s"], history.timings["data_delivery_s"],
            history.num_updates, history.bytes_moved / 1e6,
        )
        fitted = FittedModel(plan.model, history, self.features_col, self.label_col, plan.spec, self.custom_objects)
        if run is not None:
            run.log_metrics({"wall_s": history.timings["wall_s"], "total_updates": history.num_updates,
                             "total_bytes": history.bytes_moved})
            run.log_model(plan.model, plan.spec.input_shape, fitted._shipped().custom_objects)
        return fitted
