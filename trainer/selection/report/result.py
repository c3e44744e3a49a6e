"""What a model-selection run produces: `SelectionResult` (leaderboard, history, schedule, models) and its files.

`build_result` turns the driver's records of a finished (or stopped) search
into a `SelectionResult`; `load_schedule` reads a recorded schedule back for
``ModelSelector.fit(replay=...)``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from trainer.data.checks import DataSpec
from trainer.errors import SelectionError
from trainer.files import atomic_write_json
from trainer.fit.fitted import FittedModel, TrainingHistory
from trainer.runtime.state import load_state
from trainer.selection.report.plots import plot_config_curve, plot_gantt, plot_learning_curves
from trainer.selection.engine.placement import ScheduledTask
from trainer.selection.search import Config, Metric

__all__ = ["SelectionResult", "build_result", "epoch_logs", "load_schedule", "load_search_log"]


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
        search_log: a model-based search's trials and decisions (``TPESearch``,
            ``ASHA``: their ``state()``), which ``fit(replay=...)`` follows; else None.
        membership: an elastic search's chunk events (``time``, ``event``: served,
            took over, ended, retired or lost, ``chunk``, ``task``, ``round``, ``process``; a lost task's
            ``returned``: the model whose unit it had in flight, trained again elsewhere); else empty.
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
    search_log: dict[str, Any] | None = None
    membership: list[dict[str, Any]] = field(default_factory=list)
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
            out[cid] = [float(epoch_logs(r).get(name, math.nan)) for r in records]
        return out

    def ranked(self, metric: str | Metric | None = None):
        """The leaderboard re-ranked by the final value of another logged metric (its direction inferred)."""
        import pandas as pd  # deferred: only this function needs it

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
        ``selection.json`` (history, units, schedule, timings; an elastic search's
        membership), ``gantt.png``,
        ``learning_curves.png`` and ``curves/<config_id>.png``.
        """
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = {"leaderboard": out / f"{prefix}leaderboard.csv", "json": out / f"{prefix}selection.json",
                 "gantt": out / f"{prefix}gantt.png", "curves": out / f"{prefix}learning_curves.png"}
        self.leaderboard.to_csv(paths["leaderboard"], index=False)
        atomic_write_json(paths["json"], {
            "summary": self.summary(), "metric": {"name": self.metric.name, "mode": self.metric.mode},
            "configs": [dataclasses.asdict(c) for c in self.configs], "history": self.history,
            "units": self.units, "schedule": [list(s) for s in self.schedule], "tasks": self.tasks,
            "timings": self.timings, "resumed_epochs": self.resumed_epochs, "search_log": self.search_log,
            **({"membership": self.membership} if self.membership else {}),
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


def epoch_logs(record: Mapping[str, Any]) -> dict[str, float]:
    """The training and validation metrics of one epoch record, in one dict."""
    return {**record.get("train", {}), **record.get("val", {})}


def load_schedule(source: Any) -> list[ScheduledTask]:
    """A recorded schedule from a result, a list of entries, or a ``selection.json``/``progress.json`` path."""
    if isinstance(source, SelectionResult):
        return list(source.schedule)
    if isinstance(source, (str, os.PathLike)):
        source = _recorded(source).get("schedule", [])
    entries = []
    for item in source:
        seq, model, worker, epoch = item
        entries.append(ScheduledTask(int(seq), model, int(worker), int(epoch)))
    return entries


def load_search_log(source: Any) -> dict[str, Any] | None:
    """A model-based search's log from a result or a ``selection.json``/``progress.json`` (None when it has none)."""
    if isinstance(source, SelectionResult):
        return source.search_log
    if isinstance(source, (str, os.PathLike)):
        data = _recorded(source)
        return data.get("search_log") or data.get("search")
    return None


def _recorded(source: str | os.PathLike) -> dict[str, Any]:
    """What a ``selection.json`` or ``progress.json`` holds (a directory: the first of the two found in it)."""
    path = Path(source)
    if path.is_dir():
        path = next((p for p in (path / "selection.json", path / "progress.json") if p.is_file()), path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SelectionError(
            f"replay: cannot read {source}: {exc}. Fix: pass a SelectionResult, its selection.json, or a "
            "checkpoint directory's progress.json."
        ) from exc


def build_result(selector, run, configs: list[Config], spec: DataSpec, input_shapes, task_records, bytes_moved: int,
                 fit_start: float, job_start: float, job_end: float) -> SelectionResult:  # fmt: skip
    """The `SelectionResult` of `selector`'s search from the driver's `run` (a ``SearchRun``)."""
    import pandas as pd  # deferred: only a finished search needs it

    metric = run.metric
    history = {c.id: run.history.get(c.id, []) for c in configs}
    ranked = [cid for cid, _, _ in selector.search.leaderboard()]
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
            "max_epochs": cfg.epochs, "stopped": bool(selector.search.stopped(cid)),
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
    factory = functools.partial(_fitted_model, selector, by_id, epoch_states, history, spec, input_shapes, tasks,
                                timings)
    return SelectionResult(
        strategy=selector.strategy, num_workers=selector.num_workers, metric=metric, configs=list(configs),
        leaderboard=board, best_config=best_config, best_value=best_value, history=history,
        units=list(run.units), schedule=list(run.sched.schedule), tasks=tasks, timings=timings,
        data_bytes=_data_bytes(tasks),
        bytes_moved=bytes_moved,
        interrupted=not run.finished, resumed_epochs=dict(run.resumed),
        search_log=selector.search.state(), membership=list(run.events), _factory=factory,
    )




def _data_bytes(tasks: list[dict[str, Any]]) -> int:
    """Bytes of data the tasks held: an elastic search's chunks counted once, however many tasks served each."""
    by_chunk = {r["chunk"]: r.get("data_bytes", 0) for r in tasks if "chunk" in r}
    return int(sum(by_chunk.values()) + sum(r.get("data_bytes", 0) for r in tasks if "chunk" not in r))


def _fitted_model(selector, by_id: dict[str, Config], epoch_states: dict[str, list],
                  history: dict[str, list[dict]], spec, input_shapes, tasks, timings, config_id: str):
    """A FittedModel of ``config_id`` with its state after its last completed epoch."""
    if config_id not in by_id:
        raise SelectionError(f"Unknown config id {config_id!r}. Expected one of: {list(by_id)[:8]}.")
    if not history.get(config_id):
        raise SelectionError(
            f"Config {config_id!r} completed no epoch, so it has no trained model. "
            "Fix: pick a configuration with epochs_done > 0 in the leaderboard."
        )
    model = selector._build(by_id[config_id])
    load_state(model, [np.array(a) for a in epoch_states[config_id]], what=f"config {config_id}")
    epochs = [{"epoch": r["epoch"], "time_s": r["end"] - r["start"], **epoch_logs(r)} for r in history[config_id]]
    hist = TrainingHistory(
        algorithm=f"model selection ({selector.strategy}), config {config_id}", num_workers=selector.num_workers,
        workers=list(tasks), epochs=epochs, timings=dict(timings),
    )
    data_spec = DataSpec(spec.num_rows, spec.feature_size, tuple(input_shapes[config_id]), spec.label_size)
    return FittedModel(model, hist, selector.features_col, selector.label_col, data_spec, selector.custom_objects)
