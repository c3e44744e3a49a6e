"""What every search is: the metric and its direction, configurations, decisions, and the `Search` protocol.

A search answers two questions (Optuna's sampler and pruner, Ray Tune's searcher and scheduler): *what to
try next* (:mod:`trainer.selection.search.samplers`: grid, random, TPE) and *whether a trial goes on*
(:mod:`trainer.selection.search.pruners`: none, successive halving, Hyperband, ASHA). The searches compose one
of each (the table in ``trainer.selection.search``); the runner drives all of them through one interface:

``configs()``
    every configuration, in a fixed order, with ids ``c000``, ``c001``...
``budget(config_id)``
    how many epochs the configuration may have trained *so far*. Fixed searches
    (:class:`GridSearch`, :class:`RandomSearch`) grant ``config.epochs`` at
    once; adaptive ones (:class:`SuccessiveHalving`, :class:`Hyperband`) grant
    one rung at a time. Use it as the model's epoch count in the
    :class:`~trainer.selection.engine.placement.MopScheduler`.
``report(config_id, epoch, value)`` -> :class:`Decision`
    the validation metric after ``epoch`` (0-based, like Keras callbacks).
    Reports of one configuration must come in epoch order. The decision lists
    the configurations this report stopped (``scheduler.drop`` them) and the
    ones whose budget grew (``scheduler.extend`` them).
``should_continue(config_id)`` / ``active()``
    whether a configuration will train more epochs (neither stopped nor
    complete), and the ids of those that will.
``best()`` / ``leaderboard()``
    the winner and the ranking, by each configuration's last reported value.

The optional abilities are declared on :class:`Search`, with defaults, never probed: ``space`` (the space the
tasks decode added configurations with; None), ``max_concurrent`` (trials training at once; None: no bound),
``adds_configs`` (False; True for a search that asks for configurations during the run and keeps a log of its
decisions), and ``state()`` / ``restore(log)`` / ``follow(log)`` / ``point(config_id)`` for that log (resume,
replay) and those configurations (None, or a :class:`SearchError` naming the search).

Metric direction is explicit (:class:`Metric`): accuracy-like metrics are
maximised, losses and errors minimised, and a name that says neither is an
error rather than a guess (Cerebro ranked accuracy with ``argmin`` and so
returned the worst model).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from trainer.selection.search.space import SearchSpaceError, sample

__all__ = ["SearchError", "Metric", "Config", "Decision", "Search", "search_names", "check_rungs", "positive_int",
           "make_configs", "sample_points"]

class SearchError(ValueError):
    """A search was configured or driven in a way it cannot work with."""


# ---------------------------------------------------------------------------
# Metric direction
# ---------------------------------------------------------------------------
_MAX_WORDS = ("acc", "auc", "precision", "recall", "f1", "r2_score")
_MIN_WORDS = (
    "loss", "mae", "mse", "mape", "msle", "error",
    "crossentropy", "hinge", "divergence", "huber", "logcosh",
)  # fmt: skip


def _infer_mode(name: str) -> str:
    lowered = name.lower()
    is_max = [w for w in _MAX_WORDS if w in lowered]
    is_min = [w for w in _MIN_WORDS if w in lowered]
    if is_max and not is_min:
        return "max"
    if is_min and not is_max:
        return "min"
    why = (
        f"it contains both {is_max[0]!r} (higher is better) and {is_min[0]!r} (lower is better)"
        if is_max
        else "it names no metric whose direction is known"
    )
    raise SearchError(
        f"Cannot tell whether metric {name!r} should be maximised or minimised: {why}. "
        f"Known: names containing {', '.join(_MAX_WORDS)} -> 'max'; "
        f"{', '.join(_MIN_WORDS)} -> 'min'. "
        f"Fix: pass the direction explicitly, e.g. Metric({name!r}, mode='max')."
    )


@dataclass(frozen=True)
class Metric:
    """A validation metric and its direction.

    ``mode`` is ``"max"`` (higher is better) or ``"min"``; when left out it is
    inferred from the name (see the module docstring), and an unknown name
    raises :class:`SearchError`. NaN (a diverged model) ranks below every
    number in either mode.
    """

    name: str
    mode: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SearchError(
                f"Metric: expected the metric's name, a non-empty str such as 'val_accuracy'. "
                f"Received {self.name!r}."
            )
        mode = _infer_mode(self.name) if self.mode is None else self.mode
        if mode not in ("max", "min"):
            raise SearchError(
                f"Metric {self.name!r}: expected mode 'max' or 'min'. Received mode={self.mode!r}. "
                "Fix: mode='max' when higher is better (accuracy), 'min' when lower is (loss)."
            )
        object.__setattr__(self, "mode", mode)

    @classmethod
    def of(cls, metric: Metric | str) -> Metric:
        """``metric`` itself, or ``Metric(metric)`` for a name."""
        return metric if isinstance(metric, Metric) else cls(metric)

    def _key(self, value: float) -> tuple[int, float]:
        value = float(value)
        if math.isnan(value):
            return (1, 0.0)
        return (0, -value if self.mode == "max" else value)

    def better(self, a: float, b: float) -> bool:
        """True when ``a`` is strictly better than ``b``."""
        return self._key(a) < self._key(b)

    def best(self, values: Iterable[float] | Mapping[Any, float]) -> float:
        """The best of ``values`` (the values of a mapping). NaN only if all are NaN."""
        items = list(values.values() if isinstance(values, Mapping) else values)
        if not items:
            raise SearchError(f"Metric {self.name!r}: best() of no values. Fix: report some first.")
        return min(items, key=self._key)

    def argbest(self, values: Sequence[float] | Mapping[Any, float]) -> Any:
        """Index (or key, for a mapping) of the best value; the first one on ties."""
        ranked = self.ranked(values)
        if not ranked:
            raise SearchError(
                f"Metric {self.name!r}: argbest() of no values. Fix: report some first."
            )
        return ranked[0]

    def ranked(self, values: Sequence[float] | Mapping[Any, float]) -> list[Any]:
        """Indices (or keys) from best to worst; ties keep their order, NaN last."""
        keys = list(values.keys()) if isinstance(values, Mapping) else list(range(len(values)))
        return sorted(keys, key=lambda k: self._key(values[k]))


# ---------------------------------------------------------------------------
# Configurations and decisions
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    """One configuration to train.

    ``params`` is the sampled point of the space (``batch_size`` and ``epochs``
    keys, if the space has them, stay there too). ``epochs`` is the most the
    configuration can train; an adaptive search may stop it earlier.
    """

    id: str
    params: dict[str, Any]
    batch_size: int
    epochs: int


@dataclass(frozen=True)
class Decision:
    """What one :meth:`Search.report` changed.

    ``stopped``: configurations stopped for good (drop them from the scheduler).
    ``budgets``: configurations promoted, with their new epoch budget (extend them).
    ``added``: new configurations a model-based search asked for (add them, with
    their ``budget``); the other searches know all theirs from the start.
    ``paused``: configurations that wait at a rung (ASHA): they have trained their
    budget, so the scheduler parks them; a later decision may promote them (``budgets``).
    """

    stopped: tuple[str, ...] = ()
    budgets: dict[str, int] = field(default_factory=dict)
    added: tuple[Config, ...] = ()
    paused: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.stopped or self.budgets or self.added or self.paused)


def check_rungs(owner: str, min_epochs: Any, max_epochs: Any, eta: Any) -> tuple[int, int, int]:
    """``(min_epochs, max_epochs, eta)`` of a halving search, checked: positive, eta >= 2, min <= max."""
    low, high = positive_int(owner, "min_epochs", min_epochs), positive_int(owner, "max_epochs", max_epochs)
    rate = positive_int(owner, "eta", eta)
    if rate < 2:
        raise SearchError(f"{owner}: `eta` must be >= 2 (keep 1/eta at each rung). Received eta={eta}.")
    if low > high:
        raise SearchError(
            f"{owner}: expected min_epochs <= max_epochs. Received min_epochs={min_epochs}, "
            f"max_epochs={max_epochs}. Fix: lower min_epochs or raise max_epochs."
        )
    return low, high, rate


def positive_int(owner: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise SearchError(
            f"{owner}: `{name}` must be a positive int. Received {name}={value!r}. "
            f"Fix: pass e.g. {name}=1."
        )
    return int(value)


def make_configs(points: list[dict[str, Any]], epochs: int, batch_size: int, owner: str,
                  epochs_from_params: bool = True) -> list[Config]:  # fmt: skip
    width = max(3, len(str(len(points) - 1)))
    out = []
    for i, params in enumerate(points):
        bs = positive_int(owner, "batch_size", params.get("batch_size", batch_size))
        ep = epochs
        if epochs_from_params and "epochs" in params:
            ep = positive_int(owner, "epochs", params["epochs"])
        out.append(Config(f"c{i:0{width}d}", dict(params), bs, ep))
    return out


# ---------------------------------------------------------------------------
# Searches
# ---------------------------------------------------------------------------
class Search:
    """Bookkeeping shared by every search, and its optional abilities declared with their defaults.

    A search made of a sampler and a pruner (the module docstring) subclasses this; what it can do beyond the
    interface it says here, by overriding an attribute or a method, and the runner reads it without probing.
    """

    #: The search space the tasks decode the points of configurations added during a run with; None when every
    #: configuration is known from the start (a model-based search's ``space``).
    space: Mapping[str, Any] | None = None
    #: The most trials that train at once, or None when the search does not bound them.
    max_concurrent: int | None = None
    #: True when the search asks for configurations during the run (``Decision.added``) and keeps a log of its
    #: decisions: :meth:`state`, :meth:`restore`, :meth:`follow` and :meth:`point` then work.
    adds_configs: bool = False
    #: Every search this package defines, in the order defined: a subclass is listed when it is made
    #: (``search_names``), unless it declares itself a base for others (``class X(Search, base=True)``).
    _defined: list[type[Search]] = []

    def __init_subclass__(cls, *, base: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not base and cls.__module__.startswith("trainer."):
            Search._defined.append(cls)

    def __init__(self, configs: list[Config], metric: Metric | str) -> None:
        self.metric = Metric.of(metric)
        ids = [c.id for c in configs]
        if len(set(ids)) != len(ids):
            dupes = sorted({i for i in ids if ids.count(i) > 1})
            raise SearchError(f"Config ids must be unique. Received duplicates: {dupes}.")
        self._configs: dict[str, Config] = {c.id: c for c in configs}
        self._history: dict[str, list[float]] = {c.id: [] for c in configs}
        self._stopped: set[str] = set()

    # -- queries -----------------------------------------------------------
    def configs(self) -> list[Config]:
        """Every configuration, in a fixed order."""
        return list(self._configs.values())

    def config(self, config_id: str) -> Config:
        self._check_id(config_id)
        return self._configs[config_id]

    def budget(self, config_id: str) -> int:
        """Epochs ``config_id`` may have trained by now (its scheduler epoch count)."""
        return self.config(config_id).epochs

    def history(self, config_id: str) -> list[float]:
        """The values reported for ``config_id``, one per epoch."""
        self._check_id(config_id)
        return list(self._history[config_id])

    def stopped(self, config_id: str) -> bool:
        """True when the search stopped ``config_id`` early."""
        self._check_id(config_id)
        return config_id in self._stopped

    def should_continue(self, config_id: str) -> bool:
        """True while ``config_id`` will train more epochs (not stopped, not complete)."""
        cfg = self.config(config_id)
        return config_id not in self._stopped and len(self._history[config_id]) < cfg.epochs

    def active(self) -> list[str]:
        """Ids of the configurations that will train more epochs."""
        return [cid for cid in self._configs if self.should_continue(cid)]

    @property
    def finished(self) -> bool:
        """True when no configuration will train any more."""
        return not self.active()

    def leaderboard(self) -> list[tuple[str, float, int]]:
        """``(config_id, last value, epochs reported)`` from best to worst.

        Configurations with no report yet are left out.
        """
        last = {cid: h[-1] for cid, h in self._history.items() if h}
        return [(cid, last[cid], len(self._history[cid])) for cid in self.metric.ranked(last)]

    def best(self) -> tuple[str, float]:
        """``(config_id, value)`` of the best configuration by its last reported value."""
        board = self.leaderboard()
        if not board:
            raise SearchError(
                "best(): no configuration has reported a metric yet. "
                "Fix: call report(config_id, epoch, value) after each validated epoch."
            )
        return board[0][0], board[0][1]

    # -- events ------------------------------------------------------------
    def report(self, config_id: str, epoch: int, value: float) -> Decision:
        """Record ``value`` of the metric for ``config_id`` after ``epoch`` (0-based)."""
        self._record(config_id, epoch, value)
        return Decision()

    # -- optional abilities (declared: the defaults of a search that knows every configuration at the start) --
    def state(self) -> dict[str, Any] | None:
        """The search's decisions as a JSON-able log (resume re-tells it), or None: this search decides from the
        reports alone, which resume re-reports and replay re-issues."""
        return None

    def restore(self, log: Mapping[str, Any]) -> None:
        """Re-tell ``log`` (a :meth:`state`) into this fresh search (resume); only a search with ``adds_configs``."""
        raise self._lacks("restore(log)")

    def follow(self, log: Mapping[str, Any]) -> None:
        """Take the decisions of ``log`` (a :meth:`state`) for the reports it recorded (replay); only a search
        with ``adds_configs``."""
        raise self._lacks("follow(log)")

    def point(self, config_id: str) -> dict[str, Any]:
        """The plain values the tasks decode ``config_id``'s parameters from (with :attr:`space`); only a search
        with ``adds_configs``."""
        raise self._lacks("point(config_id)")

    def _lacks(self, what: str) -> SearchError:
        return SearchError(
            f"{type(self).__name__} knows every configuration from the start and keeps no log of decisions, so it "
            f"has no {what}. Fix: call it only when search.adds_configs is True (TPESearch, ASHA)."
        )

    # -- helpers -----------------------------------------------------------
    def _check_id(self, config_id: str) -> None:
        if config_id not in self._configs:
            known = list(self._configs)
            shown = ", ".join(known[:5]) + (", ..." if len(known) > 5 else "")
            raise SearchError(
                f"Unknown config id {config_id!r}. Expected one of this search's ids: {shown}."
            )

    def _record(self, config_id: str, epoch: int, value: float) -> None:
        self._check_id(config_id)
        if config_id in self._stopped:
            raise SearchError(
                f"Config {config_id!r} was stopped after {len(self._history[config_id])} "
                f"epoch(s); received a report for epoch {epoch}. "
                "Fix: drop a configuration from the scheduler when a Decision stops it."
            )
        done = len(self._history[config_id])
        if isinstance(epoch, bool) or not isinstance(epoch, numbers.Integral) or epoch != done:
            raise SearchError(
                f"Config {config_id!r}: expected a report for epoch {done} (0-based, the next "
                f"after the {done} already reported). Received epoch={epoch!r}. "
                "Fix: report every epoch of a configuration once, in order."
            )
        budget = self.budget(config_id)
        if epoch >= budget:
            raise SearchError(
                f"Config {config_id!r} has a budget of {budget} epoch(s) for now; "
                f"received a report for epoch {epoch} (0-based). "
                "Fix: train each configuration only up to budget(config_id) epochs."
            )
        if isinstance(value, bool) or not isinstance(value, (numbers.Real, np.floating)):
            raise SearchError(
                f"Config {config_id!r}: the metric value must be a real number. "
                f"Received {value!r} ({type(value).__name__}). "
                f"Fix: pass logs[{self.metric.name!r}] as a float."
            )
        self._history[config_id].append(float(value))




def sample_points(space: Mapping[str, Any], n: int, seed: Any, owner: str) -> list[dict]:
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise SearchError(
            f"{owner}: `seed` must be a non-negative int. Received seed={seed!r}. "
            "Fix: pass e.g. seed=0; record it to reproduce the search."
        )
    master = np.random.default_rng(int(seed))
    try:
        return [sample(space, master) for _ in range(n)]
    except SearchSpaceError as exc:
        raise SearchError(f"{owner}: {exc}") from exc


def search_names() -> tuple[str, ...]:
    """Every search a user makes, by name (``ModelSelector`` lists them when given something else).

    Read from the classes themselves, so a new search is listed by being defined (and exported).
    """
    return tuple(kind.__name__ for kind in Search._defined)
