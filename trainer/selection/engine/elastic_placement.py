"""The model hopper's scheduler for an elastic search: shards that are served now and then, as a pure state machine.

In a fixed search worker ``i`` holds shard ``i`` for the whole run
(:class:`~trainer.selection.engine.placement.MopScheduler`). In an elastic
search (``ModelSelector(num_workers=(min, max))``) the shards are chunks of the
rows that Spark keeps, and a chunk is *served* while a Spark task holds it
(``trainer.selection.engine.elastic_search``): a task starts, serves its chunk
for as long as some model still needs that chunk in its current epoch, and ends;
its executor may be lost on the way, another task may take the chunk over.
`ElasticMopScheduler` is the same policy with three more events:

* ``serve(shard)``: a task holds the shard now; returns the assignments it frees up;
* ``leave(shard)``: nobody holds it any more. A sub-epoch in flight there is
  *returned*: the model is free again and still needs that shard in its epoch
  (the unit is issued again later, with a new ``seq``), so every model still
  trains every shard once per epoch, whoever serves it;
* ``needs(shard)``: whether some model that is not dropped still has to train
  the shard in its current epoch (a task whose shard is needed by nobody ends,
  giving its slot to a chunk that is).

Only served, idle shards take assignments. Everything else (the epochs, the
budgets, ``drop``/``extend``/``add``, the matching and its ranks) is the
fixed search's. A recorded schedule is not replayed: which shard is served
when is up to Spark; a resumed search's checkpointed epochs are skipped at
once (``fast_forward``), not on each shard as it comes.
"""

from __future__ import annotations

from typing import Any, Iterable

from trainer.selection.engine.placement import Assignment, MopScheduler, ScheduleError, ScheduledTask

__all__ = ["ElasticMopScheduler"]


class ElasticMopScheduler(MopScheduler):
    """`MopScheduler` over shards that tasks serve and leave (the module docstring); `num_workers` is the number
    of shards (the search's maximum of workers)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._served: set[int] = set()

    @property
    def served(self) -> frozenset[int]:
        return frozenset(self._served)

    def serve(self, shard: int) -> list[Assignment]:
        """Event: a task holds `shard` now; returns the assignments that frees up."""
        self._check_worker(shard)
        self._served.add(shard)
        return self._fill() if self._started else []

    def leave(self, shard: int) -> list[Assignment]:
        """Event: no task holds `shard` any more; its unit in flight, if any, goes back to its model's pending
        shards. Returns the assignments the freed model gets elsewhere."""
        self._check_worker(shard)
        self._served.discard(shard)
        model = self._busy[shard]
        if model is not None:
            self._busy[shard] = None
            self._on[model] = None
            if model not in self._dropped:
                self._pending[model].add(shard)
        return self._fill() if self._started else []

    def needs(self, shard: int) -> bool:
        """True while some model not dropped still has to train `shard` in its current epoch."""
        self._check_worker(shard)
        return any(shard in self._pending[m] for m in self.models if m not in self._dropped)

    def fast_forward(self, model: Any, epochs: int) -> None:
        """Before :meth:`start`: `model`'s first `epochs` epochs are done already (a resumed search's
        checkpoints), on no shard served now."""
        if self._started:
            raise ScheduleError("fast_forward() must be called before start(). Fix: call it on a fresh scheduler.")
        self._check_model(model)
        self._epoch[model] = min(int(epochs), self._budget[model])
        self._pending[model] = set(range(self.num_workers)) if self._epoch[model] < self._budget[model] else set()

    def replay(self, schedule: Iterable[ScheduledTask | Any], late_models: bool = False) -> None:
        raise ScheduleError("An elastic search does not replay a schedule: which shard is served when is "
                            "Spark's. Fix: replay with a fixed num_workers.")

    def _idle_workers(self) -> set[int]:
        return {w for w in self._served if self._busy[w] is None}

    def _fill(self) -> list[Assignment]:
        return super()._fill() if self._served else []

