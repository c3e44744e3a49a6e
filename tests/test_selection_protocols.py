"""The searches' two protocols and declared abilities, the execution strategies as objects: no Spark, no Optuna."""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

import pytest

import trainer.selection as selection
from trainer.errors import SelectionError
from trainer.selection import GridSearch, Hyperband, ModelSelector, RandomSearch, Search, SuccessiveHalving, choice
from trainer.selection.engine.placement import MopScheduler
from trainer.selection.engine.strategies import STRATEGIES, ModelHopper, Sequential, TaskParallel, strategy_of
from trainer.selection.engine.task_parallel import TaskParallelScheduler
from trainer.selection.search import SearchError, search_names
from trainer.selection.search.protocol import Metric
from trainer.selection.search.pruners import ASHA_PRUNER, NO_PRUNER, Rungs, pruner_of, rung_ladder
from trainer.selection.search.samplers import RANDOM, TPE, sampler_of
from trainer.selection.search.space import SearchSpaceError

SELECTION = Path(selection.__file__).parent


def model_fn(params):
    raise AssertionError("not built in these tests")


# ------------------------------------------------------------------ declared, never probed
def test_no_search_is_probed_with_hasattr_or_getattr():
    found = [f"{p.relative_to(SELECTION)}:{n}" for p in sorted(SELECTION.rglob("*.py"))
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"\b(hasattr|getattr)\(", line)]
    assert not found, f"an ability of a search is declared on Search, not probed: {found}"


@pytest.mark.parametrize("search", [
    GridSearch({"units": choice([8, 16])}),
    RandomSearch({"units": choice([8, 16])}, n=2, seed=0),
    SuccessiveHalving(GridSearch({"units": choice([8, 16, 32])}), max_epochs=3),
    Hyperband({"units": choice([8, 16])}, max_epochs=3),
], ids=["grid", "random", "halving", "hyperband"])
def test_a_search_that_knows_its_configurations_declares_the_defaults(search):
    assert (search.space, search.max_concurrent, search.adds_configs, search.state()) == (None, None, False, None)
    for call in (lambda: search.restore({}), lambda: search.follow({}), lambda: search.point("c000")):
        with pytest.raises(SearchError, match="adds_configs"):
            call()


def test_every_search_is_named_where_the_selector_refuses_something_else():
    made_by_users = sorted(name for name in selection.__all__ if inspect.isclass(getattr(selection, name))
                           and issubclass(getattr(selection, name), Search) and name != "Search")
    assert sorted(search_names()) == made_by_users
    with pytest.raises(SelectionError) as info:
        ModelSelector(model_fn, object())
    assert all(name in str(info.value) for name in search_names()), str(info.value)


def test_a_search_is_listed_by_being_defined_and_a_base_or_a_user_s_own_is_not():
    class Mine(Search):  # a user's own search, outside trainer
        pass

    assert "Mine" not in search_names()
    assert "AskTellSearch" not in search_names()  # the model-based searches' base (base=True)


def test_successive_halving_takes_its_sampler_as_a_search_or_a_list():
    grid = GridSearch({"units": choice([8, 16, 32])}, metric="val_loss")
    from_search = SuccessiveHalving(grid, max_epochs=3)
    from_list = SuccessiveHalving(grid.configs(), max_epochs=3)
    assert [c.id for c in from_search.configs()] == [c.id for c in from_list.configs()] == ["c000", "c001", "c002"]
    with pytest.raises(SearchError, match="a Search"):
        SuccessiveHalving("c000", max_epochs=3)


# ------------------------------------------------------------------ a plain list in a grid
@pytest.mark.parametrize("value", [[1e-3, 1e-2], (1e-3, 1e-2)], ids=["list", "tuple"])
def test_a_plain_list_in_a_grid_search_is_refused_before_any_cluster_work(value):
    with pytest.raises(SearchSpaceError, match=re.escape("choice([0.001, 0.01])")):
        GridSearch({"lr": value, "units": choice([8, 16])})
    assert [c.params["lr"] for c in GridSearch({"lr": choice(list(value))}).configs()] == [1e-3, 1e-2]
    assert [c.params["lr"] for c in GridSearch({"lr": choice([value])}).configs()] == [value]


# ------------------------------------------------------------------ samplers and pruners
def test_samplers_and_pruners_are_looked_up_by_name_and_refuse_others():
    assert sampler_of("tpe", "X") is TPE and sampler_of("random", "X") is RANDOM
    assert pruner_of(None, "X") is NO_PRUNER and pruner_of("asha", "X") is ASHA_PRUNER
    with pytest.raises(SearchError, match=r"unknown sampler 'grid'. Expected one of \('tpe', 'random'\)"):
        sampler_of("grid", "X")
    with pytest.raises(SearchError, match="unknown pruner 'hyperband'. Expected None or 'asha'"):
        pruner_of("hyperband", "X")
    assert [TPE.draws_at_random(k, 3) for k in range(5)] == [True, True, True, False, False]
    assert all(RANDOM.draws_at_random(k, 3) for k in range(5))
    assert NO_PRUNER.ladder(1, 9, 3) == [9] and ASHA_PRUNER.ladder(1, 9, 3) == rung_ladder(1, 9, 3) == [1, 3, 9]


def test_one_rung_ladder_ranks_asynchronously_and_synchronously():
    rungs = Rungs([1, 3, 9], eta=3, metric=Metric("val_loss"))
    for cid, value in [("a", 0.5), ("b", 0.2), ("c", 0.9)]:
        rungs.record(cid, 1, value)
    rungs.record("a", 9, 0.1)  # the last rung keeps no values: every configuration there is complete
    assert rungs.values == {1: {"a": 0.5, "b": 0.2, "c": 0.9}, 3: {}}
    assert rungs.next(1) == 3 and rungs.next(2) == 3 and rungs.next(3) == 9
    assert rungs.in_quantile("b", 1) and not rungs.in_quantile("a", 1)  # asynchronous: the best len // eta
    assert rungs.best(1, 3, order=["c", "a", "b"]) == ["b", "a", "c"]  # synchronous: a full rung, ranked
    assert NO_PRUNER.goes_on(rungs, "a", 1) and not ASHA_PRUNER.goes_on(rungs, "a", 1)


def test_the_model_based_search_composes_a_sampler_and_a_pruner():
    pytest.importorskip("optuna")
    from trainer.selection import ASHA, TPESearch

    tpe = TPESearch({"units": choice([8, 16])}, max_epochs=3, n_trials=4, pruner="asha")
    asha = ASHA({"units": choice([8, 16])}, max_epochs=3, n_trials=4)
    assert (tpe.sampler, tpe.pruner, asha.sampler, asha.pruner) == (TPE, ASHA_PRUNER, RANDOM, ASHA_PRUNER)
    assert tpe.adds_configs and tpe.space == {"units": choice([8, 16])} and tpe.max_concurrent == 4
    assert tpe.state()["search"] == "TPESearch"


# ------------------------------------------------------------------ execution strategies
def test_strategies_are_objects_looked_up_by_name():
    assert STRATEGIES == selection.STRATEGIES == ("mop", "task_parallel", "sequential")
    mop, parallel, sequential = (strategy_of(name) for name in STRATEGIES)
    assert (type(mop), type(parallel), type(sequential)) == (ModelHopper, TaskParallel, Sequential)
    assert [(s.hops, s.replays, s.parallel) for s in (mop, parallel, sequential)] == [
        (True, True, True), (False, False, True), (False, False, False)]
    assert (mop.min_rows(4), parallel.min_rows(4)) == (4, 1)
    assert isinstance(mop.scheduler(["a", "b"], 2, {"a": 1, "b": 1}, 0), MopScheduler)
    assert isinstance(sequential.scheduler(["a"], 1, {"a": 1}, 0, recording=[[0, "a", 0, 0]]), TaskParallelScheduler)
    for name in ("hopper", ["mop"]):
        with pytest.raises(SelectionError, match="Expected one of: mop, task_parallel, sequential"):
            strategy_of(name)


def test_the_selector_asks_its_strategy():
    search = GridSearch({"units": choice([8, 16])})
    with pytest.raises(SelectionError, match="strategy='sequential' trains on one worker"):
        ModelSelector(model_fn, search, strategy="sequential", num_workers=2)
    with pytest.raises(SelectionError, match="Unknown strategy 'hopper'"):
        ModelSelector(model_fn, search, strategy="hopper")
    selector = ModelSelector(model_fn, search, strategy="task_parallel", num_workers=2)
    assert (selector.strategy, selector.execution) == ("task_parallel", strategy_of("task_parallel"))
    with pytest.raises(SelectionError, match="replay= needs strategy='mop'"):
        selector._check_fit_args(resume=False, replay=[])


if __name__ == "__main__":
    sys.exit(pytest.main(["-v", "-x", __file__]))
