"""Model selection on Spark with model hopper parallelism (MOP), and its two baselines.

Example::

    from trainer.selection import GridSearch, ModelSelector, choice

    def model_fn(params):                       # -> a compiled keras.Model
        ...

    search = GridSearch({"units": choice([32, 64]), "lr": choice([1e-3, 1e-2]),
                         "batch_size": choice([32, 64])}, epochs=4, metric="val_accuracy")
    result = ModelSelector(model_fn, search, num_workers=2, checkpoint_dir="ckpt").fit(train, validation=val)
    result.leaderboard                           # pandas DataFrame, best first
    result.best_model.evaluate(test)             # a trainer.FittedModel
    result.save("results/selection")             # leaderboard.csv, schedule.json, gantt.png, curves

How a search runs (``strategy="mop"``, the default)
    The training rows and the validation rows are tagged with a flag column,
    unioned and dealt into ``num_workers`` shards; ONE Spark barrier stage of
    ``num_workers`` long-lived tasks starts (``trainer.launch.run_barrier_job``),
    and task ``i`` loads shard ``i`` once and keeps it for the whole search.
    The driver runs a :class:`~trainer.selection.hopper.HopperServer` and a
    :class:`~trainer.selection.scheduler.MopScheduler`. A task asks for work;
    the scheduler assigns (model, epoch) to it; the task receives the model's
    state, trains ONE sub-epoch (one pass over its own training rows), evaluates
    on its own validation rows, and sends the new state and the metrics back.
    On receipt the driver calls ``scheduler.complete``, which frees the worker
    and the model and may assign new work at once: waiting tasks are woken
    through a ``threading.Condition``, never by polling. Every model visits
    every shard exactly once per epoch, one model per worker at a time, a
    model on one worker at a time. Only models move; data never does.

Where the model state travels: through the driver
    After each sub-epoch the state -- ``model.get_weights()`` followed by the
    optimizer's variables (iteration count, learning rate, moments), as raw
    arrays in the authenticated binary frames of :mod:`trainer.ps.wire` --
    goes from the task to the driver, and from the driver to the task that
    trains the model next. Cerebro hops models through a shared file system
    (HDFS/NFS) instead. Going through the driver works on any cluster without
    shared storage (the lab on Kubernetes has none that executors share),
    needs no credentials on executors, and lets the driver keep the newest
    state of every model in memory, so a lost executor costs only the
    sub-epochs that were in flight: a retried stage continues from there. The
    price is two copies of the state per sub-epoch over the driver's network
    link, i.e. ``2 x (weights + optimizer state)`` bytes per visit: about
    25 MB for a 1M-parameter model with Adam. That is small next to a
    sub-epoch of training for the models this is meant for; for very large
    models a shared checkpoint store would take that load off the driver.
    When a model's next visit is on the task that already holds its newest
    state (always so with one worker), the state is not sent again.

Validation and the metric
    Each sub-epoch is followed by an evaluation on the task's validation
    shard. The epoch's validation metrics are the means over shards weighted
    by each shard's validation rows (exact for per-sample means such as loss,
    accuracy, MAE, MSE; Cerebro weights by steps, the same thing when batches
    are full). Training metrics are weighted by training rows. The selection
    metric's direction comes from :class:`~trainer.selection.search.Metric`
    (accuracy is maximised, loss and MAPE minimised), so the best model is
    never the worst one. Adaptive searches (SuccessiveHalving, Hyperband) get
    every epoch's value through ``search.report`` and their decisions become
    ``scheduler.drop`` / ``scheduler.extend``.

Checkpoints, resume and replay
    With ``checkpoint_dir`` every model's state is written after each epoch
    (temporary file, then ``os.replace``) together with the schedule so far
    (:mod:`trainer.selection.checkpoint`). ``fit(..., resume=True)`` continues
    an interrupted search: completed epochs are taken from the checkpoints and
    not trained again, their metrics are reported to a fresh search in epoch
    order (which rebuilds successive-halving decisions), and the recorded
    schedule is replayed so the resumed run continues the same schedule.
    ``fit(..., replay=previous_result)`` issues a recorded schedule exactly
    (``MopScheduler.replay``); with the same seed a run is reproduced even
    though sub-epochs take different times.

Baselines (same result type, same metrics, for benchmarks)
    ``strategy="task_parallel"``: every task holds a FULL copy of the data (a
    Spark broadcast: ``num_workers`` copies) and trains whole configurations,
    one epoch per unit, a configuration pinned to the task that took it
    (:class:`~trainer.selection.baseline.TaskParallelScheduler`).
    ``strategy="sequential"``: the same with one task, configurations one
    after the other.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from trainer.selection.checkpoint import CheckpointStore, atomic_write_json
from trainer.selection.hopper import HopperRejected, HopperServer
from trainer.selection.scheduler import EpochDone, MopScheduler, ScheduledTask
from trainer.selection.search import Config, Metric, Search

log = logging.getLogger("trainer.selection")

__all__ = ["STRATEGIES", "SelectionError", "SelectionCallback", "SelectionResult", "ModelSelector", "load_schedule"]

STRATEGIES = ("mop", "task_parallel", "sequential")


class SelectionError(ValueError):
    """A model-selection run was configured in a way it cannot work with."""


class SelectionCallback:
    """Hooks called by the driver during a search (Keras-callback style, all no-ops here).

    They run on the driver's server threads while the run's lock is held: keep
    them fast. ``self.selector`` is the running :class:`ModelSelector`; set
    ``self.selector.stop_search = True`` to end the search gracefully: units
    in flight finish, nothing new starts, completed epochs stay checkpointed
    and ``fit`` returns a result with ``interrupted=True``.
    """

    selector: "ModelSelector | None" = None

    def on_unit_end(self, unit: dict[str, Any]) -> None:
        """A sub-epoch (MOP) or epoch (baselines) finished; ``unit`` is its record."""

    def on_epoch_end(self, config_id: str, epoch: int, logs: dict[str, float]) -> None:
        """``config_id`` completed ``epoch`` (0-based); ``logs`` holds its train and ``val_`` metrics."""

    def on_search_end(self, result: "SelectionResult") -> None:
        """The search is over (finished or stopped)."""


# =============================================================================== result
@dataclass
class SelectionResult:
    """What a search produced.

    Attributes:
        strategy: ``"mop"``, ``"task_parallel"`` or ``"sequential"``.
        num_workers: tasks that trained.
        metric: the selection :class:`Metric` (name and direction).
        configs: every configuration, in search order.
        leaderboard: pandas DataFrame, best first: ``rank, config_id,
            final_metric, best_metric, best_epoch, epochs_done, max_epochs,
            stopped, time_s, train_s, batch_size, params`` and one ``param_*``
            column per parameter. ``time_s`` is the wall time of the
            configuration's units as the driver saw them.
        best_config, best_value: the winner by its final metric (None if no
            epoch completed).
        history: ``{config_id: [per-epoch record]}`` with ``train`` and ``val``
            metric dicts, ``value`` (the selection metric), ``start``/``end``.
        units: every unit of work of this run (sub-epochs for MOP, epochs for
            the baselines): ``seq, model, worker, epoch, start, end`` (seconds
            since training started, driver clock), metrics and row counts.
        schedule: the schedule as issued, replayable with ``fit(replay=...)``.
        tasks: one record per task: rows, data bytes, model build times.
        timings: ``wall_s`` (whole fit), ``setup_s`` (checks, model builds,
            data), ``train_wall_s`` (the barrier stage), ``data_delivery_s``.
        data_bytes: bytes of training and validation data held by the tasks
            (MOP: the data once; task-parallel: ``num_workers`` copies).
        bytes_moved: bytes through the driver's hopper server, both ways.
        interrupted: True when the search was stopped before its end.
        resumed_epochs: epochs per configuration taken from checkpoints.
    """

    strategy: str
    num_workers: int
    metric: Metric
    configs: list[Config]
    leaderboard: Any
    best_config: Config | None
    best_value: float | None
    history: dict[str, list[dict[str, Any]]]
    units: list[dict[str, Any]]
    schedule: list[ScheduledTask]
    tasks: list[dict[str, Any]]
    timings: dict[str, float]
    data_bytes: int
    bytes_moved: int
    interrupted: bool
    resumed_epochs: dict[str, int] = field(default_factory=dict)
    _factory: Callable[[str], Any] | None = field(default=None, repr=False)
    _best_model: Any = field(default=None, repr=False)

    @property
    def best_model(self):
        """The best configuration's model after its last completed epoch, as a ``trainer.FittedModel``."""
        if self.best_config is None:
            return None
        if self._best_model is None:
            self._best_model = self.model(self.best_config.id)
        return self._best_model

    def model(self, config_id: str):
        """Any configuration's model after its last completed epoch, as a ``trainer.FittedModel``."""
        if self._factory is None:
            raise SelectionError("This result has no model states (it was loaded from files).")
        return self._factory(config_id)

    def curves(self, metric: str | None = None) -> dict[str, list[float]]:
        """``{config_id: [metric after epoch 1, 2, ...]}`` (default: the selection metric)."""
        name = metric or self.metric.name
        out = {}
        for cid, records in self.history.items():
            out[cid] = [float(_logs_of(r).get(name, math.nan)) for r in records]
        return out

    def ranked(self, metric: str | Metric | None = None):
        """The leaderboard re-ranked by the final value of another logged metric (its direction inferred)."""
        import pandas as pd

        m = Metric.of(metric) if metric is not None else self.metric
        finals = {cid: vals[-1] for cid, vals in self.curves(m.name).items() if vals}
        order = m.ranked(finals)
        board = self.leaderboard.set_index("config_id")
        rows = []
        for rank, cid in enumerate(order, start=1):
            row = board.loc[cid].to_dict()
            row.update(config_id=cid, rank=rank, metric=m.name, final_metric=finals[cid],
                       best_metric=m.best(self.curves(m.name)[cid]))
            rows.append(row)
        cols = ["rank", "config_id", "metric"] + [c for c in self.leaderboard.columns if c not in ("rank", "config_id")]
        return pd.DataFrame(rows, columns=cols)

    def summary(self) -> dict[str, Any]:
        """Key numbers of the run as one flat dict (for result tables)."""
        return {
            "strategy": self.strategy, "workers": self.num_workers, "configs": len(self.configs),
            "units": len(self.units), "time_s": self.timings.get("wall_s"),
            "train_wall_s": self.timings.get("train_wall_s"), "metric_name": self.metric.name,
            "metric_value": self.best_value, "best_config": self.best_config.id if self.best_config else None,
            "data_bytes": self.data_bytes, "bytes_moved": self.bytes_moved, "interrupted": self.interrupted,
        }

    def save(self, out_dir: str | os.PathLike, prefix: str = "") -> dict[str, Path]:
        """Write the leaderboard CSV, history/schedule JSON, the Gantt chart and learning curves.

        Files (``prefix`` is prepended to each name): ``leaderboard.csv``,
        ``selection.json`` (history, units, schedule, timings), ``gantt.png``,
        ``learning_curves.png`` and ``curves/<config_id>.png``.
        """
        from trainer.selection.plots import plot_config_curve, plot_gantt, plot_learning_curves

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = {"leaderboard": out / f"{prefix}leaderboard.csv", "json": out / f"{prefix}selection.json",
                 "gantt": out / f"{prefix}gantt.png", "curves": out / f"{prefix}learning_curves.png"}
        self.leaderboard.to_csv(paths["leaderboard"], index=False)
        atomic_write_json(paths["json"], {
            "summary": self.summary(), "metric": {"name": self.metric.name, "mode": self.metric.mode},
            "configs": [dataclasses.asdict(c) for c in self.configs], "history": self.history,
            "units": self.units, "schedule": [list(s) for s in self.schedule], "tasks": self.tasks,
            "timings": self.timings, "resumed_epochs": self.resumed_epochs,
        })
        title = (f"{self.strategy}: {len(self.configs)} configs on {self.num_workers} worker(s), "
                 f"{self.timings.get('train_wall_s', 0.0):.1f} s")
        plot_gantt(self.units, self.num_workers, paths["gantt"], title=title)
        best = self.best_config.id if self.best_config else None
        plot_learning_curves(self.curves(), self.metric.name, paths["curves"], best=best,
                             title=f"{self.metric.name} per epoch ({self.strategy})")
        curve_dir = out / f"{prefix}curves"
        for cfg in self.configs:
            if self.history.get(cfg.id):
                paths[f"curve:{cfg.id}"] = plot_config_curve(cfg.id, self.history[cfg.id],
                                                             curve_dir / f"{cfg.id}.png", cfg.params)
        return paths


def _logs_of(record: Mapping[str, Any]) -> dict[str, float]:
    return {**record.get("train", {}), **record.get("val", {})}


def load_schedule(source: Any) -> list[ScheduledTask]:
    """A recorded schedule from a result, a list of entries, or a ``selection.json``/``progress.json`` path."""
    if isinstance(source, SelectionResult):
        return list(source.schedule)
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_dir():
            path = next((p for p in (path / "selection.json", path / "progress.json") if p.is_file()), path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise SelectionError(
                f"replay: cannot read a schedule from {source}: {exc}. Fix: pass a SelectionResult, "
                "its selection.json, or a checkpoint directory's progress.json."
            ) from exc
        source = data.get("schedule", [])
    entries = []
    for item in source:
        seq, model, worker, epoch = item
        entries.append(ScheduledTask(int(seq), model, int(worker), int(epoch)))
    return entries


# ====================================================================== driver-side run
def _derive_seed(*parts: Any) -> int:
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def _weighted(parts: Sequence[dict[str, Any]], key: str, weight: str) -> dict[str, float]:
    total = sum(p[weight] for p in parts if p[key])
    if not total:
        return {}
    names: list[str] = []
    for p in parts:
        names += [k for k in p[key] if k not in names]
    out = {}
    for k in names:
        num = sum(p[weight] * p[key][k] for p in parts if k in p[key])
        den = sum(p[weight] for p in parts if k in p[key])
        out[k] = float(num / den) if den else math.nan
    return out


@dataclass
class _Unit:
    entry: ScheduledTask
    seed: int
    delivered_to: int | None = None  # stage attempt it was handed to
    sent: float = 0.0
    keep: bool = False  # the task already held the state: it was not sent


class _Run:
    """Driver-side state of one search: the HopperHandler that the server calls."""

    def __init__(self, *, selector: "ModelSelector", search: Search, scheduler: Any, layouts: dict[str, list],
                 states: dict[str, list[np.ndarray]], history: dict[str, list[dict]], resumed: dict[str, int],
                 callbacks: Sequence[SelectionCallback], store: CheckpointStore | None,
                 seed: int) -> None:  # fmt: skip
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
        self.cond = threading.Condition()
        self.ckpt_lock = threading.Lock()
        self.attempt = 0
        self.t0 = time.time()
        self.outstanding: dict[int, _Unit] = {}
        self.holder: dict[str, tuple[int, int]] = {}
        self.parts: dict[str, list[dict]] = {}
        self.units: list[dict] = []
        self.task_hello: dict[int, dict] = {}
        self.error: BaseException | None = None
        self.pending_ckpt: list[tuple[str, list[np.ndarray], list[dict]]] = []
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
                unit = self.outstanding.get(worker)
                if self.stopping or self.finished:
                    return {"op": "stop"}, ()
                if unit is not None:
                    if unit.delivered_to == attempt:
                        raise HopperRejected(
                            f"worker {worker} asked for work while unit {unit.entry.seq} is still in flight on it"
                        )
                    unit.delivered_to = attempt
                    unit.sent = time.time()
                    cid = unit.entry.model
                    unit.keep = self.holder.get(cid) == (worker, attempt)
                    meta = {"op": "train", "model": cid, "epoch": unit.entry.epoch, "seq": unit.entry.seq,
                            "keep": unit.keep, "seed": unit.seed}
                    return meta, () if unit.keep else self.states[cid]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return {"op": "wait"}, ()
                self.cond.wait(remaining)

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
            self.states[cid] = arrays
            self.holder[cid] = (worker, attempt)
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
        self.flush_checkpoints()
        return {}

    def lost(self, worker: int, attempt: int) -> None:
        log.warning("model selection: worker %d (attempt %d) disconnected without saying BYE", worker, attempt)

    # -- internals (lock held) ------------------------------------------------------
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
            seed = _derive_seed(self.seed, "unit", e.model, e.epoch, e.worker)
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
        decision = self.search.report(cid, epoch, value)
        for stopped in decision.stopped:
            self.sched.drop(stopped)
        for model, budget in decision.budgets.items():
            self.sched.extend(model, budget)
        if self.store is not None:
            self.pending_ckpt.append((cid, self.states[cid], [dict(r) for r in self.history[cid]]))
        log.log(logging.INFO if self.selector.verbose else logging.DEBUG,
                "model selection: %s epoch %d: %s %.4f%s", cid, epoch + 1, self.metric.name, value,
                f" (stopped: {', '.join(decision.stopped)})" if decision.stopped else "")
        for cb in self.callbacks:
            cb.on_epoch_end(cid, epoch, dict(logs))

    # -- checkpoints ----------------------------------------------------------------
    def progress(self) -> dict[str, Any]:
        return {"schedule": [list(s) for s in self.sched.schedule], "units": list(self.units),
                "epochs": {cid: len(h) for cid, h in self.history.items()}}

    def flush_checkpoints(self, force: bool = False) -> None:
        """Write pending model checkpoints, then the progress file (serialized, in order)."""
        if self.store is None:
            return
        with self.ckpt_lock:
            with self.cond:
                pending, self.pending_ckpt = self.pending_ckpt, []
                progress = self.progress() if (pending or force) else None
            for cid, state, hist in pending:
                self.store.save_model(cid, state, hist)
            if progress is not None:
                self.store.save_progress(progress)


def _make_run(selector: Any, search: Search, layouts: dict[str, list], states: dict[str, list[np.ndarray]], *,
              store: CheckpointStore | None, resume: bool, replay: Any, callbacks: Sequence[SelectionCallback],
              description: dict[str, Any]) -> _Run:  # fmt: skip
    """The driver-side run: checkpoints restored (resume), the search's state rebuilt, the scheduler made.

    ``selector`` needs ``strategy``, ``num_workers``, ``seed``, ``verbose`` and
    ``stop_search``; ``states`` holds the initial state of every configuration.
    """
    from trainer.selection.baseline import TaskParallelScheduler

    ids = [c.id for c in search.configs()]
    history: dict[str, list[dict]] = {cid: [] for cid in ids}
    resumed: dict[str, int] = {}
    previous_schedule: list | None = None
    if store is not None and store.open(description, resume):
        for cid, (state, hist) in store.load_models(ids).items():
            if [tuple(a.shape) for a in state] != [tuple(s) for _, s in layouts[cid]]:
                raise SelectionError(
                    f"The checkpoint of {cid} in {store.root} does not fit the model model_fn builds now. "
                    "Fix: resume with the same model_fn, or use a new checkpoint_dir."
                )
            states[cid], history[cid], resumed[cid] = state, list(hist), len(hist)
        for epoch in range(max(resumed.values(), default=0)):  # rebuild the search's state in epoch order
            for cid in ids:
                if resumed.get(cid, 0) > epoch:
                    search.report(cid, epoch, float(history[cid][epoch]["value"]))
        previous_schedule = store.load_progress().get("schedule")
        log.info("model selection: resuming from %s with %d completed epochs", store.root, sum(resumed.values()))
    budgets = {cid: max(1, search.budget(cid)) for cid in ids}
    if selector.strategy == "mop":
        scheduler: Any = MopScheduler(ids, selector.num_workers, budgets, seed=selector.seed)
        recording = load_schedule(replay) if replay is not None else previous_schedule
        if recording:
            scheduler.replay(recording)
    else:
        scheduler = TaskParallelScheduler(ids, selector.num_workers, budgets, seed=selector.seed)
    return _Run(selector=selector, search=search, scheduler=scheduler, layouts=layouts, states=states,
                history=history, resumed=resumed, callbacks=callbacks, store=store, seed=selector.seed)


# ============================================================================= selector
class ModelSelector:
    """Train every configuration of a search on Spark and pick the best; see the module docstring.

    Args:
        model_fn: ``model_fn(params) -> keras.Model``, compiled, with an
            ``Input`` shape. Called once per configuration on the driver (for
            the initial weights and checks) and at most once per configuration
            and task on the executors; shipped by value when it lives outside
            site-packages.
        search: a :class:`~trainer.selection.search.Search` (GridSearch,
            RandomSearch, SuccessiveHalving, Hyperband). Its metric selects.
        strategy: ``"mop"`` (default), ``"task_parallel"`` or ``"sequential"``.
        num_workers: Integer. Barrier tasks, one per data shard (``sequential``: 1).
        features_col: String or list of strings. Array/Vector column or numeric columns.
        label_col: String. The label column.
        checkpoint_dir: String or None. Where to checkpoint every model after each epoch.
        seed: Integer. Fixes the scheduler's tie-breaking, the initial weights of
            each configuration (``keras.utils.set_random_seed`` is called on the
            driver before each build) and the shuffling of every sub-epoch.
        custom_objects: Dict. Custom layers/losses for the fitted models' ``.keras`` files.
        eval_batch_size: Integer. Batch size of the validation passes (at least the config's).
        ps_host, ps_port, ps_bind_host: where executors reach the driver's server
            (defaults as for ``trainer.Trainer``: ``TRAINER_PS_HOST``/``_PORT``/``_BIND``
            or ``spark.driver.host``).
        io_timeout: Float. Longest silence tolerated from a task: must exceed one unit of work.
        slot_timeout: Float. Seconds to wait for ``num_workers`` free task slots.
        max_retries: Integer. Re-runs of the stage after lost executors; a re-run
            continues from the driver's newest states (only units in flight are redone).
        check_data: Bool. Scan the data for nulls/NaN/inf and label ranges first.
        verbose: Bool. Log every completed epoch at INFO level.
    """

    def __init__(self, model_fn: Callable[[dict[str, Any]], Any], search: Search, *, strategy: str = "mop",
                 num_workers: int = 2, features_col: str | list[str] = "features", label_col: str = "label",
                 checkpoint_dir: str | os.PathLike | None = None, seed: int = 0,
                 custom_objects: dict[str, Any] | None = None, eval_batch_size: int = 256,
                 ps_host: str | None = None, ps_port: int | None = None, ps_bind_host: str | None = None,
                 io_timeout: float = 3600.0, slot_timeout: float = 10.0, max_retries: int = 2,
                 check_data: bool = True, verbose: bool = True) -> None:  # fmt: skip
        if not callable(model_fn):
            raise SelectionError(
                f"model_fn must be a function params -> compiled keras.Model. Received {type(model_fn).__name__}. "
                "Fix: def model_fn(params): ...; return model."
            )
        if not all(hasattr(search, a) for a in ("configs", "budget", "report", "metric")):
            raise SelectionError(
                f"search must be a trainer.selection Search (GridSearch, RandomSearch, SuccessiveHalving, "
                f"Hyperband). Received {type(search).__name__}."
            )
        if strategy not in STRATEGIES:
            raise SelectionError(f"Unknown strategy {strategy!r}. Expected one of: {', '.join(STRATEGIES)}.")
        for name, value in (("num_workers", num_workers), ("eval_batch_size", eval_batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SelectionError(f"`{name}` must be a positive int. Received {name}={value!r}.")
        if strategy == "sequential" and num_workers != 1:
            raise SelectionError(
                f"strategy='sequential' trains on one worker. Received num_workers={num_workers}. "
                "Fix: pass num_workers=1, or strategy='task_parallel' for several workers."
            )
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise SelectionError(f"`max_retries` must be an int >= 0. Received max_retries={max_retries!r}.")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise SelectionError(f"`seed` must be an int. Received seed={seed!r}.")
        self.model_fn = model_fn
        self.search = search
        self.strategy = strategy
        self.num_workers = num_workers
        self.features_col = features_col
        self.label_col = label_col
        self.checkpoint_dir = checkpoint_dir
        self.seed = seed
        self.custom_objects = custom_objects
        self.eval_batch_size = eval_batch_size
        self.ps_host, self.ps_port, self.ps_bind_host = ps_host, ps_port, ps_bind_host
        self.io_timeout = float(io_timeout)
        self.slot_timeout = float(slot_timeout)
        self.max_retries = max_retries
        self.check_data = bool(check_data)
        self.verbose = bool(verbose)
        #: Set to True (e.g. from a SelectionCallback) to stop the running search gracefully.
        self.stop_search = False
        self._used = False

    # -- helpers -------------------------------------------------------------------
    def _build(self, config: Config):
        import keras

        keras.utils.set_random_seed(_derive_seed(self.seed, "build", config.id))
        model = self.model_fn(dict(config.params))
        if not isinstance(model, keras.Model):
            raise SelectionError(
                f"model_fn({config.params!r}) returned {type(model).__name__}, expected a compiled keras.Model. "
                "Fix: return the model from model_fn."
            )
        return model

    def _addresses(self, spark) -> tuple[str, str, int]:
        conf = spark.sparkContext.getConf()
        host = self.ps_host or os.environ.get("TRAINER_PS_HOST") or conf.get("spark.driver.host", "127.0.0.1")
        bind = self.ps_bind_host or os.environ.get("TRAINER_PS_BIND") or host
        port = self.ps_port if self.ps_port is not None else int(os.environ.get("TRAINER_PS_PORT", "0"))
        return host, bind, port

    def _run_description(self, configs: list[Config]) -> dict[str, Any]:
        return {"strategy": self.strategy, "num_workers": self.num_workers, "seed": self.seed,
                "search": type(self.search).__name__,
                "metric": {"name": self.search.metric.name, "mode": self.search.metric.mode},
                "configs": [dataclasses.asdict(c) for c in configs]}

    # -- fit -------------------------------------------------------------------------
    def fit(self, df, validation: Any = None, *, resume: bool = False, replay: Any = None,
            callbacks: Sequence[SelectionCallback] = ()) -> SelectionResult:  # fmt: skip
        """Run the search on ``df`` and return a :class:`SelectionResult`.

        Args:
            df: Spark DataFrame with the feature and label columns.
            validation: a DataFrame with the same columns, a fraction in (0, 1)
                of ``df`` to hold out (``randomSplit`` with the selector's seed),
                or None (then the metric must be a training metric such as ``"loss"``).
            resume: continue the search checkpointed in ``checkpoint_dir``
                (a missing or empty directory starts a new search).
            replay: a recorded schedule to issue exactly (a SelectionResult, its
                ``schedule``, or the path of a ``selection.json``); model hopper only.
            callbacks: :class:`SelectionCallback` objects.
        """
        import keras

        from trainer.data.validate import DataValidationError, model_io, prepare_frame, resolve_input_shape
        from trainer.estimator import ship_by_value
        from trainer.launch import TrainingFailedError, is_infrastructure_failure, run_barrier_job, wait_for_slots
        from trainer.ps.wire import new_secret
        from trainer.selection.task import (
            RESULT_DDL, SPLIT_COL, TaskConfig, TaskSpec, get_state, selection_task, state_layout,
        )

        if self._used:
            raise SelectionError(
                "This ModelSelector already ran: a search object records its reports and cannot run twice. "
                "Fix: create a new search and ModelSelector (pass resume=True with the same checkpoint_dir "
                "to continue a search)."
            )
        if replay is not None and self.strategy != "mop":
            raise SelectionError(f"replay= needs strategy='mop'. Received strategy={self.strategy!r}.")
        if resume and self.checkpoint_dir is None:
            raise SelectionError("resume=True needs checkpoint_dir. Fix: pass the directory of the interrupted search.")
        self.stop_search = False
        fit_start = time.time()
        search = self.search
        metric = search.metric
        configs = search.configs()
        ids = [c.id for c in configs]
        for cb in callbacks:
            cb.selector = self
        spark = df.sparkSession
        n = self.num_workers

        # -- validation data and the checks -----------------------------------------
        if isinstance(validation, (int, float)) and not isinstance(validation, bool):
            if not 0 < validation < 1:
                raise SelectionError(
                    f"validation as a fraction must be in (0, 1). Received validation={validation!r}. "
                    "Fix: e.g. validation=0.2, or pass a DataFrame."
                )
            df, validation = df.randomSplit([1.0 - validation, float(validation)], seed=self.seed)
        elif validation is not None and not hasattr(validation, "sparkSession"):
            raise SelectionError(
                f"validation must be a Spark DataFrame, a fraction in (0, 1) or None. "
                f"Received {type(validation).__name__}."
            )
        if metric.name.startswith("val_") and validation is None:
            raise SelectionError(
                f"The search's metric {metric.name!r} is a validation metric but no validation data was given. "
                "Fix: fit(df, validation=val_df or a fraction such as 0.2), or select on a training metric."
            )

        built = {c.id: self._build(c) for c in configs}
        first = built[configs[0].id]
        ship_by_value(self.model_fn, *(self.custom_objects or {}).values())
        frame, spec = prepare_frame(df, self.features_col, self.label_col, first,
                                    min_rows=n if self.strategy == "mop" else 1, check_values=self.check_data)
        input_shapes = {cid: resolve_input_shape(model_io(m)[0], spec.feature_size) for cid, m in built.items()}
        vframe = None
        vrows = 0
        if validation is not None:
            vframe, vspec = prepare_frame(validation, self.features_col, self.label_col, first,
                                          check_values=self.check_data)
            if (vspec.feature_size, vspec.label_size) != (spec.feature_size, spec.label_size):
                raise DataValidationError(
                    f"The validation rows have {vspec.feature_size} features and label size {vspec.label_size}; "
                    f"the training rows have {spec.feature_size} and {spec.label_size}. Fix: prepare both the same way."
                )
            vrows = vspec.num_rows
        self._check_metric_name(first, input_shapes[configs[0].id], spec, validation is not None)

        layouts = {cid: state_layout(m) for cid, m in built.items()}
        states = {cid: get_state(m) for cid, m in built.items()}
        del built, first
        store = CheckpointStore(self.checkpoint_dir) if self.checkpoint_dir is not None else None
        self._used = True  # from here on the search object receives reports
        run = _make_run(self, search, layouts, states, store=store, resume=resume, replay=replay,
                        callbacks=callbacks, description=self._run_description(configs))

        # -- data for the stage ----------------------------------------------------------
        broadcast = None
        if self.strategy == "mop":
            stage_frame = frame.withColumn(SPLIT_COL, _lit(False))
            if vframe is not None:
                stage_frame = stage_frame.unionByName(vframe.withColumn(SPLIT_COL, _lit(True)))
            if spec.num_rows + vrows < 1000 * n:
                # Round-robin from one partition deals rows evenly; from many tiny ones a shard may stay empty.
                stage_frame = stage_frame.coalesce(1)
        else:
            arrays = _collect_numpy(frame, spec) + (_collect_numpy(vframe, spec) if vframe is not None
                                                    else _empty_numpy(spec))
            broadcast = spark.sparkContext.broadcast(arrays)
            del arrays
            stage_frame = spark.range(n)

        task_configs = {c.id: TaskConfig(dict(c.params), c.batch_size, tuple(input_shapes[c.id]),
                                         _derive_seed(self.seed, "build", c.id)) for c in configs}
        host, bind, port = self._addresses(spark)
        secret = new_secret()
        server = HopperServer(run, n, secret, host=bind, port=port, io_timeout=self.io_timeout,
                              max_body=max(1 << 30, 4 * sum(a.nbytes for s in states.values() for a in s)))
        task_records: list[dict] = []
        job_start = job_end = time.time()
        try:
            run.start()
            if not run.finished:
                wait_for_slots(spark, n, self.slot_timeout)
                _, bound_port = server.start()
                job_start = run.t0 = time.time()
                for attempt in range(self.max_retries + 1):
                    run.begin_attempt(attempt)
                    task_spec = TaskSpec(
                        model_fn=self.model_fn, configs=task_configs, host=host, port=bound_port, secret=secret,
                        attempt=attempt, feature_size=spec.feature_size, label_size=spec.label_size,
                        full_copy=broadcast, task_seed=_derive_seed(self.seed, "task"),
                        eval_batch_size=self.eval_batch_size, io_timeout=self.io_timeout,
                        keras_backend=keras.backend.backend(),
                    )
                    try:
                        rows = run_barrier_job(
                            stage_frame, n, functools.partial(selection_task, task_spec), RESULT_DDL,
                            description=f"trainer: model selection ({self.strategy}, {len(ids)} configs) "
                                        f"attempt {attempt}",
                        )
                    except TrainingFailedError as exc:
                        if run.error is not None:
                            raise run.error from exc
                        retry = attempt < self.max_retries and is_infrastructure_failure(exc.__cause__)
                        if not retry:
                            raise
                        log.warning("model selection: attempt %d failed (%s); re-running the stage from the "
                                    "driver's newest model states", attempt, exc)
                        wait_for_slots(spark, n, max(self.slot_timeout, 60.0))
                        continue
                    task_records = [json.loads(r.record) for r in rows]
                    break
                job_end = time.time()
            if run.error is not None:
                raise run.error
        finally:
            run.close()
            server.stop()
            run.flush_checkpoints(force=True)
            if broadcast is not None:
                broadcast.destroy()

        result = self._result(run, configs, spec, input_shapes, task_records, server, fit_start, job_start, job_end)
        for cb in callbacks:
            cb.on_search_end(result)
        return result

    # -- pieces of fit -----------------------------------------------------------------
    def _check_metric_name(self, model, input_shape, spec, has_validation: bool) -> None:
        """Fail before any Spark job when the selection metric can never appear in the logs."""
        shape = (1,) if spec.label_size is None else (1, spec.label_size)
        try:
            names = list(model.evaluate(np.zeros((1, *input_shape), np.float32), np.zeros(shape, np.float32),
                                        verbose=0, return_dict=True))
        except Exception:  # an unusual model: the check after the first epoch still applies
            return
        available = names + ([f"val_{k}" for k in names] if has_validation else [])
        if self.search.metric.name not in available:
            raise SelectionError(
                f"The search's metric {self.search.metric.name!r} will not be logged; the model logs "
                f"{available}. Fix: choose one of those names for the search's metric"
                f"{'' if has_validation else ' or pass validation data for val_ metrics'}."
            )

    def _result(self, run: _Run, configs: list[Config], spec, input_shapes, task_records, server,
                fit_start: float, job_start: float, job_end: float) -> SelectionResult:  # fmt: skip
        import pandas as pd

        metric = run.metric
        history = {c.id: run.history.get(c.id, []) for c in configs}
        ranked = [cid for cid, _, _ in self.search.leaderboard()]
        order = ranked + [c.id for c in configs if c.id not in ranked]
        by_id = {c.id: c for c in configs}
        unit_time: dict[str, float] = {}
        train_time: dict[str, float] = {}
        for u in run.units:
            unit_time[u["model"]] = unit_time.get(u["model"], 0.0) + u["end"] - u["start"]
            train_time[u["model"]] = train_time.get(u["model"], 0.0) + u["train_s"] + u["val_s"]
        param_names: list[str] = []
        for c in configs:
            param_names += [k for k in c.params if k not in param_names]
        rows = []
        for rank, cid in enumerate(order, start=1):
            cfg, values = by_id[cid], [r["value"] for r in history[cid]]
            best_i = metric.ranked(values)[0] if values else None
            row = {
                "rank": rank if values else None, "config_id": cid,
                "final_metric": values[-1] if values else math.nan,
                "best_metric": values[best_i] if values else math.nan,
                "best_epoch": best_i + 1 if values else None, "epochs_done": len(values),
                "max_epochs": cfg.epochs, "stopped": bool(self.search.stopped(cid)),
                "time_s": unit_time.get(cid, 0.0), "train_s": train_time.get(cid, 0.0),
                "batch_size": cfg.batch_size, "params": json.dumps(cfg.params, default=str, sort_keys=True),
            }
            for name in param_names:
                value = cfg.params.get(name)
                plain = value is None or isinstance(value, (int, float, str, bool))
                row[f"param_{name}"] = value if plain else str(value)
            rows.append(row)
        board = pd.DataFrame(rows)
        board.attrs["metric"] = metric.name
        board.attrs["mode"] = metric.mode
        best_config, best_value = None, None
        if ranked:
            best_config, best_value = by_id[ranked[0]], history[ranked[0]][-1]["value"]
        tasks = sorted(task_records, key=lambda r: r["worker"])
        data_ready = [r["data_ready"] for r in tasks]
        timings = {
            "wall_s": time.time() - fit_start, "setup_s": job_start - fit_start, "train_wall_s": job_end - job_start,
            "data_delivery_s": (max(data_ready) - job_start) if data_ready else 0.0,
            "unit_s": float(sum(u["end"] - u["start"] for u in run.units)),
        }
        epoch_states = dict(run.epoch_states)
        factory = functools.partial(_fitted_model, self, by_id, epoch_states, history, spec, input_shapes, tasks,
                                    timings)
        return SelectionResult(
            strategy=self.strategy, num_workers=self.num_workers, metric=metric, configs=list(configs),
            leaderboard=board, best_config=best_config, best_value=best_value, history=history,
            units=list(run.units), schedule=list(run.sched.schedule), tasks=tasks, timings=timings,
            data_bytes=int(sum(r.get("data_bytes", 0) for r in tasks)),
            bytes_moved=server.bytes_sent + server.bytes_received,
            interrupted=not run.finished, resumed_epochs=dict(run.resumed), _factory=factory,
        )


def _lit(value: Any):
    from pyspark.sql import functions as F

    return F.lit(value)


def _collect_numpy(frame, spec) -> tuple[np.ndarray, np.ndarray]:
    """The whole (prepared) frame on the driver as flat numpy arrays (through Arrow), in canonical row order."""
    from trainer.selection.task import canonical_order
    from trainer.worker import arrow_to_numpy

    table = frame.toArrow()
    return canonical_order(*arrow_to_numpy(iter(table.to_batches()), (spec.feature_size,), spec.label_size))


def _empty_numpy(spec) -> tuple[np.ndarray, np.ndarray]:
    from trainer.worker import arrow_to_numpy

    return arrow_to_numpy(iter(()), (spec.feature_size,), spec.label_size)


def _fitted_model(selector: ModelSelector, by_id: dict[str, Config], epoch_states: dict[str, list],
                  history: dict[str, list[dict]], spec, input_shapes, tasks, timings, config_id: str):
    """A FittedModel of ``config_id`` with its state after its last completed epoch."""
    from trainer.data.validate import DataSpec
    from trainer.estimator import FittedModel, TrainingHistory
    from trainer.selection.task import set_state

    if config_id not in by_id:
        raise SelectionError(f"Unknown config id {config_id!r}. Expected one of: {list(by_id)[:8]}.")
    if not history.get(config_id):
        raise SelectionError(
            f"Config {config_id!r} completed no epoch, so it has no trained model. "
            "Fix: pick a configuration with epochs_done > 0 in the leaderboard."
        )
    model = selector._build(by_id[config_id])
    set_state(model, [np.array(a) for a in epoch_states[config_id]], config_id)
    epochs = [{"epoch": r["epoch"], "time_s": r["end"] - r["start"], **_logs_of(r)} for r in history[config_id]]
    hist = TrainingHistory(
        algorithm=f"model selection ({selector.strategy}), config {config_id}", num_workers=selector.num_workers,
        workers=list(tasks), epochs=epochs, timings=dict(timings),
    )
    data_spec = DataSpec(spec.num_rows, spec.feature_size, tuple(input_shapes[config_id]), spec.label_size)
    return FittedModel(model, hist, selector.features_col, selector.label_col, data_spec, selector.custom_objects)
