"""The one driver of a fit, for every kind: plan, server, stage, callbacks, checkpoints, history, MLflow.

`drive_fit` runs a fit the same way whatever runs in its tasks; the kind
(``trainer.fit.kinds``: the parameter-server rules or the collective one)
says what the tasks are and how many reporters the server hears from.

1. The kind checks the Keras backend, then `plan_fit` checks everything else
   before any cluster work (``trainer.fit.plan``).
2. The driver builds the hooks every server update goes through (progress,
   the callbacks' epoch bookkeeping, the user's `on_update`, the
   checkpointer), the epoch-end hooks, and the server.
3. ``trainer.fit.stage`` runs the one barrier stage with retries and closes
   everything, whatever happens.
4. The callbacks finish on the final center, and the `TrainingHistory` is
   built from the server's log and the tasks' records. After a callback
   stopped the fit, the history keeps only the epochs up to the stop: tasks
   of a parameter-server fit may end an epoch after the stop before they hear
   of it (a collective fit hears it before its next epoch, so it has none to
   drop), and a stopped fit reports what the callbacks saw.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Callable

from trainer.algorithms.choice import choose_rule, measured_choice
from trainer.fit.checkpoints import Checkpointer
from trainer.fit.epoch_callbacks import EpochCallbacks, check_callbacks
from trainer.fit.fitted import FittedModel, TrainingHistory
from trainer.fit.kinds import fit_kind
from trainer.fit.plan import FitPlan, plan_fit
from trainer.fit.progress import TrainingProgress
from trainer.fit.stage import run_fit_stage
from trainer.lr_schedules import planned_steps
from trainer.ps.epoch_end import EpochEnds
from trainer.ps.server import uniform_progress
from trainer.spark.launch import driver_addresses
from trainer.spark.session import fit_hosts
from trainer.spark.task_memory import task_memory_bytes
from trainer.tracking import epoch_logger, fit_params
from trainer.transport.tls import TlsIdentity
from trainer.transport.wire import new_secret

log = logging.getLogger("trainer")


def drive_fit(options, df, resume_from, validation, callbacks, run) -> FittedModel:
    """Train `options.model` on `df` (the module docstring); `options` is the `Trainer`, `run` MLflow's or None."""
    import keras  # deferred: the backend starts only when a fit does

    spark = df.sparkSession
    options, choice = _choose_rule(options, spark)
    kind = fit_kind(options)
    backend = keras.backend.backend()
    kind.check(backend)
    identity = TlsIdentity.generate() if options.tls else None  # a missing tool fails before any cluster work
    host, bind, port = driver_addresses(spark, options.ps_host, options.ps_bind_host, options.ps_port, kind.shards)
    plan = plan_fit(options, df, resume_from, validation)
    callbacks = check_callbacks(callbacks, plan.model, plan.validation_rows > 0)
    if run is not None:
        run.log_params(fit_params(options, plan.model, plan.spec.num_rows, plan.validation_rows))
        callbacks.append(epoch_logger(run))
    epoch_callbacks = EpochCallbacks(plan.model, callbacks, kind.reporters, options.epochs,
                                     inline=kind.inline_callbacks)
    steps = planned_steps(plan.spec.num_rows, options.num_workers, options.batch_size)
    progress = TrainingProgress(kind.progress_steps(steps), kind.reporters, options.epochs, enabled=options.verbose)
    if choice is not None:
        log.info("%s", choice.line())
        progress.note(choice.line())
    hooks: list[Callable] = [progress.update, epoch_callbacks.on_update]
    if options.on_update is not None:
        hooks.append(options.on_update)
    epoch_hooks: list[Callable] = [epoch_callbacks.on_epoch_done]
    epoch_ends = EpochEnds(options.on_epoch_end) if options.on_epoch_end is not None else None
    if epoch_ends is not None:
        epoch_hooks.append(epoch_ends.on_epoch_done)
    server = kind.server(
        algorithm=options.algorithm, center=plan.center, num_workers=kind.reporters, secret=new_secret(),
        host=bind, port=port, io_timeout=options.io_timeout, round_timeout=options.io_timeout,
        on_update=lambda record: [hook(record) for hook in hooks],
        on_epoch_done=lambda worker, epoch: [hook(worker, epoch) for hook in epoch_hooks],
        version=plan.version, epochs_done=uniform_progress(plan.completed_epochs, kind.reporters) if plan.resumed
        else {}, weight_names=[w.path for w in plan.model.weights], frame_mac=options.frame_mac,
        tls=identity or False, history_size=options.history_size,
    )
    if epoch_ends is not None:
        epoch_ends.bind(server)
    checkpoint_dir = options.checkpoint_dir if options.checkpoint_dir is not None else resume_from
    checkpointer = _checkpointer(options, plan, server, checkpoint_dir)
    if checkpointer is not None:
        hooks.append(checkpointer.on_update)
        epoch_hooks.insert(0, checkpointer.on_epoch_done)  # the epoch's checkpoint before its callbacks
    events: list[dict] = []
    if plan.resumed is not None:
        events.append({"time": time.time(), "event": "resumed", "from": str(resume_from),
                       "version": plan.version, "completed_epochs": plan.completed_epochs})
    shard_budget = None if options.shard_budget_mb is None else int(options.shard_budget_mb * 1024 * 1024)
    task_memory = task_memory_bytes(spark)

    def make_task(attempt: int, workers: int):
        server.start_attempt(attempt)  # leftover tasks of an older attempt are refused from now on
        return kind.task(plan, server, host, attempt, workers, backend, shard_budget, task_memory)

    def on_retry(workers: int) -> None:
        reporters = kind.on_retry(server, workers)
        progress.restart(reporters)
        epoch_callbacks.restart(reporters)

    stage, job_start, job_end = run_fit_stage(
        plan.frame, options.num_workers, make_task, kind.retry_policy(), kind.description(plan.model.name),
        server=server, progress=progress, epoch_callbacks=epoch_callbacks, checkpointer=checkpointer,
        checkpoint_dir=checkpoint_dir, events=events, on_retry=on_retry, profile=plan.profile)
    records = [json.loads(r.history) for r in stage.rows]
    history = _history(options, server, epoch_callbacks, records, job_start, job_end, events)
    if choice is not None:
        history.choice = measured_choice(choice, records).record()
    log.info("Trained in %.1f s (%.1f s per epoch, data delivery %.1f s), %s", history.timings["wall_s"],
             history.timings["epoch_s"], history.timings["data_delivery_s"], kind.summary(history))
    fitted = FittedModel(plan.model, history, options.features_col, options.label_col, plan.spec,
                         options.custom_objects)
    if run is not None:
        run.log_metrics({"wall_s": history.timings["wall_s"], "total_updates": history.num_updates,
                         "total_bytes": history.bytes_moved})
        run.log_model(plan.model, plan.spec.input_shape, fitted._shipped().custom_objects)
    return fitted


class _WithRule:
    """The trainer's options with the rule this fit chose at its start in place of the trainer's own."""

    def __init__(self, options, rule) -> None:
        self._options, self.algorithm = options, rule

    def __getattr__(self, name: str):
        return getattr(self._options, name)


def _choose_rule(options, spark) -> tuple:
    """``(options, choice)``: with no rule named, the rule for this fit's cluster (``trainer.algorithms.choice``:
    its hosts are known now), the trainer's own options otherwise (choice None)."""
    if options.options.rule_choice is None:
        return options, None
    choice = choose_rule(options.options.facts(fit_hosts(spark)))
    if choice.rule == options.options.rule_choice.rule:
        return options, choice  # the trainer's rule (a compressed one included) is this fit's
    return _WithRule(options, choice.rule), choice


def _checkpointer(options, plan: FitPlan, server, checkpoint_dir) -> Checkpointer | None:
    if checkpoint_dir is None:
        return None
    return Checkpointer(checkpoint_dir, server, options.checkpoint_every, {
        "num_workers": options.num_workers, "algorithm": options.algorithm.describe(), "epochs": options.epochs,
        "model": plan.model.name, "num_weights": len(plan.model.weights),
    }, keep=options.checkpoint_keep)


def _history(options, server, epoch_callbacks: EpochCallbacks, results: list[dict], job_start: float,
             job_end: float, events: list[dict]) -> TrainingHistory:
    """The final center in the driver's model (then on_train_end), and the history (the module docstring, 4)."""
    epoch_callbacks.finish(server.center())  # the final weights, then on_train_end (restore_best_weights)
    stopped = epoch_callbacks.stopped_epoch
    if stopped is not None:
        events.append({"time": time.time(), "event": "stopped_by_callback", "epoch": stopped})
    history = TrainingHistory.build(options.algorithm.describe(), options.num_workers, server, results, job_start,
                                    job_end, events)
    if stopped is not None:
        history.epochs = [e for e in history.epochs if e["epoch"] <= stopped]
    reported = {e["epoch"]: e for e in epoch_callbacks.epochs}
    for entry in history.epochs:
        entry.update({k: v for k, v in reported.get(entry["epoch"], {}).items() if k not in entry})
    return history
