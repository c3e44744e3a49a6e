"""How a search's models are placed on the workers: the execution strategies, as objects.

`ModelSelector(strategy=...)` takes a strategy's name; everything that differs between them is an attribute or
a method here, read by the selector and the run, never the name compared:

=================  =========================================  ====================  ==============
strategy           the workers' data, a unit of work          scheduler             replay
=================  =========================================  ====================  ==============
``mop``            shards dealt evenly; one sub-epoch          ``MopScheduler``      yes
``task_parallel``  a full copy each (broadcast); one epoch     task parallel         no
``sequential``     ``task_parallel`` on exactly one worker     task parallel         no
=================  =========================================  ====================  ==============

A new strategy is one :class:`Strategy` subclass and its entry in :data:`STRATEGY_OBJECTS`.
"""

from __future__ import annotations

from typing import Any, Hashable, Mapping, Sequence

from trainer.errors import SelectionError
from trainer.selection.engine.placement import EpochScheduler, MopScheduler
from trainer.selection.engine.task_parallel import TaskParallelScheduler

__all__ = ["Strategy", "ModelHopper", "TaskParallel", "Sequential", "STRATEGY_OBJECTS", "STRATEGIES", "strategy_of"]


class Strategy:
    """An execution strategy; the defaults are task parallelism's (whole configurations on full copies)."""

    #: The name ``strategy=`` takes.
    name = "task_parallel"
    #: True when each worker trains on its own shard and models hop between them; False: a full copy each.
    hops = False
    #: True when a recorded schedule can be issued again (``fit(replay=...)``).
    replays = False
    #: True when several workers train at once, so a search's ``max_concurrent`` below them leaves some idle.
    parallel = True
    #: True when it runs elastic (``num_workers=(min, max)``: ``trainer.selection.engine.elastic_search``).
    elastic = False

    def check_workers(self, num_workers: int) -> None:
        """Raise a :class:`SelectionError` when the strategy cannot run on ``num_workers``."""

    def min_rows(self, num_workers: int) -> int:
        """The fewest training rows the strategy runs on."""
        return 1

    def scheduler(self, ids: Sequence[Hashable], num_workers: int, budgets: Mapping[Hashable, int], seed: int, *,
                  recording: Any = None, late_models: bool = False) -> EpochScheduler:
        """The scheduler that places ``ids`` on the workers; ``recording`` (a schedule) is issued again when the
        strategy :attr:`replays`, and ignored otherwise."""
        return TaskParallelScheduler(ids, num_workers, budgets, seed=seed)


class ModelHopper(Strategy):
    """Model hopper parallelism: every worker holds one shard, models hop from shard to shard (the default)."""

    name, hops, replays, elastic = "mop", True, True, True

    def min_rows(self, num_workers: int) -> int:
        return num_workers  # one row per shard at least

    def scheduler(self, ids: Sequence[Hashable], num_workers: int, budgets: Mapping[Hashable, int], seed: int, *,
                  recording: Any = None, late_models: bool = False) -> EpochScheduler:
        scheduler = MopScheduler(ids, num_workers, budgets, seed=seed)
        if recording:
            scheduler.replay(recording, late_models=late_models)
        return scheduler


class TaskParallel(Strategy):
    """Task parallelism, the baseline: a configuration pinned to one worker trains whole epochs on a full copy."""


class Sequential(Strategy):
    """One worker trains the configurations one after another (task parallelism on one worker)."""

    name, parallel = "sequential", False

    def check_workers(self, num_workers: int) -> None:
        if num_workers != 1:
            raise SelectionError(
                f"strategy='sequential' trains on one worker. Received num_workers={num_workers}. "
                "Fix: pass num_workers=1, or strategy='task_parallel' for several workers."
            )


#: The strategies by name, the default first.
STRATEGY_OBJECTS: dict[str, Strategy] = {s.name: s for s in (ModelHopper(), TaskParallel(), Sequential())}
#: The names ``ModelSelector(strategy=...)`` takes.
STRATEGIES = tuple(STRATEGY_OBJECTS)


def strategy_of(name: Any) -> Strategy:
    """The strategy called ``name``, or a :class:`SelectionError` that lists them."""
    if not isinstance(name, str) or name not in STRATEGY_OBJECTS:
        raise SelectionError(f"Unknown strategy {name!r}. Expected one of: {', '.join(STRATEGIES)}.")
    return STRATEGY_OBJECTS[name]
