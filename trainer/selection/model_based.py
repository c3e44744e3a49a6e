"""Searches that learn from their trials: TPE and asynchronous successive halving (ASHA), through Optuna.

:class:`TPESearch` suggests every new configuration from the results so far
(Optuna's ``TPESampler``); :class:`ASHA` stops a trial as soon as it falls
below its rung's quantile (Optuna's ``SuccessiveHalvingPruner``, which is ASHA:
Li et al., "A System for Massively Parallel Hyperparameter Tuning", MLSys
2020). ``TPESearch(..., pruner="asha")`` and ``ASHA(..., sampler="tpe")`` are
the same search: TPE suggestions, ASHA stops.

Both drive an in-memory Optuna study with ask-and-tell and answer the selector
at every hop through the :class:`~trainer.selection.search.Search` interface:

* ``report(config_id, epoch, value)`` calls ``trial.report(value, epoch + 1)``;
  with ASHA, ``trial.should_prune()`` stops the trial at once (told to the
  study as pruned). Promotion needs no barrier: a trial that reaches its rung
  among the best ``1/eta`` of the values reported at that rung *so far* goes on
  in the same call.
* A trial that stops or completes frees a place: the search asks the study for
  the next configuration and returns it in ``Decision.added``; the selector
  builds its model and the scheduler adds it, so the freed worker slot takes it
  on the next hop. At most ``max_concurrent`` trials train at once (set it to at
  least the number of workers: model hopper parallelism needs a model per worker).
* Budgets: ``n_trials`` caps the configurations, ``max_total_epochs`` the
  epochs granted over all of them (equal budgets against the other searches).
  Epochs are granted rung by rung (``min_epochs * eta**k``, then
  ``max_epochs``): a trial is asked only if its first rung fits in what is left,
  and one that would be promoted beyond it ends where it is.

The search space is the selector's (:mod:`trainer.selection.space`), mapped
onto Optuna's distributions by :func:`~trainer.selection.space.suggest`.

State, resume and replay: everything the search decided is kept as a JSON log
(:meth:`AskTellSearch.state`: each trial's id and point in ask order, then
every report with its value and decision). The selector writes it into the
checkpoint's ``progress.json`` and the result's ``selection.json``. Resuming
re-tells the log into the freshly seeded study of a new search
(:meth:`AskTellSearch.restore`: the logged points are enqueued, so the study
holds exactly the trials and values of the interrupted run, whatever Optuna
would sample now); nothing is unpickled. Replaying (:meth:`AskTellSearch.follow`)
takes each report's decision from the log, so a replayed run adds, promotes and
stops the same trials even when reports arrive in another order.

Seeds: each trial's sampler is seeded by ``trial_seed(seed, number)``, so a
suggestion depends on the seed, the trial's number and the study when it is
asked, not on the draws before it. The seed fixes the random suggestions (every
one of ``sampler="random"``; TPE's start-up, the trials asked before
``n_startup_trials`` trials ended with a value: the first
``max_concurrent + n_startup_trials - 1`` when none fails, since a trial is
asked when one ends) whatever the timing and across resume; TPE's later ones
are the same given the same reports in the same order (``strategy="sequential"``, or a resumed sequential
run), not under model hopper parallelism, whose order of reports depends on
timing: replay reproduces those runs. See docs/model-selection.md.

Optuna is imported when a search is made: ``pip install 'spark-keras-trainer[search]'``.
"""

from __future__ import annotations

import hashlib
import math
import numbers
from typing import Any, Mapping

from trainer.selection.search import (
    Config, Decision, Metric, Search, SearchError, _positive_int, _rungs, check_rungs,
)
from trainer.selection.space import SearchSpaceError, decode, suggest

__all__ = ["AskTellSearch", "TPESearch", "ASHA", "SAMPLERS", "PRUNERS", "startup_trials", "trial_seed"]

SAMPLERS = ("tpe", "random")
PRUNERS = (None, "asha")
LOG_VERSION = 1


def trial_seed(seed: int, number: int) -> int:
    """The seed of the sampler that suggests trial ``number`` of a search seeded ``seed`` (31 bits, stable across
    machines and Python versions)."""
    digest = hashlib.sha256(f"{int(seed)}|trial|{int(number)}".encode("ascii")).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def startup_trials(n_trials: int | None, max_total_epochs: int | None, max_epochs: int) -> int:
    """TPE's random start-up when none is given: a third of the trials the budget holds at ``max_epochs`` each
    (``n_trials``, or ``max_total_epochs // max_epochs`` when that is fewer), between 2 and 5.

    Optuna's own 10 (or a fixed 5) would leave a small budget random from end to end: at 28 epochs of 4, seven
    trials, none of them suggested by TPE. Trials stopped by ASHA count as results, so with a pruner TPE starts
    sooner still."""
    trials = [t for t in (n_trials, None if max_total_epochs is None else max_total_epochs // max_epochs)
              if t is not None]
    return min(5, max(2, min(trials) // 3))


def _optuna():
    try:
        import optuna
    except ImportError as exc:
        raise SearchError(
            "TPESearch and ASHA need Optuna, which is not installed. "
            "Fix: pip install 'spark-keras-trainer[search]' (or pip install 'optuna>=4,<6')."
        ) from exc
    # Optuna logs every told trial at INFO on its own handler; the trainer is quiet by default.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


class AskTellSearch(Search):
    """An Optuna study driven by ask-and-tell, trial by trial; see the module docstring.

    Use :class:`TPESearch` or :class:`ASHA`; the arguments are theirs.
    """

    def __init__(self, space: Mapping[str, Any], max_epochs: int, *, n_trials: int | None = None,
                 max_total_epochs: int | None = None, max_concurrent: int = 4, seed: int = 0,
                 sampler: str = "tpe", pruner: str | None = None, min_epochs: int = 1, eta: int = 3,
                 n_startup_trials: int | None = None, batch_size: int = 32, metric: Metric | str = "val_loss",
                 owner: str = "AskTellSearch") -> None:  # fmt: skip
        self.owner = owner
        self.min_epochs, self.max_epochs, self.eta = check_rungs(owner, min_epochs, max_epochs, eta)
        self.max_concurrent = _positive_int(owner, "max_concurrent", max_concurrent)
        self.batch_size = _positive_int(owner, "batch_size", batch_size)
        if n_trials is None and max_total_epochs is None:
            raise SearchError(
                f"{owner}: give a budget: `n_trials` (configurations), `max_total_epochs` (epochs over all of "
                "them) or both. Received neither. Fix: e.g. n_trials=20, or max_total_epochs=60."
            )
        self.n_trials = None if n_trials is None else _positive_int(owner, "n_trials", n_trials)
        self.max_total_epochs = (None if max_total_epochs is None
                                 else _positive_int(owner, "max_total_epochs", max_total_epochs))
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
            raise SearchError(f"{owner}: `seed` must be a non-negative int. Received seed={seed!r}. Fix: seed=0.")
        self.seed = int(seed)
        self.n_startup_trials = (startup_trials(self.n_trials, self.max_total_epochs, self.max_epochs)
                                 if n_startup_trials is None
                                 else _positive_int(owner, "n_startup_trials", n_startup_trials))
        if sampler not in SAMPLERS:
            raise SearchError(f"{owner}: unknown sampler {sampler!r}. Expected one of {SAMPLERS}.")
        if pruner not in PRUNERS:
            raise SearchError(f"{owner}: unknown pruner {pruner!r}. Expected None or 'asha'.")
        self.sampler, self.pruner = sampler, pruner
        self.rungs = _rungs(self.min_epochs, self.max_epochs, self.eta) if pruner else [self.max_epochs]
        if not isinstance(space, Mapping):
            raise SearchError(f"{owner}: `space` must be a dict of parameter name -> Param or constant. "
                              f"Received {type(space).__name__}.")
        self.space = dict(space)
        super().__init__([], metric)
        self._study = self._new_study()
        self._running: dict[str, Any] = {}  # config id -> its Optuna trial, while it trains
        self._points: dict[str, dict[str, Any]] = {}
        self._granted: dict[str, int] = {}
        self._granted_total = 0
        self._trial_log: list[list[Any]] = []
        self._events: list[list[Any]] = []
        self._script: dict[tuple[str, int], list[Any]] = {}
        self._pending_points: dict[str, dict[str, Any]] = {}  # logged points of the trials a log adds later
        self._width = max(3, len(str((self.n_trials or 1) - 1)))
        self._refill()
        if not self._configs:
            raise SearchError(
                f"{owner}: max_total_epochs={self.max_total_epochs} is smaller than one trial's first rung "
                f"({self.rungs[0]} epochs). Fix: raise max_total_epochs."
            )

    # -- the study -----------------------------------------------------------------
    def _new_study(self):
        optuna = _optuna()
        pruner = (optuna.pruners.SuccessiveHalvingPruner(min_resource=self.min_epochs, reduction_factor=self.eta,
                                                          min_early_stopping_rate=0)
                  if self.pruner == "asha" else optuna.pruners.NopPruner())
        direction = "maximize" if self.metric.mode == "max" else "minimize"
        return optuna.create_study(direction=direction, sampler=self._sampler(0), pruner=pruner)

    def _sampler(self, number: int):
        """A sampler seeded for trial ``number`` alone (:func:`trial_seed`): what it suggests depends on the seed,
        the number and the study's trials at that moment, not on how many draws the trials before it took."""
        optuna = _optuna()
        seed = trial_seed(self.seed, number)
        if self.sampler == "tpe":
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=self.n_startup_trials)
        return optuna.samplers.RandomSampler(seed=seed)

    @property
    def study(self):
        """The Optuna study (in memory): every trial asked so far, with its reports and outcome."""
        return self._study

    def _can_ask(self) -> bool:
        if self.n_trials is not None and len(self._configs) >= self.n_trials:
            return False
        return self.max_total_epochs is None or self._granted_total + self.rungs[0] <= self.max_total_epochs

    def _ask(self, cid: str | None = None, point: dict[str, Any] | None = None) -> Config:
        if point is not None:
            self._study.enqueue_trial(dict(point))
        self._study.sampler = self._sampler(len(self._study.trials))
        trial = self._study.ask()
        try:
            point = suggest(self.space, trial)
            params = decode(self.space, point)
        except SearchSpaceError as exc:
            raise SearchError(f"{self.owner}: {exc}") from exc
        cid = cid or f"c{len(self._configs):0{self._width}d}"
        batch = _positive_int(self.owner, "batch_size", params.get("batch_size", self.batch_size))
        config = Config(cid, params, batch, self.max_epochs)
        self._configs[cid] = config
        self._history[cid] = []
        self._running[cid] = trial
        self._points[cid] = point
        self._granted[cid] = self.rungs[0]
        self._granted_total += self.rungs[0]
        self._trial_log.append([cid, dict(point)])
        return config

    def _refill(self) -> tuple[Config, ...]:
        added = []
        while len(self._running) < self.max_concurrent and self._can_ask():
            added.append(self._ask())
        return tuple(added)

    def _end(self, cid: str, value: float, complete: bool) -> None:
        optuna = _optuna()
        trial = self._running.pop(cid)
        done = len(self._history[cid])
        self._granted_total -= self._granted[cid] - done  # epochs granted but not trained go back
        self._granted[cid] = done
        if math.isnan(value):
            self._study.tell(trial, state=optuna.trial.TrialState.FAIL)
        elif complete:
            self._study.tell(trial, value)
        else:  # TPE ranks pruned trials by their reported values
            self._study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        if not complete:
            self._stopped.add(cid)

    # -- the Search interface ------------------------------------------------------
    def budget(self, config_id: str) -> int:
        self._check_id(config_id)
        return self._granted[config_id]

    def point(self, config_id: str) -> dict[str, Any]:
        """The point Optuna stored for ``config_id`` (plain values; :func:`~trainer.selection.space.decode` it)."""
        self._check_id(config_id)
        return dict(self._points[config_id])

    def report(self, config_id: str, epoch: int, value: float) -> Decision:
        self._record(config_id, epoch, value)
        value = float(value)
        trial = self._running[config_id]
        if not math.isnan(value):
            trial.report(value, epoch + 1)
        scripted = self._script.pop((config_id, epoch), None)
        decision = self._decide(config_id, value) if scripted is None else self._follow_event(config_id, scripted)
        self._events.append([config_id, epoch, value, list(decision.stopped), dict(decision.budgets),
                             [c.id for c in decision.added]])
        return decision

    def _decide(self, cid: str, value: float) -> Decision:
        done = len(self._history[cid])
        if not math.isnan(value) and done >= self.max_epochs:
            self._end(cid, value, complete=True)
            return Decision(added=self._refill())
        if math.isnan(value) or (self.pruner is not None and self._running[cid].should_prune()):
            self._end(cid, value, complete=False)  # a diverged trial never recovers: it stops at once too
            return Decision(stopped=(cid,), added=self._refill())
        if done < self._granted[cid]:
            return Decision()
        nxt = next(r for r in self.rungs if r > done)
        extra = nxt - self._granted[cid]
        if self.max_total_epochs is not None and self._granted_total + extra > self.max_total_epochs:
            self._end(cid, value, complete=False)  # promoted, but the budget is spent
            return Decision(stopped=(cid,), added=self._refill())
        self._granted[cid] = nxt
        self._granted_total += extra
        return Decision(budgets={cid: nxt})

    def _follow_event(self, cid: str, event: list[Any]) -> Decision:
        stopped, budgets, added = event[3], event[4], event[5]
        done = len(self._history[cid])
        current = self._history[cid][-1]
        if stopped:
            self._end(cid, current, complete=False)
        elif done >= self.max_epochs and not math.isnan(current):
            self._end(cid, current, complete=True)
        for model, budget in budgets.items():
            self._granted_total += int(budget) - self._granted[model]
            self._granted[model] = int(budget)
        configs = tuple(self._ask(new, self._pending_points[new]) for new in added)
        return Decision(stopped=tuple(stopped), budgets={m: int(b) for m, b in budgets.items()}, added=configs)

    # -- state, resume and replay --------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Everything decided so far, JSON-able: ``{"version", "search", "trials", "events"}``."""
        return {"version": LOG_VERSION, "search": self.owner, "trials": [list(t) for t in self._trial_log],
                "events": [list(e) for e in self._events]}

    def follow(self, log: Mapping[str, Any]) -> None:
        """Take the decisions of ``log`` (a :meth:`state`) for the reports it recorded (replay).

        Call on a fresh search made with the same arguments. A report the log
        does not have is decided as usual.
        """
        trials, events = self._check_log(log)
        self._pending_points = {cid: point for cid, point in trials}
        self._script = {(e[0], int(e[1])): e for e in events}

    def restore(self, log: Mapping[str, Any]) -> None:
        """Re-tell ``log`` (a :meth:`state`) into this fresh search's study, in the recorded order (resume)."""
        self.follow(log)
        for event in self._check_log(log)[1]:
            self.report(event[0], int(event[1]), float(event[2]))
        self._script.clear()

    def _check_log(self, log: Mapping[str, Any]) -> tuple[list, list]:
        found = (log.get("version"), log.get("search")) if isinstance(log, Mapping) else (type(log).__name__, None)
        if found != (LOG_VERSION, self.owner):
            raise SearchError(
                f"{self.owner}: cannot follow a search log of (version, search) = {found!r}; expected "
                f"({LOG_VERSION}, {self.owner!r}). Fix: resume or replay with the search that wrote it."
            )
        trials, events = list(log.get("trials", [])), list(log.get("events", []))
        mine = self._trial_log[:len(trials)]
        if [list(t) for t in trials[:len(mine)]] != [list(t) for t in mine]:
            raise SearchError(
                f"{self.owner}: the log's first trials {trials[:len(mine)]!r:.200} differ from this search's "
                f"{mine!r:.200}. Fix: make the search with the same space, seed and arguments."
            )
        return trials, events


class TPESearch(AskTellSearch):
    """Each new configuration suggested by TPE from the results so far (Optuna's ``TPESampler``).

    Example:

    ```python
    from trainer.selection import ModelSelector, TPESearch, choice, loguniform

    space = {"arch": choice(["cnn", "mlp"]), "lr": loguniform(1e-4, 1e-2), "batch_size": choice([32, 128])}
    search = TPESearch(space, max_epochs=4, max_total_epochs=28, pruner="asha", eta=2, seed=0,
                       metric="val_accuracy")
    result = ModelSelector(model_fn, search, num_workers=2).fit(train, validation=val)
    ```

    Args:
        space: the search space (:mod:`trainer.selection.space`: choice, uniform,
            loguniform, quniform, randint, when, constants).
        max_epochs: Integer. The most epochs a configuration trains.
        n_trials: Integer or None. The most configurations.
        max_total_epochs: Integer or None. The most epochs over all configurations.
        max_concurrent: Integer. Trials training at once (at least the workers).
        seed: Integer. Seeds each trial's sampler (with the trial's number). It
            fixes the random start-up suggestions (the module docstring) whatever
            the timing; every suggestion is the same given the same
            reports in the same order (``strategy="sequential"``, resumed or
            not). Under model hopper parallelism the order of reports depends
            on timing: ``fit(replay=...)`` reproduces such a run.
        pruner: None (every trial trains ``max_epochs``) or ``"asha"``.
        min_epochs, eta: ASHA's rungs, ``min_epochs * eta**k`` epochs.
        n_startup_trials: Integer or None. The results (trials ended or stopped)
            TPE waits for before it models them; the trials asked before are random.
            None: a third of the trials the budget holds, 2 to 5 (:func:`startup_trials`).
        batch_size: Integer. Default batch size (a ``batch_size`` key of the space wins).
        metric: the selection metric, a name or a :class:`Metric`.
    """

    def __init__(self, space: Mapping[str, Any], max_epochs: int, *, n_trials: int | None = None,
                 max_total_epochs: int | None = None, max_concurrent: int = 4, seed: int = 0,
                 pruner: str | None = None, min_epochs: int = 1, eta: int = 3, n_startup_trials: int | None = None,
                 batch_size: int = 32, metric: Metric | str = "val_loss") -> None:  # fmt: skip
        super().__init__(space, max_epochs, n_trials=n_trials, max_total_epochs=max_total_epochs,
                         max_concurrent=max_concurrent, seed=seed, sampler="tpe", pruner=pruner,
                         min_epochs=min_epochs, eta=eta, n_startup_trials=n_startup_trials, batch_size=batch_size,
                         metric=metric, owner="TPESearch")


class ASHA(AskTellSearch):
    """Asynchronous successive halving: a trial below its rung's quantile stops at once (Optuna's
    ``SuccessiveHalvingPruner``), and its place goes to a new configuration.

    Example:

    ```python
    search = ASHA(space, max_epochs=9, eta=3, max_total_epochs=60, sampler="tpe", seed=0, metric="val_loss")
    ```

    Args:
        sampler: ``"random"`` (the paper's ASHA) or ``"tpe"`` (TPE suggestions).
        seed: Integer. With ``sampler="random"`` it fixes the k-th configuration
            whatever the timing, resumed or not; which trials stop
            follows the values and their order (``fit(replay=...)`` repeats a
            run's stops). With ``"tpe"``: as for :class:`TPESearch`.
        The others: as for :class:`TPESearch` (``pruner`` is always ``"asha"``).
    """

    def __init__(self, space: Mapping[str, Any], max_epochs: int, *, n_trials: int | None = None,
                 max_total_epochs: int | None = None, max_concurrent: int = 4, seed: int = 0,
                 sampler: str = "random", min_epochs: int = 1, eta: int = 3, n_startup_trials: int | None = None,
                 batch_size: int = 32, metric: Metric | str = "val_loss") -> None:  # fmt: skip
        super().__init__(space, max_epochs, n_trials=n_trials, max_total_epochs=max_total_epochs,
                         max_concurrent=max_concurrent, seed=seed, sampler=sampler, pruner="asha",
                         min_epochs=min_epochs, eta=eta, n_startup_trials=n_startup_trials, batch_size=batch_size,
                         metric=metric, owner="ASHA")
