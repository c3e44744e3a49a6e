"""The driver side of a search: the state the hopper server's threads act on, and checkpoints.

`SearchRun` is the :class:`~trainer.selection.engine.hopper.HopperHandler` of a run:
tasks ask it for work (``next_work``), hand results back (``result``), and it
feeds the scheduler's events, weights the per-shard metrics into epoch
metrics, reports them to the search (which may stop or promote models), calls
the :class:`~trainer.selection.report.callbacks.SelectionCallback` hooks and
checkpoints every completed epoch. `make_search_run` restores checkpoints (resume)
and builds the scheduler of the strategy (``trainer.selection.engine.strategies``). See ``docs/model-selection.md``.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from trainer.data.validation import weighted_mean
from trainer.errors import SelectionError
from trainer.selection.report.callbacks import SelectionCallback
from trainer.selection.engine.search_checkpoints import CheckpointStore
from trainer.selection.engine.hopper import HopperRejected
from trainer.selection.report.result import load_schedule, load_search_log
from trainer.selection.engine.elastic_placement import ElasticMopScheduler
from trainer.selection.engine.placement import EpochDone, ScheduledTask
from trainer.selection.engine.strategies import strategy_of
from trainer.selection.search import Config, Decision, Search

log = logging.getLogger("trainer.selection")

__all__ = ["SearchRun", "derive_seed", "make_search_run"]


def derive_seed(*parts: Any) -> int:
    """A 31-bit seed from any parts (stable across machines and Python versions)."""
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def _weighted(parts: Sequence[dict[str, Any]], key: str, weight: str) -> dict[str, float]:
    """The shards' `key` metrics weighted by their `weight` rows (the trainer's weighting)."""
    return weighted_mean([p[key] for p in parts], [p[weight] for p in parts])


@dataclass
class _Unit:
    entry: ScheduledTask
    seed: int
    delivered_to: int | None = None  # stage attempt it was handed to
    sent: float = 0.0
    keep: bool = False  # the task already held the state: it was not sent


class SearchRun:
    """Driver-side state of one search: the HopperHandler that the server calls."""

    def __init__(self, *, selector: Any, search: Search, scheduler: Any, layouts: dict[str, list],
                 states: dict[str, list[np.ndarray]], history: dict[str, list[dict]], resumed: dict[str, int],
                 callbacks: Sequence[SelectionCallback], store: CheckpointStore | None,
                 seed: int, admit: Callable[[Config], tuple] | None = None,
                 payloads: dict[str, dict[str, Any]] | None = None) -> None:  # fmt: skip
        self.selector = selector
        self.search = search
        self.metric = search.metric
        self.sched = scheduler
        self.layouts = layouts
        self.states = states
        self.epoch_states = dict(states)
        self.history = history
        self.resumed = resumed
        self.callbacks = list(callbacks)
        self.store = store
        self.seed = seed
        self.admit = admit
        self.payloads = payloads if payloads is not None else {}  # configurations a search added after the start
        self.cond = threading.Condition()
        self.ckpt_lock = threading.Lock()
        self.attempt = 0
        self.t0 = time.time()
        self.outstanding: dict[int, _Unit] = {}
        self.holder: dict[str, tuple[int, int]] = {}
        self.parts: dict[str, list[dict]] = {}
        self.units: list[dict] = []
        self.task_hello: dict[int, dict] = {}
        #: What happened to the workers' shards (an elastic search's chunk events; a fixed search has none).
        self.events: list[dict[str, Any]] = []
        self.error: BaseException | None = None
        self.pending_ckpt: list[tuple[str, list[np.ndarray], list[dict]]] = []
        self.ckpt_errors: list[str] = []
        self._flush_wanted = threading.Event()
        self._flush_closed = False
        self._flusher: threading.Thread | None = None
        self.sched.on_epoch_done = self._on_epoch_done

    # -- lifecycle (driver thread) -------------------------------------------------
    def start(self) -> None:
        with self.cond:
            self.t0 = time.time()
            n = len(self.sched.schedule)
            self.sched.start()
            self._dispatch(self.sched.schedule[n:])

    def begin_attempt(self, attempt: int) -> None:
        with self.cond:
            self.attempt = attempt
            self.holder.clear()  # a new attempt has fresh tasks with empty model caches
            for unit in self.outstanding.values():
                unit.delivered_to = None
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            if self.error is None and not self.finished:
                self.selector.stop_search = True
            self.cond.notify_all()

    @property
    def finished(self) -> bool:
        return self.sched.done

    @property
    def stopping(self) -> bool:
        return bool(self.selector.stop_search)

    # -- HopperHandler (server threads) --------------------------------------------
    def hello(self, worker: int, attempt: int, meta: dict[str, Any]) -> dict[str, Any]:
        with self.cond:
            self._check_attempt(attempt, "HELLO")
            rows = meta.get("rows")
            if not isinstance(rows, int) or rows < 1:
                raise HopperRejected(
                    f"worker {worker} received no training rows (rows={rows!r}); Spark's round-robin shards "
                    "are too small. Fix: use fewer workers or more rows."
                )
            self.task_hello[worker] = dict(meta)
        return {}

    def next_work(self, worker: int, attempt: int, wait_s: float) -> tuple[dict[str, Any], Sequence[np.ndarray]]:
        deadline = time.monotonic() + wait_s
        with self.cond:
            while True:
                self._check_attempt(attempt, "PULL")
                reply = self._reply_to_pull(worker, attempt)
                if reply is not None:
                    return reply
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return {"op": "wait"}, ()
                self.cond.wait(remaining)

    def _reply_to_pull(self, worker: int, attempt: int) -> tuple[dict[str, Any], Sequence[np.ndarray]] | None:
        """What a PULL gets now (lock held): stop, a unit, or None to wait."""
        if self.stopping or self.finished:
            return {"op": "stop"}, ()
        unit = self.outstanding.get(worker)
        return self._deliver(worker, attempt, unit) if unit is not None else None

    def _deliver(self, worker: int, attempt: int, unit: _Unit) -> tuple[dict[str, Any], Sequence[np.ndarray]]:
        """Hand `unit` to the task (lock held): its meta and the model's state, unless the task's process holds
        it (``keep``)."""
        if unit.delivered_to == attempt:
            raise HopperRejected(f"worker {worker} asked for work while unit {unit.entry.seq} is still in flight on it")
        unit.delivered_to = attempt
        unit.sent = time.time()
        cid = unit.entry.model
        unit.keep = self.holder.get(cid) == self._holder_key(worker, attempt)
        meta = {"op": "train", "model": cid, "epoch": unit.entry.epoch, "seq": unit.entry.seq,
                "keep": unit.keep, "seed": unit.seed}
        if cid in self.payloads:  # a configuration the task spec does not carry: how to build it
            meta["config"] = self.payloads[cid]
        return meta, () if unit.keep else self.states[cid]

    def _holder_key(self, worker: int, attempt: int) -> Any:
        """Who holds a model's newest state once this task trained it: the task (its model cache is its own)."""
        return worker, attempt

    def result(self, worker: int, attempt: int, meta: dict[str, Any], arrays: list[np.ndarray]) -> dict[str, Any]:
        now = time.time()
        with self.cond:
            self._check_attempt(attempt, "COMMIT")
            unit = self.outstanding.get(worker)
            if unit is None or unit.delivered_to != attempt or meta.get("seq") != unit.entry.seq:
                raise HopperRejected(
                    f"worker {worker} sent a result for unit {meta.get('seq')!r} ({meta.get('model')!r}) but "
                    f"its unit in flight is {unit.entry if unit else None}"
                )
            cid = unit.entry.model
            problem = self._check_state(cid, arrays)
            if problem:
                raise HopperRejected(problem)
            record = {
                "seq": unit.entry.seq, "model": cid, "worker": worker, "epoch": unit.entry.epoch,
                "attempt": attempt, "start": unit.sent - self.t0, "end": now - self.t0,
                "train": dict(meta.get("train") or {}), "val": dict(meta.get("val") or {}),
                "rows": int(meta.get("rows", 0)), "val_rows": int(meta.get("val_rows", 0)),
                "train_s": float(meta.get("train_s", 0.0)), "val_s": float(meta.get("val_s", 0.0)),
                "sent_state": not unit.keep,
            }
            record.update(self._unit_extra(worker, attempt))
            self.states[cid] = arrays
            self.holder[cid] = self._holder_key(worker, attempt)
            self.units.append(record)
            self.parts.setdefault(cid, []).append(record)
            del self.outstanding[worker]
            try:
                n = len(self.sched.schedule)
                self.sched.complete(worker, cid)
                self._dispatch(self.sched.schedule[n:])
                for cb in self.callbacks:
                    cb.on_unit_end(dict(record))
            except BaseException as exc:
                self._fail(exc)
                raise HopperRejected(f"the search failed in the driver: {type(exc).__name__}: {exc}") from exc
            self.cond.notify_all()
        self._request_flush()
        return {}

    def lost(self, worker: int, attempt: int) -> None:
        log.warning("model selection: worker %d (attempt %d) disconnected without saying BYE", worker, attempt)

    # -- internals (lock held) ------------------------------------------------------
    def _unit_extra(self, worker: int, attempt: int) -> dict[str, Any]:
        """What a unit's record says of the task that trained it besides its worker and attempt."""
        return {}

    def _check_attempt(self, attempt: int, what: str) -> None:
        if self.error is not None:
            raise HopperRejected(f"search aborted in the driver: {type(self.error).__name__}: {self.error}")
        if attempt != self.attempt:
            raise HopperRejected(f"{what} from stage attempt {attempt}, but attempt {self.attempt} is running")

    def _check_state(self, cid: str, arrays: list[np.ndarray]) -> str | None:
        layout = self.layouts[cid]
        if len(arrays) != len(layout):
            return (f"the state of {cid} has {len(arrays)} arrays, expected {len(layout)} (weights, then optimizer "
                    "variables): model_fn built a different model on the executor")
        for i, (a, (dtype, shape)) in enumerate(zip(arrays, layout)):
            if tuple(a.shape) != tuple(shape):
                return (f"array #{i} of the state of {cid} has shape {tuple(a.shape)}, expected {tuple(shape)}: "
                        "model_fn built a different model on the executor")
        return None

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        self.cond.notify_all()

    def _dispatch(self, entries: Iterable[ScheduledTask]) -> None:
        queue = deque(entries)
        while queue:
            e = queue.popleft()
            if e.epoch < self.resumed.get(e.model, 0):
                # Resumed run: this epoch is already in the checkpoint, complete it without training.
                n = len(self.sched.schedule)
                self.sched.complete(e.worker, e.model)
                queue.extend(self.sched.schedule[n:])
                continue
            seed = derive_seed(self.seed, "unit", e.model, e.epoch, e.worker)
            self.outstanding[e.worker] = _Unit(e, seed)

    def _on_epoch_done(self, event: EpochDone) -> None:
        cid, epoch = event.model, event.epoch
        if epoch < self.resumed.get(cid, 0):
            return  # fast-forwarded from a checkpoint: reported before this run started
        parts = self.parts.pop(cid, [])
        train = _weighted(parts, "train", "rows")
        val = _weighted(parts, "val", "val_rows")
        logs = {**train, **val}
        if self.metric.name not in logs:
            raise SelectionError(
                f"The selection metric {self.metric.name!r} is not among the metrics logged after an epoch: "
                f"{sorted(logs)}. Fix: pick one of those (validation metrics need validation data), or add the "
                "metric to model.compile(metrics=[...])."
            )
        value = float(logs[self.metric.name])
        record = {"epoch": epoch, "train": train, "val": val, "value": value,
                  "start": min(p["start"] for p in parts), "end": max(p["end"] for p in parts),
                  "units": len(parts), "train_s": sum(p["train_s"] + p["val_s"] for p in parts)}
        self.history.setdefault(cid, []).append(record)
        self.epoch_states[cid] = self.states[cid]
        if len(self.search.history(cid)) > epoch:
            # A resumed search's log is ahead of this model's checkpoint (its newest file was damaged): the epoch
            # was retrained, and the search keeps the decision it took the first time.
            decision = Decision()
        else:
            decision = self.search.report(cid, epoch, value)
        for stopped in decision.stopped:
            self.sched.drop(stopped)
        for model, budget in decision.budgets.items():
            self.sched.extend(model, budget)
        for config in decision.added:  # a model-based search asked for a new configuration: a freed slot takes it
            _admit(self.admit, config, self.layouts, self.states, self.payloads)
            self.history.setdefault(config.id, [])
            self.sched.add(config.id, max(1, self.search.budget(config.id)))
        if self.store is not None:
            self.pending_ckpt.append((cid, self.states[cid], [dict(r) for r in self.history[cid]]))
        log.log(logging.INFO if self.selector.verbose else logging.DEBUG,
                "model selection: %s epoch %d: %s %.4f%s", cid, epoch + 1, self.metric.name, value,
                "".join(f" ({what}: {', '.join(ids)})" for what, ids in
                        (("stopped", decision.stopped), ("waits at its rung", decision.paused)) if ids))
        for cb in self.callbacks:
            cb.on_epoch_end(cid, epoch, dict(logs))

    # -- checkpoints ----------------------------------------------------------------
    def progress(self) -> dict[str, Any]:
        progress = {"schedule": [list(s) for s in self.sched.schedule], "units": list(self.units),
                    "epochs": {cid: len(h) for cid, h in self.history.items()}}
        search_log = self.search.state()
        if search_log is not None:  # a model-based search: its trials and decisions (resume re-tells them)
            progress["search"] = search_log
        return progress

    def flush_checkpoints(self, force: bool = False) -> None:
        """Write pending model checkpoints, then the progress file (serialized, in order); what could not be
        written stays pending."""
        if self.store is None:
            return
        with self.ckpt_lock:
            with self.cond:
                pending, self.pending_ckpt = self.pending_ckpt, []
                progress = self.progress() if (pending or force) else None
            for i, (cid, state, hist) in enumerate(pending):
                try:
                    self.store.save_model(cid, state, hist)
                except BaseException:
                    with self.cond:
                        self.pending_ckpt[:0] = pending[i:]
                    raise
            if progress is not None:
                self.store.save_progress(progress)

    def _request_flush(self) -> None:
        """Write the pending checkpoints in a background thread, so that the task gets its reply at once."""
        if self.store is None:
            return
        with self.cond:
            if self._flusher is None and not self._flush_closed:
                self._flusher = threading.Thread(target=self._flush_loop, name="selection-checkpoint", daemon=True)
                self._flusher.start()
        self._flush_wanted.set()

    def _flush_loop(self) -> None:
        while True:
            self._flush_wanted.wait()
            self._flush_wanted.clear()
            if self._flush_closed:
                return
            self._flush_reporting()

    def _flush_reporting(self, force: bool = False) -> str | None:
        try:
            self.flush_checkpoints(force)
        except Exception as exc:  # reported: the search goes on, and the next flush tries again
            problem = f"Could not write model-selection checkpoints to {self.store.root}: {type(exc).__name__}: {exc}"
            self.ckpt_errors.append(problem)
            log.warning("%s", problem)
            return problem
        return None

    def finish_checkpoints(self) -> str | None:
        """Stop the background writer and write what is pending; returns what failed (never raises)."""
        with self.cond:
            self._flush_closed = True
            flusher = self._flusher
        self._flush_wanted.set()
        if flusher is not None:
            flusher.join()
        return self._flush_reporting(force=True) if self.store is not None else None


def _admit(admit: Callable[[Config], tuple] | None, config: Config, layouts: dict, states: dict,
           payloads: dict) -> None:
    """Build what the run needs of a configuration a model-based search added: its state layout, initial state
    and the payload that tells the tasks how to build it."""
    if admit is None:
        raise SelectionError(
            f"The search added configuration {config.id!r} during the run, but this driver cannot build new "
            "configurations (no `admit`). Fix: run model-based searches through ModelSelector."
        )
    layouts[config.id], states[config.id], payloads[config.id] = admit(config)


def make_search_run(selector: Any, search: Search, layouts: dict[str, list], states: dict[str, list[np.ndarray]],
                    *, store: CheckpointStore | None, resume: bool, replay: Any,
                    callbacks: Sequence[SelectionCallback], description: dict[str, Any],
                    admit: Callable[[Config], tuple] | None = None, elastic: bool = False) -> SearchRun:
    """The driver-side run: checkpoints restored (resume), the search's state rebuilt, the scheduler made.

    ``selector`` needs ``strategy``, ``num_workers``, ``seed``, ``verbose`` and
    ``stop_search``; ``states`` holds the initial state of every configuration.
    ``admit(config) -> (layout, initial state, payload)`` builds a configuration
    that a model-based search adds later (the payload travels to the tasks).
    """
    payloads: dict[str, dict[str, Any]] = {}
    previous_schedule: list | None = None
    opened = store is not None and store.open(description, resume)
    if opened and search.adds_configs:
        log_ = store.load_progress().get("search")
        if log_:
            search.restore(log_)  # the study's trials and decisions, in their order
    elif replay is not None and search.adds_configs:
        log_ = load_search_log(replay)
        if log_:
            search.follow(log_)
    history: dict[str, list[dict]] = {}

    def admit_new() -> list[str]:
        for config in search.configs():
            if config.id not in layouts:  # added by the search before this run (resume) or by a re-told report
                _admit(admit, config, layouts, states, payloads)
            history.setdefault(config.id, [])
        return [c.id for c in search.configs()]

    ids = admit_new()
    resumed: dict[str, int] = {}
    if opened:
        for cid, (state, hist) in store.load_models(ids).items():
            if [tuple(a.shape) for a in state] != [tuple(s) for _, s in layouts[cid]]:
                raise SelectionError(
                    f"The checkpoint of {cid} in {store.root} does not fit the model model_fn builds now. "
                    "Fix: resume with the same model_fn, or use a new checkpoint_dir."
                )
            states[cid], history[cid], resumed[cid] = state, list(hist), len(hist)
        for epoch in range(max(resumed.values(), default=0)):  # rebuild the search's state in epoch order
            for cid in ids:
                # (a restored model-based search already has the epochs of its log)
                if resumed.get(cid, 0) > epoch and len(search.history(cid)) <= epoch:
                    search.report(cid, epoch, float(history[cid][epoch]["value"]))
        previous_schedule = store.load_progress().get("schedule")
        log.info("model selection: resuming from %s with %d completed epochs", store.root, sum(resumed.values()))
    ids = admit_new()
    budgets = {cid: max(1, search.budget(cid)) for cid in ids}
    parts = dict(selector=selector, search=search, layouts=layouts, states=states, history=history, resumed=resumed,
                 callbacks=callbacks, store=store, seed=selector.seed, admit=admit, payloads=payloads)
    if elastic:  # which chunk is served when is Spark's: no schedule to replay
        from trainer.selection.engine.elastic_search import ElasticSearchRun  # it builds on this module

        scheduler = ElasticMopScheduler(ids, selector.num_workers, budgets, seed=selector.seed)
        return ElasticSearchRun(chunks=selector.num_workers, scheduler=scheduler, **parts)
    strategy = strategy_of(selector.strategy)
    recording = (load_schedule(replay) if replay is not None else previous_schedule) if strategy.replays else None
    scheduler = strategy.scheduler(ids, selector.num_workers, budgets, selector.seed, recording=recording,
                                   late_models=search.adds_configs)
    return SearchRun(scheduler=scheduler, **parts)

