"""Whether a trial goes on: the pruners (none, successive halving, Hyperband, ASHA) and their one rung ladder.

A pruner never proposes a configuration (that is a sampler's question, :mod:`trainer.selection.search.samplers`);
it grants epochs rung by rung and stops or pauses the trials below a rung's best ``1/eta``. Every pruner here
reads one :class:`Rungs`: the ladder (``min_epochs * eta**k`` epochs below ``max_epochs``, then ``max_epochs``),
the value each configuration reported at each rung, and the best of a rung.

* :class:`SuccessiveHalving` is *synchronous*: every configuration trains to the rung, waits until the whole
  rung has reported, then the best ``max(1, n // eta)`` go on and the rest stop. Under model hopper parallelism
  all models advance together anyway, so waiting costs little, and the outcome does not depend on timing.
* :class:`Hyperband` runs several such brackets over random configurations at once.
* :data:`ASHA_PRUNER` is *asynchronous* (the model-based search's, :mod:`trainer.selection.search.model_based`):
  a trial at a rung goes on at once when it is among the best ``len // eta`` of the values the rung has so far,
  and waits there otherwise; :data:`NO_PRUNER` lets every trial train ``max_epochs``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from trainer.selection.search.protocol import (Config, Decision, Metric, Search, SearchError, check_rungs,
                                               make_configs, sample_points)

__all__ = ["Rungs", "SuccessiveHalving", "Hyperband", "Pruner", "NO_PRUNER", "ASHA_PRUNER", "PRUNERS", "pruner_of"]


def rung_ladder(min_epochs: int, max_epochs: int, eta: int) -> list[int]:
    """``min_epochs * eta**k`` below ``max_epochs``, then ``max_epochs``."""
    rungs, r = [], min_epochs
    while r < max_epochs:
        rungs.append(r)
        r *= eta
    rungs.append(max_epochs)
    return rungs


class Rungs:
    """The one rung implementation: the ladder, the values reported at each rung (but the last), the best.

    ``epochs`` is the ladder. :meth:`record` keeps a configuration's value when its epochs reach a rung;
    :meth:`best` ranks a rung's values (in the order given, ties keep it) and keeps the first ``keep``.
    """

    def __init__(self, epochs: list[int], eta: int, metric: Metric) -> None:
        self.epochs, self.eta, self.metric = list(epochs), eta, metric
        self.values: dict[int, dict[str, float]] = {r: {} for r in self.epochs[:-1]}  # rung -> {config: value}

    def record(self, config_id: str, done: int, value: float) -> None:
        """Keep ``value`` when ``done`` epochs is a rung below the last."""
        if done in self.values:
            self.values[done][config_id] = value

    def next(self, done: int) -> int:
        """The first rung above ``done`` epochs."""
        return next(r for r in self.epochs if r > done)

    def best(self, rung: int, keep: int, order: Sequence[str] | None = None) -> list[str]:
        """The best ``keep`` configurations at ``rung``, ranked among ``order`` (default: all, as reported)."""
        values = self.values[rung]
        if order is not None:
            values = {cid: values[cid] for cid in order}
        return self.metric.ranked(values)[:keep]

    def in_quantile(self, config_id: str, rung: int) -> bool:
        """Among the best ``len // eta`` of the values reported at ``rung`` so far (none while fewer than eta)."""
        return config_id in self.best(rung, len(self.values[rung]) // self.eta)


@dataclass(frozen=True)
class Pruner:
    """Whether a model-based search's trial goes on at a rung; a new pruner is one such object in :data:`PRUNERS`.

    ``name`` is what ``pruner=`` takes (None: no pruner).
    """

    name: str | None

    def ladder(self, min_epochs: int, max_epochs: int, eta: int) -> list[int]:
        """The rungs a trial's epochs are granted by."""
        return rung_ladder(min_epochs, max_epochs, eta) if self.name is not None else [max_epochs]

    def goes_on(self, rungs: Rungs, config_id: str, done: int) -> bool:
        """At rung ``done``: True to go on at once (asynchronous, :meth:`Rungs.in_quantile`), False to wait."""
        return self.name is None or rungs.in_quantile(config_id, done)


NO_PRUNER = Pruner(None)
ASHA_PRUNER = Pruner("asha")
PRUNERS: dict[str | None, Pruner] = {p.name: p for p in (NO_PRUNER, ASHA_PRUNER)}


def pruner_of(name: str | None, owner: str) -> Pruner:
    """The pruner called ``name``, or a :class:`SearchError` that lists them."""
    if name not in PRUNERS:
        raise SearchError(f"{owner}: unknown pruner {name!r}. Expected None or 'asha'.")
    return PRUNERS[name]


class SuccessiveHalving(Search):
    """Synchronous successive halving over a fixed set of configurations.

    Rungs are at ``min_epochs * eta**k`` epochs (below ``max_epochs``) and at
    ``max_epochs``. Every configuration first gets a budget of the first rung;
    once all configurations still running have reported the rung's epoch, the
    best ``max(1, n // eta)`` of them (by that epoch's value) are promoted to
    the next rung and the others are stopped.

    ``configs`` is a list of :class:`Config` or a :class:`Search` (the sampler:
    a :class:`~trainer.selection.search.samplers.RandomSearch` or
    :class:`~trainer.selection.search.samplers.GridSearch`); each
    configuration's ``epochs`` becomes ``max_epochs``.
    """

    def __init__(self, configs: Sequence[Config] | Search, min_epochs: int = 1,
                 max_epochs: int | None = None, eta: int = 3,
                 metric: Metric | str = "val_loss") -> None:  # fmt: skip
        owner = "SuccessiveHalving"
        if max_epochs is None:
            raise SearchError(
                f"{owner}: `max_epochs` is required: the most epochs the best configurations "
                "train. Fix: pass e.g. max_epochs=9."
            )
        self.min_epochs, self.max_epochs, self.eta = check_rungs(owner, min_epochs, max_epochs, eta)
        if isinstance(configs, Search):
            configs = configs.configs()
        configs = list(configs)
        if not configs or not all(isinstance(c, Config) for c in configs):
            raise SearchError(
                f"{owner}: expected a non-empty list of Config or a Search (e.g. a RandomSearch). "
                f"Received {configs!r:.200}."
            )
        super().__init__([replace(c, epochs=self.max_epochs) for c in configs], metric)
        self.rungs: list[int] = rung_ladder(self.min_epochs, self.max_epochs, self.eta)
        self._ladder = Rungs(self.rungs, self.eta, self.metric)
        self._rung = 0  # index into self.rungs of the current budget

    @property
    def rung(self) -> int:
        """Index into :attr:`rungs` of the rung being trained to."""
        return self._rung

    def budget(self, config_id: str) -> int:
        self._check_id(config_id)
        if config_id in self._stopped:
            return len(self._history[config_id])
        return self.rungs[self._rung]

    def report(self, config_id: str, epoch: int, value: float) -> Decision:
        self._record(config_id, epoch, value)
        self._ladder.record(config_id, epoch + 1, self._history[config_id][-1])
        target = self.rungs[self._rung]
        alive = [cid for cid in self._configs if cid not in self._stopped]
        if self._rung == len(self.rungs) - 1:
            return Decision()  # final rung: configurations just complete
        if any(len(self._history[cid]) < target for cid in alive):
            return Decision()  # rung not complete yet: wait for the others
        keep = max(1, len(alive) // self.eta)
        ranked = self._ladder.best(target, len(alive), order=alive)
        stopped = tuple(sorted(ranked[keep:], key=list(self._configs).index))
        self._stopped.update(stopped)
        self._rung += 1
        promoted = {cid: self.rungs[self._rung] for cid in self._configs if cid in ranked[:keep]}
        return Decision(stopped=stopped, budgets=promoted)


class Hyperband(Search):
    """Hyperband: several successive-halving brackets over random configurations.

    With ``R = max_epochs / min_epochs`` and ``s_max = floor(log_eta R)``,
    bracket ``s`` (``s_max`` down to 0) samples ``ceil((s_max + 1) * eta**s / (s + 1))``
    configurations and starts them at ``max_epochs / eta**s`` epochs (rounded,
    at least ``min_epochs``). All brackets run at once, which keeps every worker
    of the model hopper busy. Configurations are sampled from ``space`` with
    ``seed`` in bracket order (ids ``c000``... across brackets), as in
    :class:`RandomSearch`.
    """

    def __init__(self, space: Mapping[str, Any], max_epochs: int, eta: int = 3, seed: int = 0,
                 min_epochs: int = 1, batch_size: int = 32,
                 metric: Metric | str = "val_loss") -> None:  # fmt: skip
        owner = "Hyperband"
        min_epochs, max_epochs, eta = check_rungs(owner, min_epochs, max_epochs, eta)
        ratio = max_epochs / min_epochs
        s_max = int(math.floor(math.log(ratio) / math.log(eta) + 1e-9))
        plan = []  # (n configs, first rung) per bracket
        for s in range(s_max, -1, -1):
            n = math.ceil((s_max + 1) * eta**s / (s + 1))
            r = max(min_epochs, round(max_epochs / eta**s))
            plan.append((n, r))
        points = sample_points(space, sum(n for n, _ in plan), seed, owner)
        configs = make_configs(points, max_epochs, batch_size, owner, epochs_from_params=False)
        super().__init__(configs, metric)
        self.eta, self.max_epochs, self.min_epochs = eta, max_epochs, min_epochs
        self.brackets: list[SuccessiveHalving] = []
        self._bracket_of: dict[str, SuccessiveHalving] = {}
        start = 0
        for n, r in plan:
            bracket = SuccessiveHalving(configs[start:start + n], r, max_epochs, eta, self.metric)
            self.brackets.append(bracket)
            for c in configs[start:start + n]:
                self._bracket_of[c.id] = bracket
            start += n

    def budget(self, config_id: str) -> int:
        self._check_id(config_id)
        return self._bracket_of[config_id].budget(config_id)

    def report(self, config_id: str, epoch: int, value: float) -> Decision:
        self._check_id(config_id)
        decision = self._bracket_of[config_id].report(config_id, epoch, value)
        self._history[config_id].append(float(value))
        self._stopped.update(decision.stopped)
        return decision
