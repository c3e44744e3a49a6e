"""The driver side of a collective fit: ``Trainer(algorithm=AllReduce()).fit(df)``.

`Trainer.fit` hands a rule with ``collective = True``
(``trainer.algorithms.allreduce``) to `fit_collective`. The plan and every
check before cluster work are the trainer's own (``Trainer._plan``: the
model, the checkpoint, the columns and values, the free slots: a cluster that
cannot run all N tasks at once fails there), plus one: the Keras backend must
have a collective path (JAX, TensorFlow and torch do), or the fit fails
naming those that do.

Then ONE barrier stage of N tasks (``trainer.runtime.collective.task``) trains
as one group on the backend's collective engine, all-reducing every step's
gradients among the tasks.
The driver keeps what the other rules give it, through the same parameter
server with a single client (task 0) that reports once per epoch:

* progress (one update per epoch), the `TrainingHistory`, the epoch-end
  metrics (training logs over the global batches, validation weighted over
  every task's validation rows);
* checkpoints of task 0's state (weights and optimizer variables) at every
  epoch end; a lost worker fails the stage, and the retry (``max_retries``)
  resumes every task from the last epoch end, on all `num_workers` workers
  (the global batch is ``num_workers * batch_size``: a collective fit never
  shrinks, `min_workers` does not apply);
* Keras callbacks on the driver (``trainer.callbacks``), run before the
  reply to task 0's report (``inline``): a stop or a new learning rate holds
  from the next epoch on, as in plain Keras.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from typing import Any, Callable

from trainer.callbacks import EpochCallbacks, check_callbacks
from trainer.checkpoint import Checkpointer
from trainer.fit_stage import run_fit_stage
from trainer.fitted import FittedModel, TrainingHistory
from trainer.lr_schedules import planned_steps
from trainer.progress import TrainingProgress
from trainer.ps.epoch_end import EpochEnds
from trainer.ps.server import ParameterServer, uniform_progress
from trainer.runtime.collective.task import CollectiveConfig, train_collective_partition
from trainer.runtime.shipping import PickledSource
from trainer.spark.launch import RetryPolicy, driver_addresses
from trainer.spark.memory import task_memory_bytes
from trainer.tracking import epoch_logger, fit_params
from trainer.transport.tls import TlsIdentity
from trainer.transport.wire import new_secret

log = logging.getLogger("trainer")


def fit_collective(trainer, df, resume_from, validation, callbacks, run) -> FittedModel:
    """`Trainer._fit` for a collective rule (the module docstring); `run` is the MLflow `RunLogger` or None."""
    import keras  # deferred: the backend starts only when a fit does

    backend = keras.backend.backend()
    trainer.algorithm.check_backend(backend)  # before any cluster work
    identity = TlsIdentity.generate() if trainer.tls else None
    spark = df.sparkSession
    host, bind, port = driver_addresses(spark, trainer.ps_host, trainer.ps_bind_host, trainer.ps_port)
    plan = trainer._plan(df, resume_from, validation)
    callbacks = check_callbacks(callbacks, plan.model, plan.validation_rows > 0)
    if run is not None:
        run.log_params(fit_params(trainer, plan.model, plan.spec.num_rows, plan.validation_rows))
        callbacks.append(epoch_logger(run))
    # The server hears from task 0 only: one "worker" whose epochs are everybody's.
    epoch_callbacks = EpochCallbacks(plan.model, callbacks, 1, trainer.epochs, inline=True)
    steps = planned_steps(plan.spec.num_rows, trainer.num_workers, trainer.batch_size)
    progress = TrainingProgress(steps * trainer.epochs, 1, trainer.epochs, enabled=trainer.verbose)
    epochs_done = uniform_progress(plan.resumed.completed_epochs, 1) if plan.resumed is not None else {}
    checkpointer: Checkpointer | None = None
    hooks: list[Callable] = [progress.update, epoch_callbacks.on_update] + ([trainer.on_update] if trainer.on_update
                                                                            else [])
    epoch_ends = EpochEnds(trainer.on_epoch_end) if trainer.on_epoch_end is not None else None

    def on_epoch_done(worker: int, epoch: int) -> None:
        if checkpointer is not None:
            checkpointer.on_epoch_done(worker, epoch)
        epoch_callbacks.on_epoch_done(worker, epoch)
        if epoch_ends is not None:
            epoch_ends.on_epoch_done(worker, epoch)

    server = ParameterServer(
        trainer.algorithm, plan.center, 1, new_secret(), host=bind, port=port, io_timeout=trainer.io_timeout,
        round_timeout=trainer.io_timeout, on_update=lambda record: [hook(record) for hook in hooks],
        on_epoch_done=on_epoch_done, version=plan.version, epochs_done=epochs_done,
        weight_names=[w.path for w in plan.model.weights], frame_mac=trainer.frame_mac, tls=identity or False,
        history_size=trainer.history_size,
    )
    if epoch_ends is not None:
        epoch_ends.bind(server)
    checkpoint_dir = trainer.checkpoint_dir if trainer.checkpoint_dir is not None else resume_from
    if checkpoint_dir is not None:
        checkpointer = Checkpointer(checkpoint_dir, server, trainer.checkpoint_every, {
            "num_workers": trainer.num_workers, "algorithm": trainer.algorithm.describe(), "epochs": trainer.epochs,
            "model": plan.model.name, "num_weights": len(plan.model.weights),
        }, keep=trainer.checkpoint_keep)
        hooks.append(checkpointer.on_update)
    events: list[dict] = []
    if plan.resumed is not None:
        events.append({"time": time.time(), "event": "resumed", "from": str(resume_from),
                       "version": plan.version, "completed_epochs": plan.resumed.completed_epochs})
    shard_budget = None if trainer.shard_budget_mb is None else int(trainer.shard_budget_mb * 1024 * 1024)
    task_memory = task_memory_bytes(spark)

    def make_task(attempt: int, workers: int):
        server.start_attempt(attempt)  # leftover tasks of an older attempt are refused from now on
        return functools.partial(train_collective_partition, CollectiveConfig(
            model=PickledSource.of(plan.source), ps_host=host, ps_port=server.address[1], secret=server.credentials,
            num_workers=workers, batch_size=trainer.batch_size, epochs=trainer.epochs,
            input_shape=plan.spec.input_shape, label_size=plan.spec.label_size, attempt=attempt, seed=trainer.seed,
            io_timeout=trainer.io_timeout, keras_backend=backend, feed=trainer.feed, shard_budget=shard_budget,
            task_memory=task_memory, lr_scaling=trainer.algorithm.lr_scaling,
        ))

    def on_retry(workers: int) -> None:
        progress.restart(1)
        epoch_callbacks.restart(1)

    stage, job_start, job_end = run_fit_stage(
        plan.frame, trainer.num_workers, make_task, RetryPolicy(trainer.max_retries, trainer.retry_timeout, None),
        f"trainer: {plan.model.name} {trainer.algorithm.describe()} x{trainer.num_workers}", server=server,
        progress=progress, epoch_callbacks=epoch_callbacks, checkpointer=checkpointer,
        checkpoint_dir=checkpoint_dir, events=events, on_retry=on_retry, profile=plan.profile)
    return _fitted(trainer, plan, server, epoch_callbacks, [json.loads(r.history) for r in stage.rows],
                   job_start, job_end, events, run)


def _fitted(trainer, plan, server, epoch_callbacks: EpochCallbacks, results: list[dict], job_start: float,
            job_end: float, events: list[dict], run: Any) -> FittedModel:
    """The fitted model: the final center in the driver's model, the history, MLflow's last entries."""
    epoch_callbacks.finish(server.center())  # the final state, then on_train_end (restore_best_weights)
    if epoch_callbacks.stopped_epoch is not None:
        events.append({"time": time.time(), "event": "stopped_by_callback", "epoch": epoch_callbacks.stopped_epoch})
    history = TrainingHistory.build(trainer.algorithm.describe(), trainer.num_workers, server, results, job_start,
                                    job_end, events)
    reported = {e["epoch"]: e for e in epoch_callbacks.epochs}
    for entry in history.epochs:
        entry.update({k: v for k, v in reported.get(entry["epoch"], {}).items() if k not in entry})
    log.info("Trained in %.1f s (%.1f s per epoch, data delivery %.1f s), all-reduce over %d workers",
             history.timings["wall_s"], history.timings["epoch_s"], history.timings["data_delivery_s"],
             trainer.num_workers)
    fitted = FittedModel(plan.model, history, trainer.features_col, trainer.label_col, plan.spec,
                         trainer.custom_objects)
    if run is not None:
        run.log_metrics({"wall_s": history.timings["wall_s"], "total_updates": history.num_updates,
                         "total_bytes": history.bytes_moved})
        run.log_model(plan.model, plan.spec.input_shape, fitted._shipped().custom_objects)
    return fitted
