"""Keras callbacks on the driver, run on the CENTER model at the end of every epoch of a fit.

Workers run only the trainer's own exchange callback (``trainer.runtime.ps_worker.worker_task``);
the user's Keras callbacks (``Trainer.fit(df, callbacks=[...])``) run here, on
the driver, once per epoch that EVERY worker finished:

1. each worker reports the end of an epoch to the parameter server
   (EPOCH_DONE) with its training logs and, with validation data, the
   center's metrics on its validation rows;
2. when the last worker of the attempt reported, `EpochCallbacks` takes the
   center's weights and the logs weighted over the workers
   (``trainer.data.validation.weighted_metrics``) plus ``epoch_time_s``,
   ``updates``, ``bytes`` and ``staleness`` (mean) of the epoch's server
   updates, and hands them to a driver thread that loads the weights into the
   driver's Keras model and calls ``on_epoch_begin``/``on_epoch_end``;
3. when a callback sets ``model.stop_training`` (EarlyStopping) the server
   tells the workers to stop (``ParameterServer.direct(stop=True)``); when
   one changes the optimizer's learning rate (ReduceLROnPlateau) the server
   sends the new rate to the workers' optimizers;
4. after the stage, the final center is loaded (with the driver model's
   optimizer built, and the center's optimizer state when the algorithm averages
   it: what ``fitted.save`` saves) and ``on_train_end`` runs (EarlyStopping's
   ``restore_best_weights`` puts the best epoch's weights back: they are what
   ``fit`` returns).

Epochs are handed over in order: one that ends before an earlier one (an
elastic fit runs two epochs at once, ``trainer.spark.elastic_launch``) waits
for it. Callbacks run on a thread of their own, so a slow one (a checkpoint, a
TensorBoard write) never holds up the parameter server; epochs that end after
a stop are not reported. With ``inline=True`` (the all-reduce fit,
``trainer.fit.kinds.CollectiveFit``) they run on the server's thread before its reply to
the epoch's report instead: the workers wait for them and follow their stop or
new learning rate from the next epoch on, as plain Keras runs its callbacks
between two epochs.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import defaultdict
from typing import Any, Sequence

from trainer.data.validation import weighted_metrics

log = logging.getLogger("trainer")


def check_callbacks(callbacks: Sequence[Any], model, has_validation: bool) -> list:
    """The callbacks as a list, or a clear error before any cluster work."""
    import keras  # deferred: TensorFlow starts only when a fit does

    callbacks = list(callbacks or [])
    for cb in callbacks:
        if not isinstance(cb, keras.callbacks.Callback):
            raise TypeError(
                f"callbacks must be keras.callbacks.Callback instances. Received: {type(cb).__name__}. "
                "Fix: e.g. callbacks=[keras.callbacks.EarlyStopping(monitor='val_loss', patience=2)]."
            )
        monitor = getattr(cb, "monitor", None)
        if isinstance(monitor, str) and monitor.startswith("val_") and not has_validation:
            raise ValueError(
                f"{type(cb).__name__} monitors {monitor!r}, a validation metric, but fit received no validation "
                "data. Fix: fit(df, validation=val_df or a fraction such as 0.2), or monitor a training metric."
            )
        if isinstance(cb, keras.callbacks.ReduceLROnPlateau):
            rate = getattr(model.optimizer, "_learning_rate", None)
            if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
                raise ValueError(
                    f"ReduceLROnPlateau needs an optimizer with a plain learning rate; the model's optimizer uses "
                    f"the schedule {type(rate).__name__}. Fix: compile with a float learning rate, or drop "
                    "ReduceLROnPlateau (the schedule already decays the rate)."
                )
    return callbacks


def load_final_center(model, center: list) -> None:
    """Load the final `center` into the driver's `model`: the weights, and the optimizer's variables
    when the center holds them (``SyncAveraging(average_optimizer_state=True)``). The optimizer is
    built for the trainable variables either way, so that the model saves a real optimizer state (fresh
    when the center holds none) that loads without warnings and can go on training."""
    n_weights = len(model.weights)
    model.set_weights(center[:n_weights])
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return
    if not optimizer.built:
        optimizer.build(model.trainable_variables)
    if len(center) > n_weights:
        if len(center) != n_weights + len(optimizer.variables):
            raise ValueError(
                f"The final center has {len(center)} arrays, but the model has {n_weights} weights and "
                f"{len(optimizer.variables)} optimizer variables. Fix: build the same model (and optimizer) "
                "on the driver as on the workers."
            )
        for variable, value in zip(optimizer.variables, center[n_weights:]):
            variable.assign(value)


class EpochCallbacks:
    """The driver side of one fit's epochs: logs over the workers, Keras callbacks, stop and rate.

    Wire it to the parameter server: ``on_update`` and ``on_epoch_done`` as its
    hooks, then `start` before the stage, `restart` on a retry and `finish`
    after it. `epochs` holds the logs each completed epoch was reported with.
    """

    def __init__(self, model, callbacks: Sequence[Any], num_workers: int, epochs: int, inline: bool = False) -> None:
        import keras  # deferred: TensorFlow starts only when a fit does

        self.model = model
        self.inline = inline
        self.server: Any = None
        self.num_workers = num_workers
        self.list = keras.callbacks.CallbackList(list(callbacks), add_history=False, add_progbar=False, model=model,
                                                 epochs=epochs, verbose=0)
        self.epochs: list[dict[str, Any]] = []
        self.stopped_epoch: int | None = None
        self.error: BaseException | None = None
        self._reports: dict[int, dict[int, dict]] = defaultdict(dict)
        self._stats: dict[int, dict[str, float]] = defaultdict(lambda: {"updates": 0, "bytes": 0, "staleness": 0})
        self._done: set[int] = set()
        self._ready: dict[int, tuple[int, dict[str, Any], list]] = {}  # ended, waiting for an earlier epoch
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="trainer-callbacks", daemon=True)
        self._rate = self._learning_rate()
        self._last_end = time.time()

    # -- parameter-server hooks (server threads) ---------------------------------
    def on_update(self, record) -> None:
        if record.epoch is None:
            return
        stats = self._stats[record.epoch]
        stats["updates"] += 1
        stats["bytes"] += record.bytes_in + record.bytes_out
        stats["staleness"] += record.staleness

    def on_epoch_done(self, worker: int, epoch: int) -> None:
        done = self.server.epochs_done.get(worker)
        if done is None or epoch in self._done:
            return
        self._reports[epoch][worker] = dict(done.get("logs") or {}, end=done["time"])
        if len(self._reports[epoch]) < self.num_workers:
            return
        self._done.add(epoch)
        reports = self._reports.pop(epoch)
        logs = weighted_metrics([{k: v for k, v in r.items() if k != "end"} for r in reports.values()])
        stats = self._stats.get(epoch, {"updates": 0, "bytes": 0, "staleness": 0})
        end = max(r["end"] for r in reports.values())
        previous, self._last_end = self._last_end, end
        logs.update(epoch_time_s=end - previous,
                    updates=float(stats["updates"]), bytes=float(stats["bytes"]),
                    staleness=stats["staleness"] / stats["updates"] if stats["updates"] else 0.0)
        self._ready[epoch] = (epoch, logs, self.server.center())
        # In order: an epoch that ends before an earlier one (an elastic fit runs two at once) waits for it.
        while self._ready and min(self._ready) < min(self._reports, default=float("inf")):
            item = self._ready.pop(min(self._ready))
            if self.inline:
                self._handle(item)
            else:
                self._queue.put(item)

    # -- lifecycle (driver thread) ------------------------------------------------
    def start(self, server) -> None:
        self.server = server
        self._last_end = time.time()
        self.list.on_train_begin()
        if not self.inline:
            self._thread.start()

    def restart(self, num_workers: int) -> None:
        """A retried attempt: epochs not every worker finished are reported anew."""
        self.num_workers = num_workers
        self._reports.clear()

    def finish(self, center: list) -> None:
        """Wait for the pending epochs' callbacks, load the final `center`, run ``on_train_end``;
        raises a callback's error."""
        if not self.inline:
            self._queue.put(None)
            self._thread.join()
        if self.error is not None:
            raise self.error
        load_final_center(self.model, center)
        self.list.on_train_end()

    def close(self) -> None:
        """Stop the thread without ``on_train_end`` (fit failed)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout=60)

    # -- the callbacks' thread -------------------------------------------------------
    def _learning_rate(self) -> float | None:
        try:
            return float(self.model.optimizer.learning_rate)
        except (AttributeError, TypeError, ValueError):
            return None

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            self._handle(item)

    def _handle(self, item: tuple[int, dict[str, Any], list]) -> None:
        epoch, logs, center = item
        if self.stopped_epoch is not None or self.error is not None:
            return  # Keras runs no epoch after a stop
        try:
            self._epoch_end(epoch, logs, center)
        except BaseException as exc:  # raised by finish(); the workers stop now
            log.error("A callback failed at epoch %d: %s: %s", epoch + 1, type(exc).__name__, exc)
            self.error = exc
            self.server.direct(stop=True)

    def _epoch_end(self, epoch: int, logs: dict[str, Any], center: list) -> None:
        self.model.set_weights(center[: len(self.model.weights)])
        self.model.stop_training = False
        self.list.on_epoch_begin(epoch)
        self.list.on_epoch_end(epoch, logs)
        self.epochs.append({"epoch": epoch, **logs})
        rate = self._learning_rate()
        if rate is not None and rate != self._rate:
            self._rate = rate
            log.info("Epoch %d: learning rate now %g on every worker", epoch + 1, rate)
            self.server.direct(learning_rate=rate)
        if self.model.stop_training:
            self.stopped_epoch = epoch
            log.info("Epoch %d: a callback stopped training; the workers stop at their next exchange", epoch + 1)
            self.server.direct(stop=True)
