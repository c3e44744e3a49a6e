"""The user API: ``Trainer(...).fit(df)`` returns a `trainer.fit.fitted.FittedModel`.

Example:
    >>> from trainer import Trainer, LocalCluster
    >>> with LocalCluster(workers=2) as cluster:
    ...     spark = cluster.session()
    ...     fitted = Trainer(model, num_workers=2, batch_size=32, epochs=4).fit(df)
    ...     fitted.evaluate(test_df)
    ...     predictions = fitted.transform(test_df)

The path of one fit goes one way. `Trainer` holds the options, checked once
in ``__init__``; `fit` hands them to the one driver (``trainer.fit.driver``),
which plans (``trainer.fit.plan``: everything it can check before any
training job starts: model, checkpoint, columns, values, cluster slots),
starts a parameter server in this driver and hands ONE barrier stage of
`num_workers` long-lived tasks to
``trainer.spark.launch.run_stage_with_retries``, which re-runs it after lost
executors (``max_retries``; a retry waits `retry_timeout` seconds for the lost
slots, then continues on the slots left, down to `min_workers`; retried workers
resume from the server's current weights at the first epoch not every worker
finished). What runs in the tasks depends on the algorithm (``trainer.fit.kinds``):
the parameter-server worker (``trainer.runtime.ps_worker.worker_task``), or for `AllReduce`
the backend's collective loop. The tasks' records come back once and become
the `TrainingHistory`. The server always stops (also on error or Ctrl-C).

``fit(df, validation=val_df or a fraction)`` deals the validation rows into
the same stage: every worker validates the center model on its share at the
end of each epoch. ``fit(df, callbacks=[...])`` runs Keras callbacks on the
driver on the center model at every epoch end (``trainer.fit.epoch_callbacks``: which run
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

import os
from typing import Any

from trainer.fit.driver import drive_fit
from trainer.fit.fitted import FittedModel
from trainer.options import FitOptions, OptionAttributes
from trainer.tracking import RunLogger


class Trainer(OptionAttributes):
    """Data-parallel training of a Keras 3 model on a Spark DataFrame.

    Every keyword argument is an option declared, defaulted and checked once in
    ``trainer.options.FitOptions``: a wrong value raises `OptionError` (a
    ValueError) naming it, an unknown name a TypeError; the checked values
    are `self.options`, each also an attribute of its name (set one: it is checked
    again).

    Args:
        model: a compiled ``keras.Model`` with a defined input shape, or a function
            with no arguments returning one (called once on the driver and once
            per worker task; use it for models that do not serialize).
        algorithm: an `Algorithm` instance (``DynSGD(window=5)``) or its name.
            The default, ``"auto"``, lets every fit choose from what it runs on
            (``trainer.algorithms.choice``, docs/guide.md#choosing-an-algorithm):
            ``DOWNPOUR(window="auto")`` for one worker, for CPU workers on one
            host or on hosts not known (Spark Connect), and with an option only
            the parameter server serves (``compression``, ``overlap``,
            ``ps_shards`` above 1); ``LocalSGD()`` for several workers on GPUs
            or on several hosts. The fit prints its choice and the reason
            (``fitted.history.choice``).
        num_workers: Integer. Number of long-lived worker tasks (one per slot).
            Or ``(min, max)``: an elastic fit (``trainer.fit.kinds.ElasticFit``,
            docs/faults.md) of the asynchronous parameter-server algorithms or
            local SGD (averaged by the driver's server over the workers of
            each round), one Spark job per epoch over chunks of the rows, on whatever
            executors Spark has (dynamic allocation on or off): workers join
            and leave while it runs, at most `max` train at once, and it stops
            after `retry_timeout` seconds below `min` task slots
            (``fitted.history.membership`` lists the changes).
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
            A collective fit (``"localsgd"``, ``"allreduce"``) saves at epoch ends
            only: its task 0 reports the group's state once per epoch.
        checkpoint_every: Integer. Server updates between two checkpoints of a
            parameter-server algorithm (a collective fit's server gets one update
            per epoch).
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
        verbose: Bool. The progress bar on the driver (its INFO logs: `TRAINER_LOG=info`).
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
            `shard_budget_mb`); see ``trainer.runtime.feeding.shard``.
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
            is one endpoint. Not for algorithms that keep optimizer state on the
            server (``SyncAveraging(average_optimizer_state=True)``).
        overlap: Bool. Hide the round trip of each commit: a worker sends its
            commit on a thread of its own and trains the next window meanwhile,
            then folds the reply in (the center plus the progress it has not
            seen). Its view of the center is one window older; it tells the
            server the commits it has not seen, so DynSGD's staleness counts
            them. For delta algorithms with a window (DOWNPOUR, ADAG, DynSGD,
            compressed or not); False (the default) waits for every reply.
    """

    def __init__(self, model: Any, **options: Any) -> None:
        if not (callable(model) or hasattr(model, "get_weights")):
            raise TypeError(
                f"`model` must be a compiled keras.Model or a function returning one. Received: {type(model)}"
            )
        self.model = model
        #: The checked options (``trainer.options.FitOptions``), also readable as attributes: ``trainer.epochs``.
        self.options = FitOptions.of("Trainer", options)

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
                CSVLogger, TensorBoard, ...); see ``trainer.fit.epoch_callbacks``.
        """
        if not self.mlflow:
            return drive_fit(self, df, resume_from, validation, callbacks, None)
        with RunLogger(run_name=f"trainer x{self.num_workers}") as run:  # renamed after the fit's choice
            return drive_fit(self, df, resume_from, validation, callbacks, run)


# help(Trainer) and notebooks show the keyword arguments with their defaults (declared in FitOptions).
Trainer.__init__.__signature__ = FitOptions.signature(("self", "model"))  # type: ignore[attr-defined]
