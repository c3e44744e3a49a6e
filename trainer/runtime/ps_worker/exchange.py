"""The worker's Keras callback: exchanges with the parameter server, shared epochs, the server's directives.

`WorkerExchange` holds the logic in small named parts (when to exchange,
the commit's meta, sending and waiting or sending overlapped, booking the
time, the server's directives, shared epochs); `make_sync_callback` mixes
it into Keras's ``Callback`` (Keras loads only then) as the
``ParameterServerSync`` callback that the
task loop (``trainer.runtime.ps_worker.worker_task``) and ``make bench-gpu``
(``benchmarks/bench_gpu.py``) run inside plain ``model.fit``. When to exchange is
the algorithm's window, counted by a `trainer.algorithms.cadence.WindowCadence` (a fixed
number of batches, once per epoch, or ``"auto"``: sized from the measured
step and exchange times). Each exchange first waits for the steps a backend
with asynchronous dispatch still has queued (``trainer.backends``),
so that its clock measures the exchange alone: the time is booked in the
task's record as ``comm_s`` and its parts (``exchange_s``: state, payload,
round trip, load), and the training time between exchanges sizes an
automatic window.

Neither pyspark nor a Keras backend is imported at module level: Keras
loads when the callback is built, after the process was set up
(``trainer.runtime.process``).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from trainer.algorithms import ParameterServerAlgorithm
from trainer.algorithms.cadence import WindowCadence
from trainer.algorithms.delta import fold_late, overlappable
from trainer.backends import current
from trainer.runtime.inference import validation_logs
from trainer.runtime.state import load_state, model_state


class WorkerExchange:
    """Exchanges with the parameter server every `window` batches; ends shared epochs.

    One instance lives through every ``fit`` call of a task: `begin` once,
    then `start_epoch`/`finish_epoch` around the passes of each epoch, then
    `finish`.
    """

    def __init__(self, client, algorithm: ParameterServerAlgorithm, worker: int, record: dict, budget: int | None,
                 validation: tuple | None = None, validation_batch_size: int = 256, overlap: bool = False,
                 epoch_batches: int | None = None, workers: int = 1, count_batches: bool = False) -> None:
        super().__init__()  # keras.callbacks.Callback's, in the class make_sync_callback builds
        self.client, self.algorithm, self.worker, self.record = client, algorithm, worker, record
        self.budget, self.validation, self.validation_batch_size = budget, validation, validation_batch_size
        self.count_batches = count_batches or budget is not None  # every commit says the batches it holds
        self.with_optimizer = algorithm.exchanges_optimizer_state
        self.since = 0
        self.step = 0
        self.epoch = 0
        self.epoch_over = False
        self.stopped = False  # the driver said stop
        self.logs: dict[str, float] = {}
        self.anchor: list[np.ndarray] = []
        self.residual: list[np.ndarray] | None = None  # what a lossy codec left for the next commit
        self.rate = None  # a trainer.runtime.collective.rates.ScaledRate the task set, or None: the compiled rate
        self.overlap = overlap and overlappable(algorithm)
        self.in_flight: Future | None = None  # the commit whose reply is not folded in yet (overlap)
        # Center versions: of the connection's last reply, and of the center the weights stem from
        # (older with a commit in flight, or after a validation pull); the difference is staleness
        # the server cannot see (COMMIT meta "unseen", trainer.ps.commits).
        self.seen_version = self.base_version = 0
        self.sender = ThreadPoolExecutor(1, thread_name_prefix="ps-commit") if self.overlap else None
        self.cadence = WindowCadence(algorithm.window, epoch_batches or budget, workers,
                                     getattr(algorithm, "window_bound", None), getattr(algorithm, "window_warmup", 0))
        # Training time and batches since the last exchange (or the start of this fit call): an
        # automatic window is sized from them.
        self.clock = time.perf_counter()
        self.timed = 0

    def begin(self, model, version: int = 0) -> None:
        """Start from the center of version `version` (HELLO's) already loaded into `model`."""
        self.seen_version = self.base_version = version
        self.set_model(model)
        if self.with_optimizer:
            model.optimizer.build(model.trainable_variables)
        self.anchor = model_state(model, self.with_optimizer)

    def start_epoch(self, epoch: int) -> None:
        self.epoch, self.epoch_over = epoch, False
        self.record["epochs"].append({"epoch": epoch, "start": time.time(), "batches": 0})

    # The exchange runs when the next batch begins or the pass ends, never in a batch-END
    # hook: with one, Keras turns every batch's logs into Python floats on the training
    # thread; without, it does so on its own thread, as for plain Keras.
    def on_train_begin(self, logs=None):
        self.clock, self.timed = time.perf_counter(), 0  # what ran between two fit calls is not training

    def on_train_batch_begin(self, batch, logs=None):
        if self.timed == 1:  # the first step is done: in a new process, its compile with it
            self.record.setdefault("first_step_end", time.time())
        if self.cadence.due(self.since) and not self.stopped:
            self.exchange(None)
        self.step += 1
        self.since += 1
        self.timed += 1
        self.record["epochs"][-1]["batches"] += 1

    def on_epoch_end(self, epoch, logs=None):
        self.logs = {k: float(v) for k, v in (logs or {}).items()}
        if self.cadence.due(self.since) and not self.stopped:
            self.exchange(self.logs)

    def running_loss(self) -> float:
        """The epoch's mean training loss so far (Keras's loss tracker), without waiting for batch logs."""
        tracker = next((m for m in self.model.metrics if m.name == "loss"), None)
        return float("nan") if tracker is None else float(tracker.result())

    def finish_epoch(self) -> None:
        self.fold_in_flight()
        if self.cadence.window is None and not self.stopped:
            self.exchange(self.logs)
        if self.stopped:
            return
        if self.validation is not None:
            self.logs.update(self.validate_center())
        self.record["epochs"][-1].update(end=time.time(), logs=self.logs)
        self.follow(self.client.epoch_done(self.epoch, self.logs))

    def validate_center(self) -> dict[str, float]:
        """The center's metrics on this worker's validation rows (its own weights stay)."""
        center, self.seen_version = self.client.pull()
        own = self.model.get_weights()
        self.model.set_weights(list(center[: len(own)]))
        logs = validation_logs(self.model, *self.validation, self.validation_batch_size)
        self.model.set_weights(own)
        return {**logs, "rows": float(self.record["rows"]), "val_rows": float(len(self.validation[0]))}

    def follow(self, meta: dict) -> None:
        """Honour the server's directives: a new learning rate, or stop."""
        rate = meta.get("learning_rate")
        if rate is not None and self.rate is not None:  # a scaled rate (elastic local SGD): scaled the same way
            if self.rate.base != rate:
                self.rate.follow(rate)
        elif rate is not None and float(self.model.optimizer.learning_rate) != rate:
            self.model.optimizer.learning_rate = rate
        if meta.get("stop"):
            self.stopped = self.model.stop_training = True

    def finish(self) -> None:
        if self.since and not self.stopped:
            self.exchange(self.logs)
        self.fold_in_flight()
        if self.sender is not None:
            self.sender.shutdown()
        self.record["window"] = {"kind": "auto" if self.cadence.auto else "fixed", "last": self.cadence.window,
                            "max": self.cadence.max_window if self.cadence.auto else self.cadence.window,
                            "step_s": self.cadence.step_s, "exchange_s": self.cadence.exchange_s}

    def exchange(self, logs) -> None:
        """One commit and its reply, timed in parts (the module docstring)."""
        model = self.model  # under JAX this puts the state of the running fit back into the variables
        current().wait_for_steps(model)  # queued steps are training, not communication (trainer.backends)
        started = time.perf_counter()
        train_s, trained = started - self.clock, self.timed
        weights = model_state(model, self.with_optimizer)
        got_state = time.perf_counter()
        payload, self.residual = self.algorithm.worker_commit(weights, self.anchor, self.residual)
        encoded = time.perf_counter()
        send = self.send_overlapped if self.overlap else self.send_and_wait
        reply_meta, replied = send(weights, payload, self.commit_meta(logs))
        if reply_meta is None:  # a synchronous round ended by the driver: nothing to apply
            return
        self.since = 0
        done = time.perf_counter()
        self.book(done - started, {"state": got_state - started, "payload": encoded - got_state,
                                   "round_trip": replied - encoded, "load": done - replied})
        self.cadence.observe(trained, train_s, done - started)
        self.clock, self.timed = done, 0
        self.check_epoch_over(reply_meta)

    def commit_meta(self, logs) -> dict:
        """What a commit tells the server besides its payload: who, when, the loss, the batches it holds."""
        loss = float(logs["loss"]) if logs and "loss" in logs else self.running_loss()
        meta = {"worker": self.worker, "epoch": self.epoch, "step": self.step, "loss": loss}
        if self.count_batches:
            meta["batches"] = self.since
        return meta

    def send_and_wait(self, weights: list, payload, meta: dict) -> tuple[dict | None, float]:
        """Commit, wait for the reply and apply it; (its meta, or None when a round ended without one; when)."""
        self.note_unseen(meta, in_flight=False)
        reply, reply_meta = self.client.commit(payload, meta)
        replied = time.perf_counter()
        self.stem_from(reply_meta)
        self.follow(reply_meta)
        if self.stopped and not reply:
            return None, replied
        new_weights, self.anchor = self.algorithm.worker_apply(weights, self.anchor, reply)
        load_state(self.model, new_weights, with_optimizer=self.with_optimizer, strict=False)
        return reply_meta, replied

    def send_overlapped(self, weights: list, payload, meta: dict) -> tuple[dict, float]:
        """Fold in the reply of the commit in flight, then send this one on the sender's thread."""
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
        self.in_flight = self.sender.submit(self.client.commit, payload, meta)
        return reply_meta, replied

    def book(self, seconds: float, parts: dict[str, float]) -> None:
        """One exchange in the task's record: the count, the time, and the time of each part."""
        self.record["commits"] += 1
        self.record["comm_s"] += seconds
        for part, spent in parts.items():
            self.record["exchange_s"][part] += spent

    def check_epoch_over(self, reply_meta: dict) -> None:
        """A shared epoch ends once the server counted its batches; ({}: no reply, nothing to check)."""
        if self.budget is not None and reply_meta and reply_meta.get("epoch_batches", self.budget) >= self.budget:
            self.epoch_over = True
            self.model.stop_training = True

    def note_unseen(self, meta: dict, in_flight: bool) -> None:
        """Tell the server the commits of the others that the payload's base has not seen beyond the
        last reply: with a commit in flight, whose reply counted that commit too (hence the
        -1), or after a validation pull."""
        unseen = self.seen_version - self.base_version - int(in_flight)
        if unseen > 0 and not self.algorithm.synchronous:
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
        self.record["comm_s"] += time.perf_counter() - started
        self.follow(reply_meta)
        self.check_epoch_over(reply_meta)


def make_sync_callback(client, algorithm: ParameterServerAlgorithm, worker: int, record: dict, budget: int | None,
                       validation: tuple | None = None, validation_batch_size: int = 256, overlap: bool = False,
                       epoch_batches: int | None = None, workers: int = 1, count_batches: bool = False):
    """Build the Keras callback (imported lazily: keras must load after configure_process).

    `budget` is the number of minibatches in one epoch over all workers when
    the workers share each epoch (asynchronous algorithms with a window), else None;
    `epoch_batches` the same whether shared or not, and `workers` how many
    train together (they bound an automatic window, `trainer.algorithms.cadence`);
    `count_batches` makes every commit count its batches even when epochs are
    not shared (an elastic fit's chunk tasks: the server keeps what each chunk
    committed, ``trainer.runtime.ps_worker.chunk_task``);
    `validation` is this worker's (x, y) validation rows, or None. With
    `overlap` (delta algorithms with a window only) a commit's round trip runs on a
    thread of its own while the next window trains; its reply is folded in at
    the next exchange (``trainer.algorithms.delta.fold_late``), and every
    epoch end waits for it.
    """
    import keras  # deferred: TensorFlow starts only when a model is needed

    callback = type("ParameterServerSync", (WorkerExchange, keras.callbacks.Callback),
                    {"__doc__": WorkerExchange.__doc__})
    return callback(client, algorithm, worker, record, budget, validation, validation_batch_size, overlap,
                    epoch_batches, workers, count_batches)
