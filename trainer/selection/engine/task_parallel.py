"""Task parallelism as a scheduler: the baseline that model hopper parallelism is measured against.

Setting: ``W`` workers, each holding a FULL copy of the data. A configuration
is *pinned* to the first worker that takes it and trains there, one whole
epoch (over all the data) per unit of work, until its budget is spent; it
never moves. An idle worker first continues its own pinned models that have
epochs left (in the order it took them), otherwise takes the next model no
worker has started yet (in id order). With ``W = 1`` this is plain sequential
training, configurations one after the other.

Like :class:`~trainer.selection.engine.placement.MopScheduler` it is an
:class:`~trainer.selection.engine.placement.EpochScheduler` (``start``, ``complete``,
``drop``, ``extend``, ``done``, ``running``, ``schedule``, ``epochs_done``,
``on_epoch_done``), so that the Spark runner drives both the same way; here a
unit of work is a whole epoch and an
:class:`~trainer.selection.engine.placement.EpochDone` follows every unit. Pure: no
I/O, no clock, no randomness.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Mapping, Sequence

from trainer.selection.engine.placement import Assignment, EpochDone, EpochScheduler, ScheduleError

__all__ = ["TaskParallelScheduler"]


class TaskParallelScheduler(EpochScheduler):
    """Whole configurations on whole copies of the data; see the module docstring and
    :class:`~trainer.selection.engine.placement.EpochScheduler` (the arguments and the events).
    ``seed`` is accepted for interface parity with ``MopScheduler``: the policy is
    deterministic without it."""

    def __init__(self, model_ids: Sequence[Hashable], num_workers: int,
                 epochs: int | Mapping[Hashable, int] = 1, seed: int = 0,
                 on_epoch_done: Callable[[EpochDone], Any] | None = None) -> None:  # fmt: skip
        super().__init__(model_ids, num_workers, epochs, seed, on_epoch_done)
        self._home: dict[Hashable, int] = {}  # model -> the worker it is pinned to

    def replay(self, schedule: Any) -> None:
        raise ScheduleError(
            "TaskParallelScheduler does not replay schedules: its policy has no timing-dependent choice "
            "beyond which worker frees first. Fix: replay only model hopper (strategy='mop') runs."
        )

    # -- internals -----------------------------------------------------------
    def _has_work(self, model: Hashable) -> bool:
        return model not in self._dropped and self._epoch[model] < self._budget[model]

    def _unit_done(self, model: Hashable) -> bool:
        return True  # a unit is a whole epoch

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
            out.append(self._assign(pick, w))
        return out
