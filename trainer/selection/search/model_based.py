"""Searches that learn from their trials: TPE and asynchronous successive halving (ASHA), on an Optuna study.

:class:`TPESearch` suggests every new configuration from the results so far
(Optuna's ``TPESampler``); :class:`ASHA` is asynchronous successive halving as
Li et al. give it ("A System for Massively Parallel Hyperparameter Tuning",
MLSys 2020, Algorithm 2). ``TPESearch(..., pruner="asha")`` and
``ASHA(..., sampler="tpe")`` are the same search: TPE suggestions, ASHA's rungs (a sampler of
:mod:`~trainer.selection.search.samplers` and a pruner of :mod:`~trainer.selection.search.pruners`, composed).

Both drive an in-memory Optuna study with ask-and-tell and answer the selector
at every hop through the :class:`~trainer.selection.search.Search` interface:

* ``report(config_id, epoch, value)`` calls ``trial.report(value, epoch + 1)``.
  At a rung (``min_epochs * eta**k`` epochs) an ASHA trial goes on at once if
  it is among the best ``len // eta`` of the values reported at that rung so far;
  otherwise it waits there (``Decision.paused``: told to the study as pruned,
  its state kept by the driver) and its place is free. No barrier: nothing
  waits for a rung to fill.
* A free place goes first to a waiting trial that has become promotable (the
  rung filled behind it), highest rung first, best value first, then to a new
  configuration asked from the study (``Decision.added``: the selector builds
  its model and the scheduler adds it). Optuna's own ``SuccessiveHalvingPruner``
  cannot resume a pruned trial, so it must promote or stop at once and promotes
  the first trial at every rung whatever its value; model hopper parallelism
  keeps every model's state on the driver, so a trial here can wait and be
  promoted later, as in the paper. A promoted trial's outcome goes into the
  study as a new finished trial of the same point (an Optuna trial cannot be
  resumed once told). At most ``max_concurrent`` trials train at once (at least
  the workers: model hopper parallelism needs a model per worker).
* Budgets: ``n_trials`` caps the configurations, ``max_total_epochs`` the
  epochs granted over all of them (equal budgets against the other searches).
  Epochs are granted rung by rung (``min_epochs * eta**k``, then
  ``max_epochs``): a trial is asked only if its first rung fits in what is left,
  and a promotion only if its next rung does. Trials still waiting when the
  search ends count as stopped early.

The search space is the selector's (:mod:`trainer.selection.search.space`), mapped
onto Optuna's distributions by :func:`~trainer.selection.search.space.suggest`.

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

Seeds: the random configurations (every one of ``sampler="random"``, and
TPE's start-up, the first ``max_concurrent + n_startup_trials - 1``:
:attr:`AskTellSearch.random_trials`) are the draws of
:class:`~trainer.selection.search.RandomSearch` of the same seed and space, in
order (common random numbers: searches compared at one seed start from the
same configurations, Hyperband's too), enqueued into the study. They are the
same whatever the timing and across resume. TPE's suggestions are seeded by
``trial_seed(seed, k)`` for configuration ``k``: the same given the same
reports in the same order (``strategy="sequential"``, or a resumed sequential
run), not under model hopper parallelism, whose order of reports depends on
timing: replay reproduces those runs. See docs/model-selection.md.

Optuna is imported when a search is made: ``pip install '.[search]'`` in a checkout, or the wheel with
``[search]``.
"""

from __future__ import annotations

import hashlib
import math
import numbers
from typing import Any, Mapping

from trainer.selection.search.protocol import (Config, Decision, Metric, Search, SearchError, check_rungs,
                                               positive_int, sample_points)
from trainer.selection.search.pruners import PRUNERS as _PRUNERS
from trainer.selection.search.pruners import Rungs, pruner_of
from trainer.selection.search.samplers import SAMPLERS as _SAMPLERS
from trainer.selection.search.samplers import optuna_module, sampler_of
from trainer.selection.search.space import SearchSpaceError, decode, encode, suggest

__all__ = ["AskTellSearch", "TPESearch", "ASHA", "SAMPLERS", "PRUNERS", "startup_trials", "trial_seed"]

SAMPLERS = tuple(_SAMPLERS)  # the names `sampler=` takes
PRUNERS = tuple(_PRUNERS)  # the names `pruner=` takes
LOG_VERSION = 2


def trial_seed(seed: int, number: int) -> int:
    """The seed of the sampler that suggests trial ``number`` of a search seeded ``seed`` (31 bits, stable across
    machines and Python versions)."""
    digest = hashlib.sha256(f"{int(seed)}|trial|{int(number)}".encode("ascii")).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def startup_trials(n_trials: int | None, max_total_epochs: int | None, max_epochs: int) -> int:
    """TPE's random start-up when none is given: a third of the trials the budget holds at ``max_epochs`` each
    (``n_trials``, or ``max_total_epochs // max_epochs`` when that is fewer), between 2 and 5.

    Optuna's own 10 (or a fixed 5) would leave a small budget random from end to end: at 28 epochs of 4, seven
    trials, none of them suggested by TPE."""
    trials = [t for t in (n_trials, None if max_total_epochs is None else max_total_epochs // max_epochs)
              if t is not None]
    return min(5, max(2, min(trials) // 3))


class AskTellSearch(Search, base=True):
    """An Optuna study driven by ask-and-tell, trial by trial; see the module docstring.

    Use :class:`TPESearch` or :class:`ASHA`; the arguments are theirs.
    """

    adds_configs = True  # asks for configurations as places free, and logs its decisions (state, restore, follow)

    def __init__(self, space: Mapping[str, Any], max_epochs: int, *, n_trials: int | None = None,
                 max_total_epochs: int | None = None, max_concurrent: int = 4, seed: int = 0,
                 sampler: str = "tpe", pruner: str | None = None, min_epochs: int = 1, eta: int = 3,
                 n_startup_trials: int | None = None, batch_size: int = 32, metric: Metric | str = "val_loss",
                 owner: str = "AskTellSearch") -> None:  # fmt: skip
        self.owner = owner
        self.min_epochs, self.max_epochs, self.eta = check_rungs(owner, min_epochs, max_epochs, eta)
        self.max_concurrent = positive_int(owner, "max_concurrent", max_concurrent)
        self.batch_size = positive_int(owner, "batch_size", batch_size)
        if n_trials is None and max_total_epochs is None:
            raise SearchError(
                f"{owner}: give a budget: `n_trials` (configurations), `max_total_epochs` (epochs over all of "
                "them) or both. Received neither. Fix: e.g. n_trials=20, or max_total_epochs=60."
            )
        self.n_trials = None if n_trials is None else positive_int(owner, "n_trials", n_trials)
        self.max_total_epochs = (None if max_total_epochs is None
                                 else positive_int(owner, "max_total_epochs", max_total_epochs))
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
            raise SearchError(f"{owner}: `seed` must be a non-negative int. Received seed={seed!r}. Fix: seed=0.")
        self.seed = int(seed)
        self.n_startup_trials = (startup_trials(self.n_trials, self.max_total_epochs, self.max_epochs)
                                 if n_startup_trials is None
                                 else positive_int(owner, "n_startup_trials", n_startup_trials))
        #: What to try next (:mod:`trainer.selection.search.samplers`) and whether a trial goes on at a rung
        #: (:mod:`trainer.selection.search.pruners`): the two questions, composed.
        self.sampler, self.pruner = sampler_of(sampler, owner), pruner_of(pruner, owner)
        self.rungs = self.pruner.ladder(self.min_epochs, self.max_epochs, self.eta)
        if not isinstance(space, Mapping):
            raise SearchError(f"{owner}: `space` must be a dict of parameter name -> Param or constant. "
                              f"Received {type(space).__name__}.")
        self.space = dict(space)
        super().__init__([], metric)
        self._study = self._new_study()
        self._running: dict[str, Any] = {}  # config id -> its Optuna trial while it trains (None once resumed)
        self._numbers: dict[str, int] = {}  # config id -> the number of the Optuna trial it was asked as
        self._ladder = Rungs(self.rungs, self.eta, self.metric)  # the values at each rung (asynchronous)
        self._paused: dict[str, int] = {}  # config id -> the rung it waits at, in the order they paused
        self._points: dict[str, dict[str, Any]] = {}
        self._granted: dict[str, int] = {}
        self._granted_total = 0
        self._trial_log: list[list[Any]] = []
        self._events: list[list[Any]] = []
        self._script: dict[tuple[str, int], list[Any]] = {}
        self._pending_points: dict[str, dict[str, Any]] = {}  # logged points of the trials a log adds later
        self._deferred: dict[str, int] = {}  # replay: promotions logged before the trial's own wait came
        self._width = max(3, len(str((self.n_trials or 1) - 1)))
        self._fill()
        if not self._configs:
            raise SearchError(
                f"{owner}: max_total_epochs={self.max_total_epochs} is smaller than one trial's first rung "
                f"({self.rungs[0]} epochs). Fix: raise max_total_epochs."
            )

    # -- the study -----------------------------------------------------------------
    def _new_study(self):
        optuna = optuna_module()
        direction = "maximize" if self.metric.mode == "max" else "minimize"
        # ASHA's promotions are decided here (_decide), not by an Optuna pruner: see the module docstring.
        return optuna.create_study(direction=direction, sampler=self._sampler(0), pruner=optuna.pruners.NopPruner())

    def _random_point(self, number: int) -> dict[str, Any]:
        """Random configuration ``number``: the one :class:`~trainer.selection.search.RandomSearch` and
        :class:`~trainer.selection.search.Hyperband` of the same seed and space draw at that position, so that
        searches compared at one seed start from the same draws (common random numbers)."""
        return encode(self.space, sample_points(self.space, number + 1, self.seed, self.owner)[-1])

    @property
    def random_trials(self) -> int:
        """TPE's random start-up in configurations: ``max_concurrent + n_startup_trials - 1``. A configuration is
        asked when a place frees, and a place frees with a result, so TPE's first suggestion has at least
        ``n_startup_trials`` results to model. (``sampler="random"`` draws every one at random.)"""
        return self.max_concurrent + self.n_startup_trials - 1

    def _drawn_at_random(self, number: int) -> bool:
        return self.sampler.draws_at_random(number, self.random_trials)

    def _sampler(self, number: int):
        """The sampler of configuration ``number`` (0-based), seeded for it alone (:func:`trial_seed`): what it
        suggests depends on the seed, the number and the study's trials at that moment, not on how many draws
        the trials before it took. The first :attr:`random_trials` are random whatever the timing."""
        return self.sampler.make(trial_seed(self.seed, number), number, self.random_trials)

    @property
    def study(self):
        """The Optuna study (in memory): every trial asked so far, with its reports and outcome."""
        return self._study

    def _can_ask(self) -> bool:
        if self.n_trials is not None and len(self._configs) >= self.n_trials:
            return False
        return self.max_total_epochs is None or self._granted_total + self.rungs[0] <= self.max_total_epochs

    def _ask(self, cid: str | None = None, point: dict[str, Any] | None = None) -> Config:
        number = len(self._configs)
        if point is None and self._drawn_at_random(number):
            point = self._random_point(number)
        if point is not None:
            self._study.enqueue_trial(dict(point))
        self._study.sampler = self._sampler(number)
        trial = self._study.ask()
        try:
            point = suggest(self.space, trial)
            params = decode(self.space, point)
        except SearchSpaceError as exc:
            raise SearchError(f"{self.owner}: {exc}") from exc
        cid = cid or f"c{len(self._configs):0{self._width}d}"
        batch = positive_int(self.owner, "batch_size", params.get("batch_size", self.batch_size))
        config = Config(cid, params, batch, self.max_epochs)
        self._configs[cid] = config
        self._history[cid] = []
        self._running[cid] = trial
        self._numbers[cid] = trial.number
        self._points[cid] = point
        self._granted[cid] = self.rungs[0]
        self._granted_total += self.rungs[0]
        self._trial_log.append([cid, dict(point)])
        return config

    def _fill(self, stopped: tuple[str, ...] = (), paused: tuple[str, ...] = ()) -> Decision:
        """Give the free places (``max_concurrent`` minus the trials training) to promotions first, from the
        highest rung down, then to new trials, as ASHA does when a worker frees."""
        budgets, added = {}, []
        while len(self._running) < self.max_concurrent:
            cid = self._next_promotion()
            if cid is not None:
                budgets[cid] = self._resume(cid)
            elif self._can_ask():
                added.append(self._ask())
            else:
                break
        return Decision(stopped=stopped, budgets=budgets, added=tuple(added), paused=paused)

    def _next_rung(self, cid: str) -> int:
        return self._ladder.next(len(self._history[cid]))

    def _fits(self, cid: str) -> bool:
        extra = self._next_rung(cid) - self._granted[cid]
        return self.max_total_epochs is None or self._granted_total + extra <= self.max_total_epochs

    def _grant(self, cid: str, budget: int) -> int:
        self._granted_total += budget - self._granted[cid]
        self._granted[cid] = budget
        return budget

    def _next_promotion(self) -> str | None:
        for rung in reversed(self.rungs[:-1]):
            waiting = {cid: self._ladder.values[rung][cid] for cid, at in self._paused.items() if at == rung}
            for cid in self.metric.ranked(waiting):
                if self.pruner.goes_on(self._ladder, cid, rung) and self._fits(cid):
                    return cid
        return None

    def _pause(self, cid: str) -> None:
        """Wait at the rung: told to the study as pruned now (TPE ranks it by its values), promotable later."""
        self._paused[cid] = len(self._history[cid])
        self._tell(cid, "pruned")
        self._stopped.add(cid)

    def _resume(self, cid: str, budget: int | None = None) -> int:
        del self._paused[cid]
        self._stopped.discard(cid)
        self._running[cid] = None  # its Optuna trial was told: its outcome is added as a new one (_tell)
        return self._grant(cid, self._next_rung(cid) if budget is None else budget)

    def _end(self, cid: str, value: float, complete: bool) -> None:
        done = len(self._history[cid])
        self._granted_total -= self._granted[cid] - done  # epochs granted but not trained go back
        self._granted[cid] = done
        self._tell(cid, "fail" if math.isnan(value) else "complete" if complete else "pruned")
        if not complete:
            self._stopped.add(cid)

    def _tell(self, cid: str, outcome: str) -> None:
        """Tell the study how the trial of ``cid`` ended. A trial resumed after a pause was told when it paused
        (an Optuna trial cannot be resumed): its outcome goes in as a new, finished trial of the same point with
        every value it reported."""
        optuna = optuna_module()
        state = {"fail": optuna.trial.TrialState.FAIL, "complete": optuna.trial.TrialState.COMPLETE,
                 "pruned": optuna.trial.TrialState.PRUNED}[outcome]
        trial = self._running.pop(cid)
        value = self._history[cid][-1] if outcome == "complete" else None
        if trial is not None:
            self._study.tell(trial, value, state=state)
            return
        first = self._study.trials[self._numbers[cid]]
        steps = {e + 1: v for e, v in enumerate(self._history[cid]) if not math.isnan(v)}
        self._study.add_trial(optuna.trial.create_trial(params=first.params, distributions=first.distributions,
                                                        value=value, intermediate_values=steps, state=state))

    # -- the Search interface ------------------------------------------------------
    def budget(self, config_id: str) -> int:
        self._check_id(config_id)
        return self._granted[config_id]

    def point(self, config_id: str) -> dict[str, Any]:
        """The point Optuna stored for ``config_id`` (plain values: decode it with
        :func:`~trainer.selection.search.space.decode`)."""
        self._check_id(config_id)
        return dict(self._points[config_id])

    def report(self, config_id: str, epoch: int, value: float) -> Decision:
        self._record(config_id, epoch, value)
        value = float(value)
        trial = self._running[config_id]
        if trial is not None and not math.isnan(value):
            trial.report(value, epoch + 1)
        if not math.isnan(value):
            self._ladder.record(config_id, epoch + 1, value)
        scripted = self._script.pop((config_id, epoch), None)
        decision = self._decide(config_id, value) if scripted is None else self._follow_event(config_id, scripted)
        self._events.append([config_id, epoch, value, list(decision.stopped), dict(decision.budgets),
                             [c.id for c in decision.added], list(decision.paused)])
        return decision

    def _decide(self, cid: str, value: float) -> Decision:
        done = len(self._history[cid])
        if math.isnan(value):
            self._end(cid, value, complete=False)  # a diverged trial never recovers: it stops at once
            return self._fill(stopped=(cid,))
        if done >= self.max_epochs:
            self._end(cid, value, complete=True)
            return self._fill()
        if done < self._granted[cid]:
            return Decision()
        # At a rung (ASHA): go on among the best 1/eta of the rung so far, if the budget takes the next rung;
        # otherwise wait there, and the place goes to a promotion or a new trial.
        if self.pruner.goes_on(self._ladder, cid, done) and self._fits(cid):
            return Decision(budgets={cid: self._grant(cid, self._next_rung(cid))})
        self._pause(cid)
        return self._fill(paused=(cid,))

    def _follow_event(self, cid: str, event: list[Any]) -> Decision:
        stopped, budgets, added, paused = event[3], event[4], event[5], event[6]
        done = len(self._history[cid])
        current = self._history[cid][-1]
        if cid in stopped:
            self._end(cid, current, complete=False)
        elif done >= self.max_epochs and not math.isnan(current):
            self._end(cid, current, complete=True)
        elif cid in paused:
            self._pause(cid)
        granted = {}
        if cid in self._deferred:  # promoted by an earlier report of this replay: it waits and goes on at once
            granted[cid] = self._resume(cid, self._deferred.pop(cid))
        for model, budget in budgets.items():
            if model == cid:
                granted[cid] = self._grant(cid, int(budget))
            elif model in self._paused:
                granted[model] = self._resume(model, int(budget))
            else:  # replayed in another order: this trial has not reached the rung it waited at yet
                self._deferred[model] = int(budget)
        configs = tuple(self._ask(new, self._pending_points[new]) for new in added)
        return Decision(stopped=tuple(stopped), budgets=granted, added=configs, paused=tuple(paused))

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
        space: the search space (:mod:`trainer.selection.search.space`: choice, uniform,
            loguniform, quniform, randint, when, constants).
        max_epochs: Integer. The most epochs a configuration trains.
        n_trials: Integer or None. The most configurations.
        max_total_epochs: Integer or None. The most epochs over all configurations.
        max_concurrent: Integer. Trials training at once (at least the workers).
        seed: Integer. Seeds each configuration's sampler (with its number). It
            fixes the random start-up suggestions (the module docstring) whatever
            the timing; every suggestion is the same given the same
            reports in the same order (``strategy="sequential"``, resumed or
            not). Under model hopper parallelism the order of reports depends
            on timing: ``fit(replay=...)`` reproduces such a run.
        pruner: None (every trial trains ``max_epochs``) or ``"asha"``.
        min_epochs, eta: ASHA's rungs, ``min_epochs * eta**k`` epochs.
        n_startup_trials: Integer or None. The results (trials ended, stopped or
            waiting at a rung) TPE waits for before it models them: the first
            ``max_concurrent + n_startup_trials - 1`` configurations are random.
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
    """Asynchronous successive halving: a trial below its rung's quantile waits there at once, and its place goes
    to a waiting trial the rung now promotes or to a new configuration (the module docstring).

    Example:

    ```python
    search = ASHA(space, max_epochs=9, eta=3, max_total_epochs=60, sampler="tpe", seed=0, metric="val_loss")
    ```

    Args:
        sampler: ``"random"`` (the paper's ASHA) or ``"tpe"`` (TPE suggestions).
        seed: Integer. With ``sampler="random"`` it fixes the k-th configuration
            whatever the timing, resumed or not; which trials wait and which are
            promoted follows the values and their order (``fit(replay=...)``
            repeats a run's decisions). With ``"tpe"``: as for :class:`TPESearch`.
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
