"""The one driver of a fit, for every kind: algorithm, plan, server, stage, callbacks, checkpoints, history, MLflow.

`drive_fit` runs a fit the same way whatever runs in its tasks; the kind
(``trainer.fit.kinds``: the parameter-server algorithms or the collective ones)
says what the tasks are, what the driver serves and how many reporters the
server hears from.

1. The algorithm: the trainer's, or with none named the one chosen for this
   cluster (``trainer.algorithms.choice``); it gives the kind of fit, which
   checks the Keras backend. The cluster is read from the session once
   (``trainer.spark.cluster_facts.FitCluster``: hosts, addresses, resource profile,
   task memory) and handed on; the controller (``trainer.controller``) makes
   the server's addresses, TLS identity and secret on it, then `plan_fit`
   checks everything else before any cluster work (``trainer.fit.plan``).
2. The driver builds the hooks every server update goes through (progress,
   the callbacks' epoch bookkeeping, the user's `on_update`, the
   checkpointer), the epoch-end hooks, and the kind's server.
3. The controller serves the one barrier stage with retries and closes the
   server, the progress bar, the callbacks and the checkpointer, whatever
   happens (a checkpoint that could not be written is recorded as an event,
   never raised: the trained model matters more than its last file).
4. The callbacks finish on the final center, and the `TrainingHistory` is
   built from the server's log and the tasks' records. After a callback
   stopped the fit, the history keeps only the epochs up to the stop: tasks
   of a parameter-server fit may end an epoch after the stop before they hear
   of it (a collective fit hears it before its next epoch, so it has none to
   drop), and a stopped fit reports what the callbacks saw.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from trainer.algorithms.choice import choose_algorithm, measured_choice
from trainer.controller import StageController, StageResult
from trainer.errors import TrainingFailedError
from trainer.fit.checkpoints import Checkpointer
from trainer.fit.epoch_callbacks import EpochCallbacks, check_callbacks
from trainer.fit.fitted import FittedModel, TrainingHistory
from trainer.fit.kinds import TaskLaunch, fit_kind
from trainer.fit.plan import FitPlan, plan_fit
from trainer.fit.progress import TrainingProgress
from trainer.lr_schedules import planned_steps
from trainer.ps.epoch_end import EpochEnds
from trainer.ps.epochs import uniform_progress
from trainer.spark.cluster_facts import FitCluster
from trainer.tracking import epoch_logger, fit_params

log = logging.getLogger("trainer")


def drive_fit(trainer, df, resume_from, validation, callbacks, run) -> FittedModel:
    """Train `trainer.model` on `df` (the module docstring); `run` is MLflow's or None."""
    import keras  # deferred: the backend starts only when a fit does

    cluster = FitCluster(df.sparkSession, trainer.gpus_per_worker)
    algorithm, choice = _algorithm(trainer, cluster)
    kind = fit_kind(trainer, algorithm)
    backend = keras.backend.backend()
    kind.check(backend)
    controller = StageController.of(cluster, trainer.options, kind.endpoints)
    plan = plan_fit(trainer, kind, df, cluster, resume_from, validation)
    logged = []  # MLflow's epoch logger, after the user's callbacks
    if run is not None:
        run.rename(f"trainer {algorithm.name} x{trainer.num_workers}")  # before the fit, the choice is provisional
        run.log_params(fit_params(trainer, algorithm, plan.model, plan.spec.num_rows, plan.validation_rows))
        logged.append(epoch_logger(run))
    callbacks = check_callbacks(callbacks, plan.model, plan.validation_rows > 0) + logged
    epoch_callbacks = EpochCallbacks(plan.model, callbacks, kind.reporters, trainer.epochs,
                                     inline=kind.inline_callbacks)
    steps = planned_steps(plan.spec.num_rows, trainer.num_workers, trainer.batch_size)
    progress = TrainingProgress(kind.progress_steps(steps), kind.reporters, trainer.epochs, enabled=trainer.verbose)
    if choice is not None:
        log.info("%s", choice.line())
        progress.note(choice.line())
    hooks: list[Callable] = [progress.update, epoch_callbacks.on_update]
    if trainer.on_update is not None:
        hooks.append(trainer.on_update)
    epoch_hooks: list[Callable] = [epoch_callbacks.on_epoch_done]
    epoch_ends = EpochEnds(trainer.on_epoch_end) if trainer.on_epoch_end is not None else None
    if epoch_ends is not None:
        epoch_hooks.append(epoch_ends.on_epoch_done)
    server = kind.server(
        **controller.server_endpoint(), center=plan.center, num_workers=kind.reporters,
        io_timeout=trainer.io_timeout, round_timeout=trainer.io_timeout,
        on_update=lambda record: [hook(record) for hook in hooks],
        on_epoch_done=lambda worker, epoch: [hook(worker, epoch) for hook in epoch_hooks],
        version=plan.version, epochs_done=uniform_progress(plan.completed_epochs, kind.reporters) if plan.resumed
        else {}, weight_names=[w.path for w in plan.model.weights], frame_mac=trainer.frame_mac,
        history_size=trainer.history_size,
    )
    if epoch_ends is not None:
        epoch_ends.bind(server)
    if kind.membership is not None:  # an elastic fit: each join and leave above the progress bar
        kind.membership.on_change = lambda change: progress.note(kind.membership.line(change))
    checkpoint_dir = trainer.checkpoint_dir if trainer.checkpoint_dir is not None else resume_from
    checkpointer = _checkpointer(trainer, algorithm, plan, server, checkpoint_dir)
    if checkpointer is not None:
        hooks.append(checkpointer.on_update)
        epoch_hooks.insert(0, checkpointer.on_epoch_done)  # the epoch's checkpoint before its callbacks
    events: list[dict] = []
    if plan.resumed is not None:
        events.append({"time": time.time(), "event": "resumed", "from": str(resume_from),
                       "version": plan.version, "completed_epochs": plan.completed_epochs})
    shard_budget = None if trainer.shard_budget_mb is None else int(trainer.shard_budget_mb * 1024 * 1024)
    task_memory = cluster.task_memory

    def launch(attempt: int, workers: int) -> TaskLaunch:
        server.start_attempt(attempt)  # leftover tasks of an older attempt are refused from now on
        return TaskLaunch(controller.host, attempt, workers, backend, shard_budget, task_memory)

    def on_retry(workers: int) -> None:
        reporters = kind.on_retry(server, workers)
        progress.restart(reporters)
        epoch_callbacks.restart(reporters)

    def finish_checkpoints() -> None:
        problem = checkpointer.finish() if checkpointer is not None else None  # logged, never raised
        if problem is not None:
            events.append({"time": time.time(), "event": "checkpoint_failed", "path": str(checkpoint_dir),
                           "error": problem})

    stage = controller.serve(server, lambda: kind.run_stage(
        controller, plan, server, launch, on_started=lambda: epoch_callbacks.start(server), on_retry=on_retry,
        events=events, stopped=lambda: epoch_callbacks.stopped_epoch is not None,
        fatal=lambda: server.failure and TrainingFailedError(
            f"Training stopped: the parameter server {server.failure}")),
        closers=(progress.close, epoch_callbacks.close, finish_checkpoints))
    history = _history(trainer, kind.algorithm, server, epoch_callbacks, stage, events)
    if kind.membership is not None:
        history.membership = kind.membership.timeline()
    if choice is not None:
        history.choice = measured_choice(choice, stage.records).record()
    log.info("Trained in %.1f s (%.1f s per epoch, data delivery %.1f s), %s", history.timings["wall_s"],
             history.timings["epoch_s"], history.timings["data_delivery_s"], kind.summary(history))
    fitted = FittedModel(plan.model, history, trainer.features_col, trainer.label_col, plan.spec,
                         trainer.custom_objects)
    if run is not None:
        run.log_metrics({"wall_s": history.timings["wall_s"], "total_updates": history.num_updates,
                         "total_bytes": history.bytes_moved})
        run.log_model(plan.model, plan.spec.input_shape, fitted._shipped().custom_objects)
    return fitted


def _algorithm(trainer, cluster: FitCluster) -> tuple:
    """``(algorithm, choice)``: with no algorithm named, the algorithm for this fit's cluster
    (``trainer.algorithms.choice``: its hosts are known now; a warning where an option only the parameter server
    serves replaced local SGD), else the trainer's own (choice None)."""
    default = trainer.options.algorithm_choice
    if default is None:
        return trainer.algorithm, None
    choice = choose_algorithm(trainer.options.facts(cluster.hosts), warn=True)
    # the trainer's algorithm when the choice is the same (a compressed one included), else the one chosen
    return (trainer.algorithm if choice.algorithm == default.algorithm else choice.algorithm), choice


def _checkpointer(trainer, algorithm, plan: FitPlan, server, checkpoint_dir) -> Checkpointer | None:
    if checkpoint_dir is None:
        return None
    return Checkpointer(checkpoint_dir, server, trainer.checkpoint_every, {
        "num_workers": trainer.num_workers, "algorithm": algorithm.describe(), "epochs": trainer.epochs,
        "model": plan.model.name, "num_weights": len(plan.model.weights),
    }, keep=trainer.checkpoint_keep)


def _history(trainer, algorithm, server, epoch_callbacks: EpochCallbacks, stage: StageResult,
             events: list[dict]) -> TrainingHistory:
    """The final center in the driver's model (then on_train_end), and the history (the module docstring, 4)."""
    epoch_callbacks.finish(server.center())  # the final weights, then on_train_end (restore_best_weights)
    stopped = epoch_callbacks.stopped_epoch
    if stopped is not None:
        events.append({"time": time.time(), "event": "stopped_by_callback", "epoch": stopped})
    history = TrainingHistory.build(algorithm.describe(), trainer.num_workers, server, stage.records, stage.start,
                                    stage.end, events)
    if stopped is not None:
        history.epochs = [e for e in history.epochs if e["epoch"] <= stopped]
    reported = {e["epoch"]: e for e in epoch_callbacks.epochs}
    for entry in history.epochs:
        entry.update({k: v for k, v in reported.get(entry["epoch"], {}).items() if k not in entry})
    return history
