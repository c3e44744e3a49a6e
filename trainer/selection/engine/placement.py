"""The model hopper parallelism (MOP) scheduler, as a pure, event-driven state machine.

Setting: ``W`` workers, worker ``i`` pinned to data shard ``i`` for the whole
run; ``M`` models. One *sub-epoch* is one model trained on one shard. In every
epoch each model trains exactly one sub-epoch on every shard, in any order;
the model (weights and optimizer state) hops between workers, the data never
moves. At any time a worker trains at most one model and a model is on at most
one worker. A model starts epoch ``e + 1`` only once all ``W`` sub-epochs of
epoch ``e`` are done; at that point an :class:`EpochDone` is emitted so the
model can be validated.

The scheduler does no I/O and never looks at a clock. It reacts to events::

    sched = MopScheduler(["c000", "c001", "c002"], num_workers=2, epochs=3, seed=0)
    launch(sched.start())                  # initial Assignments
    ...                                    # when worker w finishes model m:
    launch(sched.complete(w, m))           # the Assignments that event frees up
    ...                                    # until sched.done

``drop(model)`` (a search stopped it), ``extend(model, epochs)`` (a search
promoted it to a larger budget) and ``add(model, epochs)`` (a model-based
search asked for a new configuration) are events too and return Assignments.

Assignment policy (documented, deterministic, no random draws at run time):
whenever workers and models are free, the scheduler computes a maximum
matching between idle workers and idle models that still need those workers'
shards in their current epoch, so no worker idles when some model could use
it. Models are considered in priority order: most remaining sub-epochs first
(longest-remaining-work, which keeps the slowest models from finishing last),
ties broken by a fixed per-model rank, ``sha256(seed, model id)``; a model
takes the free eligible worker of lowest rank ``sha256(seed, worker)``. Given the
same seed and the same order of events, the schedule is therefore identical
(on any machine and Python version). Epoch indices are 0-based, like Keras
callbacks; epoch budgets are counts.

Every assignment is recorded in :attr:`MopScheduler.schedule` as
``(seq, model, worker, epoch)``. :meth:`MopScheduler.replay` makes a fresh
scheduler issue exactly a recorded schedule, whatever the order in which
sub-epochs then finish (it waits when the next recorded assignment's worker or
model is still busy), which reproduces a run even though timings differ.

:meth:`MopScheduler.simulate` / :func:`simulate` run the state machine against
given sub-epoch durations and return the makespan and a Gantt chart, for the
benchmark and for tests. Unlike Cerebro, nothing here polls: a freed worker is
reassigned in the same call that reports it free.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import numbers
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable, Mapping, NamedTuple, Sequence

__all__ = [
    "ScheduleError",
    "Assignment",
    "EpochDone",
    "ScheduledTask",
    "GanttBar",
    "Simulation",
    "EpochScheduler",
    "MopScheduler",
    "simulate",
]


class ScheduleError(RuntimeError):
    """The scheduler was driven with an event that does not match its state."""


class Assignment(NamedTuple):
    """Train ``model`` for one sub-epoch of ``epoch`` (0-based) on ``worker``'s shard."""

    model: Hashable
    worker: int
    epoch: int


class EpochDone(NamedTuple):
    """``model`` has trained every shard of ``epoch`` (0-based): validate it now."""

    model: Hashable
    epoch: int


class ScheduledTask(NamedTuple):
    """One recorded assignment; ``seq`` counts assignments from 0 in issue order."""

    seq: int
    model: Hashable
    worker: int
    epoch: int


@dataclass(frozen=True)
class GanttBar:
    """One simulated sub-epoch: ``model`` on ``worker`` from ``start`` to ``end``."""

    model: Hashable
    worker: int
    epoch: int
    start: float
    end: float


@dataclass
class Simulation:
    """The result of :meth:`MopScheduler.simulate`.

    ``makespan``: time the last sub-epoch ends. ``bars``: the Gantt chart in
    start order. ``epochs_done``: ``(time, EpochDone)`` in event order.
    ``total_work``: sum of all simulated sub-epoch durations. ``ideal``:
    ``total_work / num_workers``, the makespan with perfect packing.
    ``efficiency``: ``ideal / makespan`` (1.0 is perfect).
    """

    makespan: float
    bars: list[GanttBar]
    schedule: list[ScheduledTask]
    epochs_done: list[tuple[float, EpochDone]]
    num_workers: int
    total_work: float = field(init=False)
    ideal: float = field(init=False)
    efficiency: float = field(init=False)

    def __post_init__(self) -> None:
        self.total_work = float(sum(b.end - b.start for b in self.bars))
        self.ideal = self.total_work / self.num_workers
        self.efficiency = self.ideal / self.makespan if self.makespan > 0 else 1.0


Durations = Mapping[tuple[Hashable, int], float] | Callable[[Hashable, int, int], float]


def _rank(seed: int, kind: str, key: Any) -> bytes:
    return hashlib.sha256(f"{seed}|{kind}|{key!r}".encode("utf-8")).digest()


def _check_pos_int(owner: str, name: str, value: Any, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{owner}: `{name}` must be a positive int. Received {value!r}. Fix: {fix}")
    return int(value)


class EpochScheduler:
    """What every scheduler of the runner shares: checked models and epoch budgets, one slot per
    worker, the start / complete / drop / extend events and the :class:`EpochDone` hook.

    Subclasses decide what a unit of work is and who gets it: ``_fill`` (assign
    idle workers), ``_has_work`` (the model still needs a unit within its
    budget), ``_unit_done`` (called as a unit of ``model`` ends; True when that
    ends the model's epoch), ``_next_epoch`` (the model entered a new epoch, or
    was parked at its budget and got more epochs).

    Args:
        model_ids: unique, hashable ids (typically ``Config.id`` strings).
        num_workers: ``W``; worker ``i`` owns shard (or data copy) ``i``.
        epochs: epochs per model, one int for all or a dict ``{model: epochs}``
            covering every model. Raise a model's count later with :meth:`extend`.
        seed: fixes the tie-breaking ranks of schedulers that have any.
        on_epoch_done: optional ``callable(EpochDone)`` called inside
            :meth:`complete` when a model finishes an epoch, before new work is
            assigned. It may call :meth:`drop` or :meth:`extend`; those then
            return ``[]`` and their assignments come back from the
            :meth:`complete` call instead. Every event is also appended to
            :attr:`epochs_done`.
    """

    def __init__(self, model_ids: Sequence[Hashable], num_workers: int,
                 epochs: int | Mapping[Hashable, int] = 1, seed: int = 0,
                 on_epoch_done: Callable[[EpochDone], Any] | None = None) -> None:  # fmt: skip
        owner = type(self).__name__
        models = list(model_ids)
        if not models:
            raise ValueError(
                f"{owner}: expected at least one model id. Received none. "
                "Fix: pass the ids of the configurations to train, e.g. [c.id for c in search.configs()]."
            )
        if len(set(models)) != len(models):
            dupes = sorted({repr(m) for m in models if models.count(m) > 1})
            raise ValueError(f"{owner}: model ids must be unique. Received duplicates: {', '.join(dupes)}.")
        self.num_workers = _check_pos_int(owner, "num_workers", num_workers,
                                          "pass the number of data shards, e.g. 2.")
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise ValueError(f"{owner}: `seed` must be an int. Received {seed!r}.")
        self.seed = int(seed)
        if isinstance(epochs, Mapping):
            missing = [m for m in models if m not in epochs]
            extra = [m for m in epochs if m not in set(models)]
            if missing or extra:
                raise ValueError(
                    f"{owner}: the epochs dict must have exactly one entry per model. "
                    f"Missing: {missing!r}; unknown: {extra!r}. "
                    "Fix: pass {model_id: epochs} for every model."
                )
            budgets = {m: _check_pos_int(owner, f"epochs[{m!r}]", epochs[m], "use at least 1 epoch.") for m in models}
        else:
            e = _check_pos_int(owner, "epochs", epochs, "pass an int >= 1 or a {model: epochs} dict.")
            budgets = {m: e for m in models}
        self.models: list[Hashable] = models
        self.on_epoch_done = on_epoch_done
        self._budget: dict[Hashable, int] = budgets
        self._epoch: dict[Hashable, int] = {m: 0 for m in models}
        self._busy: list[Hashable | None] = [None] * self.num_workers
        self._dropped: set[Hashable] = set()
        self._started = False
        self._in_hook = False
        self.schedule: list[ScheduledTask] = []
        self.epochs_done: list[EpochDone] = []

    # -- queries -----------------------------------------------------------
    @property
    def started(self) -> bool:
        return self._started

    @property
    def running(self) -> dict[int, Hashable]:
        """``{worker: model}`` for every unit of work in flight."""
        return {w: m for w, m in enumerate(self._busy) if m is not None}

    @property
    def done(self) -> bool:
        """True once started, nothing runs and no model has work left within its budget.

        A model that reached its budget counts as done; :meth:`extend` can
        give it more work, which makes ``done`` False again.
        """
        return self._started and not self.running and not any(self._has_work(m) for m in self.models)

    @property
    def dropped(self) -> frozenset:
        return frozenset(self._dropped)

    def epoch(self, model: Hashable) -> int:
        """Epochs ``model`` has completed (= the 0-based index of the one it is in)."""
        self._check_model(model)
        return self._epoch[model]

    def budget(self, model: Hashable) -> int:
        self._check_model(model)
        return self._budget[model]

    # -- events ------------------------------------------------------------
    def start(self) -> list[Assignment]:
        """Begin the run; returns the initial assignments (at most one per worker)."""
        if self._started:
            raise ScheduleError("start() was already called. Fix: call it once, then feed complete() events.")
        self._started = True
        return self._fill()

    def complete(self, worker: int, model: Hashable) -> list[Assignment]:
        """Event: ``worker`` finished its unit of work on ``model``. Returns new assignments."""
        if not self._started:
            raise ScheduleError("complete() before start(). Fix: call start() first and launch what it returns.")
        self._check_worker(worker)
        self._check_model(model)
        if self._busy[worker] != model:
            raise ScheduleError(
                f"complete({worker}, {model!r}): expected worker {worker} to be running {model!r}, "
                f"but it is running {self._busy[worker]!r}. Running now: {self.running!r}. "
                "Fix: report each assignment exactly once, with the worker and model it was given."
            )
        self._busy[worker] = None
        if self._unit_done(model) and model not in self._dropped:
            event = EpochDone(model, self._epoch[model])
            self._epoch[model] += 1
            self._next_epoch(model)
            self.epochs_done.append(event)
            if self.on_epoch_done is not None:
                self._in_hook = True
                try:
                    self.on_epoch_done(event)
                finally:
                    self._in_hook = False
        return self._fill()

    def drop(self, model: Hashable) -> list[Assignment]:
        """Event: stop ``model`` for good (e.g. a search stopped its configuration).

        A unit of it that is in flight still ends with :meth:`complete`, which
        frees the worker but emits no :class:`EpochDone`. Dropping twice is a
        no-op. Returns ``[]``: removing a model frees no worker by itself.
        """
        self._check_model(model)
        if model in self._dropped:
            return []
        self._dropped.add(model)
        return [] if self._in_hook or not self._started else self._fill()

    def add(self, model: Hashable, epochs: int) -> list[Assignment]:
        """Event: a new model joins the run with a budget of ``epochs``; returns new assignments.

        It is scheduled by the same policy as the others (a model-based search
        asks for configurations as earlier ones stop). Like :meth:`drop` and
        :meth:`extend` it returns ``[]`` inside :attr:`on_epoch_done`.
        """
        if model in self._budget:
            raise ScheduleError(f"add({model!r}, {epochs!r}): the model is already in the run. Fix: add new ids only.")
        epochs = _check_pos_int(type(self).__name__, "epochs", epochs, "pass the model's number of epochs.")
        self.models.append(model)
        self._budget[model] = epochs
        self._epoch[model] = 0
        self._added(model)
        return [] if self._in_hook or not self._started else self._fill()

    def extend(self, model: Hashable, epochs: int) -> list[Assignment]:
        """Event: raise ``model``'s total epoch budget to ``epochs``; returns new assignments."""
        self._check_model(model)
        if model in self._dropped:
            raise ScheduleError(
                f"extend({model!r}, {epochs!r}): the model was dropped. "
                "Fix: only extend models that are still in the run."
            )
        epochs = _check_pos_int(type(self).__name__, "epochs", epochs, "pass the model's new total number of epochs.")
        if epochs < self._budget[model]:
            raise ScheduleError(
                f"extend({model!r}, {epochs}): expected at least the current budget "
                f"{self._budget[model]}. Received {epochs}. Fix: pass the new total, or drop() the model."
            )
        parked = self._epoch[model] >= self._budget[model]
        self._budget[model] = epochs
        if parked and self._epoch[model] < epochs:
            self._next_epoch(model)
        return [] if self._in_hook or not self._started else self._fill()

    # -- for subclasses ----------------------------------------------------
    def _fill(self) -> list[Assignment]:
        raise NotImplementedError

    def _has_work(self, model: Hashable) -> bool:
        raise NotImplementedError

    def _unit_done(self, model: Hashable) -> bool:
        raise NotImplementedError

    def _next_epoch(self, model: Hashable) -> None:
        """``model`` entered a new epoch (after one ended, or after an extend unparked it)."""

    def _added(self, model: Hashable) -> None:
        """``model`` joined the run (:meth:`add`): set up its per-model state."""

    def _assign(self, model: Hashable, worker: int) -> Assignment:
        self._busy[worker] = model
        a = Assignment(model, worker, self._epoch[model])
        self.schedule.append(ScheduledTask(len(self.schedule), model, worker, a.epoch))
        return a

    def _check_worker(self, worker: Any) -> None:
        valid = isinstance(worker, numbers.Integral) and not isinstance(worker, bool)
        if not valid or not 0 <= worker < self.num_workers:
            raise ScheduleError(
                f"Unknown worker {worker!r}: expected an int in [0, {self.num_workers - 1}]."
            )

    def _check_model(self, model: Hashable) -> None:
        if model not in self._budget:
            shown = ", ".join(repr(m) for m in self.models[:5]) + (", ..." if len(self.models) > 5 else "")
            raise ScheduleError(f"Unknown model {model!r}. Expected one of: {shown}.")


class MopScheduler(EpochScheduler):
    """Model hopper parallelism scheduler; see the module docstring and :class:`EpochScheduler`
    (the arguments and the events). Units of work are sub-epochs: one model on one shard."""

    def __init__(self, model_ids: Sequence[Hashable], num_workers: int,
                 epochs: int | Mapping[Hashable, int] = 1, seed: int = 0,
                 on_epoch_done: Callable[[EpochDone], Any] | None = None) -> None:  # fmt: skip
        super().__init__(model_ids, num_workers, epochs, seed, on_epoch_done)
        models = self.models
        self._pending: dict[Hashable, set[int]] = {m: set(range(self.num_workers)) for m in models}
        self._on: dict[Hashable, int | None] = {m: None for m in models}
        self._model_rank = {m: _rank(self.seed, "model", m) for m in models}
        self._worker_order = sorted(range(self.num_workers), key=lambda w: _rank(self.seed, "worker", w))
        self._replay: deque[ScheduledTask] | None = None

    def remaining(self, model: Hashable) -> int:
        """Sub-epochs ``model`` still has to start within its budget (0 once dropped)."""
        self._check_model(model)
        if model in self._dropped:
            return 0
        left_epochs = max(0, self._budget[model] - self._epoch[model] - 1)
        return len(self._pending[model]) + left_epochs * self.num_workers

    # -- replay ------------------------------------------------------------
    def replay(self, schedule: Iterable[ScheduledTask | Sequence[Any]], late_models: bool = False) -> None:
        """Issue exactly ``schedule`` (a recorded :attr:`schedule`) instead of choosing.

        Call before :meth:`start`. Entries are ``(seq, model, worker, epoch)``
        tuples (JSON lists work), issued in ``seq`` order, each as soon as its
        worker and its model are both free; the scheduler never skips ahead,
        so the run's schedule equals the recording whatever order sub-epochs
        finish in. An entry that breaks the MOP rules raises
        :class:`ScheduleError`. Once the recording is used up, any work left
        is scheduled by the normal policy (so a recorded prefix can be resumed).
        With ``late_models=True`` an entry may name a model that is not in the
        run yet: the replay waits for its :meth:`add` (a model-based search adds
        configurations as it goes).
        """
        if self._started:
            raise ScheduleError("replay() must be called before start(). Fix: create a fresh MopScheduler.")
        entries = []
        for i, item in enumerate(schedule):
            if len(item) != 4:
                raise ValueError(
                    f"replay: entry {i} must be (seq, model, worker, epoch). Received {item!r}. "
                    "Fix: pass MopScheduler.schedule as recorded."
                )
            seq, model, worker, epoch = item
            if isinstance(model, list):  # JSON turns tuple ids into lists
                model = tuple(model)
            entries.append(ScheduledTask(int(seq), model, int(worker), int(epoch)))
        if [e.seq for e in entries] != list(range(len(entries))):
            raise ValueError(
                "replay: expected entries with seq 0, 1, 2, ... in order. "
                "Fix: pass the whole recorded schedule, sorted by seq."
            )
        for e in entries:
            if e.model not in self._budget and not late_models:
                raise ValueError(
                    f"replay: entry {e} names model {e.model!r}, which this scheduler does not have."
                )
            if not 0 <= e.worker < self.num_workers:
                raise ValueError(
                    f"replay: entry {e} names worker {e.worker}; this scheduler has {self.num_workers}."
                )
        self._replay = deque(entries)

    # -- simulation --------------------------------------------------------
    def simulate(self, durations: Durations) -> Simulation:
        """Run this (fresh) scheduler to the end with given sub-epoch durations.

        ``durations`` maps ``(model, worker)`` to seconds, or is a callable
        ``(model, worker, epoch) -> seconds``. Completion events are processed
        in time order, ties in assignment order. :attr:`on_epoch_done` runs as
        in a real run, so a search can drop or extend models mid-simulation.
        The simulation ends when :attr:`done`: a model parked at its budget
        and never extended simply ends there.
        """
        if self._started:
            raise ScheduleError("simulate() needs a fresh scheduler (start() was already called).")

        def duration(a: Assignment) -> float:
            if callable(durations):
                d = durations(a.model, a.worker, a.epoch)
            else:
                try:
                    d = durations[(a.model, a.worker)]
                except KeyError:
                    raise ValueError(
                        f"simulate: no duration for (model, worker) = ({a.model!r}, {a.worker}). "
                        "Fix: give every (model, worker) pair, or pass a callable."
                    ) from None
            if isinstance(d, bool) or not isinstance(d, numbers.Real) or not math.isfinite(d) or d < 0:
                raise ValueError(f"simulate: durations must be finite and >= 0. Received {d!r} for {a}.")
            return float(d)

        heap: list[tuple[float, int, Assignment]] = []
        bars: list[GanttBar] = []
        epochs_done: list[tuple[float, EpochDone]] = []

        def launch(now: float, assignments: list[Assignment]) -> None:
            for a in assignments:
                d = duration(a)
                seq = len(bars)
                bars.append(GanttBar(a.model, a.worker, a.epoch, now, now + d))
                heapq.heappush(heap, (now + d, seq, a))

        launch(0.0, self.start())
        now = 0.0
        while heap:
            now, _, a = heapq.heappop(heap)
            seen = len(self.epochs_done)
            new = self.complete(a.worker, a.model)
            epochs_done.extend((now, ev) for ev in self.epochs_done[seen:])
            launch(now, new)
        if not self.done:  # a replayed recording waiting for an extend() that never came
            stuck = [m for m in self.models if self._has_work(m)] or list(self._replay or ())[:3]
            raise ScheduleError(f"simulate: nothing is running but work is left: {stuck!r}.")
        makespan = max((b.end for b in bars), default=0.0)
        return Simulation(makespan, bars, list(self.schedule), epochs_done, self.num_workers)

    # -- internals ---------------------------------------------------------
    def _idle_workers(self) -> set[int]:
        return {w for w in range(self.num_workers) if self._busy[w] is None}

    def _has_work(self, model: Hashable) -> bool:
        return model not in self._dropped and bool(self._pending[model])

    def _unit_done(self, model: Hashable) -> bool:
        self._on[model] = None
        return not self._pending[model]

    def _next_epoch(self, model: Hashable) -> None:
        if self._epoch[model] < self._budget[model]:
            self._pending[model] = set(range(self.num_workers))

    def _added(self, model: Hashable) -> None:
        self._pending[model] = set(range(self.num_workers))
        self._on[model] = None
        self._model_rank[model] = _rank(self.seed, "model", model)

    def _issue(self, model: Hashable, worker: int) -> Assignment:
        self._pending[model].discard(worker)
        self._on[model] = worker
        return self._assign(model, worker)

    def _fill(self) -> list[Assignment]:
        out: list[Assignment] = []
        if self._replay is not None:
            while self._replay:
                e = self._replay[0]
                if e.model not in self._budget:
                    return out  # a model the search has not added yet
                if self._busy[e.worker] is not None or self._on[e.model] is not None:
                    return out  # wait for the recorded worker and model to be free
                if e.model in self._dropped:
                    raise ScheduleError(f"replay: entry {e} assigns model {e.model!r}, which was dropped.")
                if self._epoch[e.model] == e.epoch and e.worker in self._pending[e.model]:
                    self._replay.popleft()
                    out.append(self._issue(e.model, e.worker))
                    continue
                if (not self._pending[e.model] and self._epoch[e.model] == e.epoch
                        and self._epoch[e.model] >= self._budget[e.model]):  # fmt: skip
                    return out  # the model waits at its budget for an extend()
                raise ScheduleError(
                    f"replay: entry {e} cannot be issued: model {e.model!r} is in epoch "
                    f"{self._epoch[e.model]} with shards {sorted(self._pending[e.model])} left "
                    f"(budget {self._budget[e.model]} epochs). The recording does not match this run."
                )
            self._replay = None  # used up: go on with the normal policy
        idle_workers = self._idle_workers()
        if not idle_workers:
            return out
        candidates = [m for m in self.models if self._on[m] is None and self._has_work(m)]
        candidates.sort(key=lambda m: (-self.remaining(m), self._model_rank[m]))
        match: dict[int, Hashable] = {}  # worker -> model

        def augment(model: Hashable, seen: set[int]) -> bool:
            for w in self._worker_order:
                if w in idle_workers and w in self._pending[model] and w not in seen:
                    seen.add(w)
                    if w not in match or augment(match[w], seen):
                        match[w] = model
                        return True
            return False

        for m in candidates:
            if len(match) == len(idle_workers):
                break
            augment(m, set())
        by_model = {m: w for w, m in match.items()}
        for m in candidates:
            if m in by_model:
                out.append(self._issue(m, by_model[m]))
        return out


def simulate(durations: Durations, model_ids: Sequence[Hashable], num_workers: int,
             epochs: int | Mapping[Hashable, int] = 1, seed: int = 0) -> Simulation:  # fmt: skip
    """Shortcut for ``MopScheduler(model_ids, num_workers, epochs, seed).simulate(durations)``."""
    return MopScheduler(model_ids, num_workers, epochs, seed).simulate(durations)
