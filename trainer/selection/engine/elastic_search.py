"""The driver side of an elastic search: which task serves which chunk, and what a lost or late task changes.

``ModelSelector(num_workers=(min, max))`` with the model hopper cuts the rows
into `max` chunks that Spark keeps and runs ordinary jobs ("rounds") of one
task per chunk (``trainer.spark.elastic_launch``): no barrier stage, so Spark's
dynamic allocation may add and take executors, a task lost with its executor is
re-run by Spark, and a pending task starts on an executor that joins. The
models hop between chunks as in a fixed search; `ElasticSearchRun` is the
:class:`~trainer.selection.engine.search_run.SearchRun` that keeps track of
who serves a chunk (:class:`~trainer.selection.engine.elastic_placement.ElasticMopScheduler`):

* **a task says HELLO** for its chunk (its connection's attempt is Spark's task
  attempt id, unique in the application). It holds the chunk unless a task of a
  later round already does (then it is told to stop). A later attempt of the same
  round's task means the earlier one is gone (Spark re-ran it): the unit the
  earlier one had in flight is handed to the chunk's holder again. A task of a
  later round takes the chunk over from a live earlier one, which stops at its
  next request once its unit in flight is committed;
* **a task's connection drops** without a goodbye (its executor or process
  died): its unit in flight goes back to its model (which trains that chunk
  later, whoever serves it), and a chunk nobody serves takes no new units;
* **a task on an executor Spark decommissions** (a graceful leave: `retire`)
  ends once its unit in flight is committed, so nothing is lost or trained twice;
* **a task ends** when no model needs its chunk in its current epoch any more,
  so its slot goes to a chunk that is needed; the next round's job starts as
  soon as a chunk that a model needs is served by nobody though its task of the
  current round came and went (`may_start_round`);
* a model's state is not sent to a task whose process trained it last (``keep``:
  the process keeps its models between tasks).

So every model still trains every chunk once per epoch, in whatever order the
tasks come, and its epoch metrics are weighted over the chunks as in a fixed
search. See ``docs/model-selection.md``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from trainer.selection.engine.hopper import HopperRejected
from trainer.selection.engine.search_run import SearchRun

__all__ = ["ElasticSearchRun"]


@dataclass
class _Holder:
    task: int  # Spark's task attempt id: the connection's attempt
    round: int  # the job it belongs to
    process: str  # host:pid of its Python worker
    executor: str | None = None  # its Spark executor, where the task could tell


class ElasticSearchRun(SearchRun):
    """The run of an elastic search (the module docstring); `chunks` is the number of chunks."""

    def __init__(self, *, chunks: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.chunks = chunks
        self.holders: dict[int, _Holder] = {}
        self.processes: dict[int, str] = {}  # task -> its process
        self.rounds: dict[int, int] = {}  # task -> its round
        self.latest: dict[tuple[int, int], int] = {}  # (round, chunk) -> the newest task of that Spark task
        self.began: dict[int, set[int]] = {}  # round -> chunks whose task said HELLO
        self.retiring: set[str] = set()  # executors Spark is decommissioning
        # self.events: what happened to the chunks: {"time", "event" (served, took over, ended, retired, lost),
        # "chunk", "task", "round", "process"}; a lost one also names the model whose unit it had in flight
        # (``returned``).

    # -- the rounds (driver thread) ----------------------------------------------------
    def start(self) -> None:
        with self.cond:  # a resumed search's checkpointed epochs: done, whichever chunks are served
            for cid, epochs in self.resumed.items():
                self.sched.fast_forward(cid, epochs)
        super().start()

    def may_start_round(self, round_: int) -> bool:
        """True once a chunk that some model needs is served by nobody and its task of `round_` has come (and
        gone): the next round's task will serve it (a chunk whose task has not started yet waits for that one)."""
        with self.cond:
            began = self.began.get(round_, set())
            return not self.over and any(c not in self.holders and self.sched.needs(c) for c in began)

    @property
    def over(self) -> bool:
        """The search ended (done, stopped or failed): no more rounds."""
        return self.finished or self.stopping or self.error is not None

    # -- HopperHandler (server threads) --------------------------------------------------
    def hello(self, worker: int, attempt: int, meta: dict[str, Any]) -> dict[str, Any]:
        super().hello(worker, attempt, meta)  # the checks of a fixed search's task
        round_, process = int(meta.get("round", 0)), str(meta.get("process", "?"))
        with self.cond:
            self.began.setdefault(round_, set()).add(worker)
            self.processes[attempt], self.rounds[attempt] = process, round_
            earlier = self.latest.get((round_, worker))
            if earlier is not None and earlier < attempt:  # Spark re-ran this task: the earlier attempt is gone
                self._void(earlier)
            self.latest[(round_, worker)] = max(attempt, -1 if earlier is None else earlier)
            holder = self.holders.get(worker)
            if self.over or (holder is not None and (holder.round, holder.task) > (round_, attempt)):
                return {"stop": True}
            self.holders[worker] = _Holder(attempt, round_, process, meta.get("executor"))
            self._event("served" if holder is None else "took over", worker, attempt)
            if worker not in self.sched.served:
                n = len(self.sched.schedule)
                self.sched.serve(worker)
                self._dispatch(self.sched.schedule[n:])
            self.cond.notify_all()
        return {}

    def _reply_to_pull(self, worker: int, attempt: int) -> tuple[dict[str, Any], Sequence[np.ndarray]] | None:
        holder = self.holders.get(worker)
        if holder is None or holder.task != attempt:
            return {"op": "stop"}, ()  # a later task took the chunk over
        unit = self.outstanding.get(worker)
        if self.over:  # units still in flight on other tasks are committed as they end
            self._event("ended", worker, attempt)
            del self.holders[worker]
            return {"op": "stop"}, ()
        if holder.executor in self.retiring:  # its unit in flight is committed: it asks for no other
            self._event("retired", worker, attempt)
            if unit is None or unit.delivered_to is None:
                self._release(worker)
            else:  # a unit on the task it took the chunk over from: released once that one commits
                del self.holders[worker]
            return {"op": "stop"}, ()
        if unit is None and not self.sched.needs(worker):
            self._event("ended", worker, attempt)
            self._release(worker)
            return {"op": "stop"}, ()
        if unit is not None and unit.delivered_to in (None, attempt):
            return self._deliver(worker, attempt, unit)
        return None  # the unit is still on the task this one took the chunk over from

    def result(self, worker: int, attempt: int, meta: dict[str, Any], arrays: list[np.ndarray]) -> dict[str, Any]:
        reply = super().result(worker, attempt, meta, arrays)
        with self.cond:  # committed by a task that no longer holds the chunk, which nobody holds now
            if worker not in self.holders and worker not in self.outstanding and worker in self.sched.served:
                self._release(worker)
        return reply

    def lost(self, worker: int, attempt: int) -> None:
        super().lost(worker, attempt)
        with self.cond:
            holder = self.holders.get(worker)
            if holder is not None and holder.task == attempt:
                del self.holders[worker]
                unit = self.outstanding.get(worker)
                in_flight = unit is not None and unit.delivered_to == attempt
                self._event("lost", worker, attempt, returned=unit.entry.model if in_flight else None)
            self._void(attempt)

    def retire(self, executors: set[str]) -> None:
        """Spark decommissions `executors` (a graceful leave): their tasks end after the unit they train, and their
        chunks go to the next round's tasks elsewhere."""
        with self.cond:
            self.retiring |= set(executors)
            self.cond.notify_all()

    # -- internals (lock held) ------------------------------------------------------------
    def _check_attempt(self, attempt: int, what: str) -> None:
        if self.error is not None:  # the attempt is a task's id: any task of the search may talk
            raise HopperRejected(f"search aborted in the driver: {type(self.error).__name__}: {self.error}")

    def _holder_key(self, worker: int, attempt: int) -> Any:
        return self.processes.get(attempt)  # the process keeps its models between tasks

    def _unit_extra(self, worker: int, attempt: int) -> dict[str, Any]:
        return {"process": self.processes.get(attempt), "round": self.rounds.get(attempt)}

    def _void(self, task: int) -> None:
        """`task` is gone: its unit in flight goes to its chunk's holder, or back to its model when none."""
        for chunk, unit in list(self.outstanding.items()):
            if unit.delivered_to == task:
                unit.delivered_to = None
                if chunk not in self.holders:
                    self._release(chunk)
        self.cond.notify_all()

    def _release(self, chunk: int) -> None:
        """Nobody serves `chunk` now: a unit waiting there goes back to its model, which may go elsewhere."""
        self.holders.pop(chunk, None)
        self.outstanding.pop(chunk, None)
        n = len(self.sched.schedule)
        self.sched.leave(chunk)
        self._dispatch(self.sched.schedule[n:])
        self.cond.notify_all()

    def _event(self, event: str, chunk: int, task: int, **extra: Any) -> None:
        self.events.append({"time": time.time(), "event": event, "chunk": chunk, "task": task,
                            "round": self.rounds.get(task), "process": self.processes.get(task), **extra})
