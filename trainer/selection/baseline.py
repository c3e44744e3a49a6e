"""Task parallelism as a scheduler: the baseline that model hopper parallelism is measured against.

Setting: ``W`` workers, each holding a FULL copy of the data. A configuration
is *pinned* to the first worker that takes it and trains there, one whole
epoch (over all the data) per unit of work, until its budget is spent; it
never moves. An idle worker first continues its own pinned models that have
epochs left (in the order it took them), otherwise takes the next model no
worker has started yet (in id order). With ``W = 1`` this is plain sequential
training, configurations one after the other.

It has the interface of :class:`~trainer.selection.scheduler.MopScheduler`
(``start``, ``complete``, ``drop``, ``extend``, ``done``, ``running``,
``schedule``, ``epochs_done``, ``on_epoch_done``) so that the Spark runner
drives both the same way, except that a unit of work is a whole epoch and an
:class:`~trainer.selection.scheduler.EpochDone` follows every unit. Pure: no
I/O, no clock, no randomness.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Mapping, Sequence

from trainer.selection.scheduler import Assignment, EpochDone, ScheduledTask, ScheduleError

__all__ = ["TaskParallelScheduler"]


class TaskParallelScheduler:
    """Whole configurations on whole copies of the data; see the module docstring.

    Args:
        model_ids: unique ids, trained in this order.
        num_workers: ``W``, the number of full data copies.
        epochs: epochs per model, an int or ``{model: epochs}``.
        seed: accepted for interface parity with ``MopScheduler``; the policy is
            deterministic without it.
        on_epoch_done: optional ``callable(EpochDone)`` run inside :meth:`complete`.
    """

    def __init__(self, model_ids: Sequence[Hashable], num_workers: int,
                 epochs: int | Mapping[Hashable, int] = 1, seed: int = 0,
                 on_epoch_done: Callable[[EpochDone], Any] | None = None) -> None:  # fmt: skip
        models = list(model_ids)
        if not models or len(set(models)) != len(models):
            raise ValueError(
                f"TaskParallelScheduler: expected unique model ids. Received {models!r:.200}. "
                "Fix: pass [c.id for c in search.configs()]."
            )
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"TaskParallelScheduler: num_workers must be a positive int. Received {num_workers!r}.")
        budgets = dict(epochs) if isinstance(epochs, Mapping) else {m: epochs for m in models}
        for m in models:
            e = budgets.get(m)
            if isinstance(e, bool) or not isinstance(e, int) or e < 1:
                raise ValueError(f"TaskParallelScheduler: epochs for {m!r} must be a positive int. Received {e!r}.")
        self.models = models
        self.num_workers = num_workers
        self.seed = int(seed)
        self.on_epoch_done = on_epoch_done
        self._budget = {m: int(budgets[m]) for m in models}
        self._epoch = {m: 0 for m in models}
        self._home: dict[Hashable, int] = {}
        self._busy: list[Hashable | None] = [None] * num_workers
        self._dropped: set[Hashable] = set()
        self._started = False
        self._in_hook = False
        self.schedule: list[ScheduledTask] = []
        self.epochs_done: list[EpochDone] = []

    # -- queries -------------------------------------------------------------
    @property
    def started(self) -> bool:
        return self._started

    @property
    def running(self) -> dict[int, Hashable]:
        return {w: m for w, m in enumerate(self._busy) if m is not None}

    @property
    def done(self) -> bool:
        return self._started and not self.running and not any(self._has_work(m) for m in self.models)

    @property
    def dropped(self) -> frozenset:
        return frozenset(self._dropped)

    def epoch(self, model: Hashable) -> int:
        self._check_model(model)
        return self._epoch[model]

    def budget(self, model: Hashable) -> int:
        self._check_model(model)
        return self._budget[model]

    # -- events --------------------------------------------------------------
    def start(self) -> list[Assignment]:
        if self._started:
            raise ScheduleError("start() was already called. Fix: call it once, then feed complete() events.")
        self._started = True
        return self._fill()

    def complete(self, worker: int, model: Hashable) -> list[Assignment]:
        if not self._started:
            raise ScheduleError("complete() before start(). Fix: call start() first.")
        self._check_model(model)
        if not (isinstance(worker, int) and 0 <= worker < self.num_workers) or self._busy[worker] != model:
            raise ScheduleError(
                f"complete({worker!r}, {model!r}): expected worker {worker!r} to be running {model!r}. "
                f"Running now: {self.running!r}. Fix: report each assignment once, as it was given."
            )
        self._busy[worker] = None
        if model not in self._dropped:
            event = EpochDone(model, self._epoch[model])
            self._epoch[model] += 1
            self.epochs_done.append(event)
            if self.on_epoch_done is not None:
                self._in_hook = True
                try:
                    self.on_epoch_done(event)
                finally:
                    self._in_hook = False
        return self._fill()

    def drop(self, model: Hashable) -> list[Assignment]:
        self._check_model(model)
        self._dropped.add(model)
        return [] if self._in_hook or not self._started else self._fill()

    def extend(self, model: Hashable, epochs: int) -> list[Assignment]:
        self._check_model(model)
        if model in self._dropped:
            raise ScheduleError(f"extend({model!r}, {epochs!r}): the model was dropped.")
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < self._budget[model]:
            raise ScheduleError(
                f"extend({model!r}, {epochs!r}): expected an int >= the current budget {self._budget[model]}."
            )
        self._budget[model] = epochs
        return [] if self._in_hook or not self._started else self._fill()

    def replay(self, schedule: Any) -> None:
        raise ScheduleError(
            "TaskParallelScheduler does not replay schedules: its policy has no timing-dependent choice "
            "beyond which worker frees first. Fix: replay only model hopper (strategy='mop') runs."
        )

    # -- internals -----------------------------------------------------------
    def _has_work(self, model: Hashable) -> bool:
        return model not in self._dropped and self._epoch[model] < self._budget[model]

    def _check_model(self, model: Hashable) -> None:
        if model not in self._budget:
            raise ScheduleError(f"Unknown model {model!r}. Expected one of: {self.models[:5]!r}.")

    def _fill(self) -> list[Assignment]:
        out: list[Assignment] = []
        for w in range(self.num_workers):
            if self._busy[w] is not None:
                continue
            mine = [m for m in self.models if self._home.get(m) == w and self._has_work(m)]
            fresh = [m for m in self.models if m not in self._home and self._has_work(m)]
            pick = (mine or fresh or [None])[0]
            if pick is None:
                continue
            self._home.setdefault(pick, w)
            self._busy[w] = pick
            a = Assignment(pick, w, self._epoch[pick])
            self.schedule.append(ScheduledTask(len(self.schedule), pick, w, a.epoch))
            out.append(a)
        return out
