"""Search spaces, metric direction and the searches (pure Python, no Spark, no Keras)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from trainer.selection.search import (
    Config,
    Decision,
    GridSearch,
    Hyperband,
    Metric,
    RandomSearch,
    SearchError,
    SuccessiveHalving,
)
from trainer.selection.search.space import (
    SearchSpaceError,
    choice,
    grid,
    grid_size,
    loguniform,
    param_rng,
    quniform,
    sample,
    uniform,
)

PROPS = settings(max_examples=100, deadline=None)
finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)


# ---------------------------------------------------------------------------
# Samplers
# ---------------------------------------------------------------------------
def test_each_parameter_draws_its_own_stream():
    # Cerebro seeded every sampler with the same constant: identical draws.
    space = {"a": uniform(0, 1), "b": uniform(0, 1), "c": choice(list(range(1000))), "d": choice(list(range(1000)))}
    rng = np.random.default_rng(0)
    draws = [sample(space, rng) for _ in range(50)]
    assert all(d["a"] != d["b"] for d in draws)
    assert sum(d["c"] == d["d"] for d in draws) <= 2
    assert len({d["a"] for d in draws}) == 50  # successive draws differ


def test_same_seed_reproduces_and_streams_are_keyed_by_name():
    space = {"lr": loguniform(1e-4, 1e-1), "units": choice([16, 32, 64]), "p": quniform(0, 0.5, 0.1)}
    assert sample(space, 7) == sample(space, 7)
    assert sample(space, 7) != sample(space, 8)
    a = [sample(space, g) for g in [np.random.default_rng(3)] for _ in range(5)]
    g = np.random.default_rng(3)
    assert a == [sample(space, g) for _ in range(5)]
    # adding a parameter, or reordering, does not change what the others draw
    bigger = {"extra": uniform(0, 1), **space}
    assert {k: v for k, v in sample(bigger, 11).items() if k != "extra"} == sample(space, 11)
    assert sample(dict(reversed(list(space.items()))), 11) == sample(space, 11)
    # the per-parameter generator is what sample() uses
    assert sample({"x": uniform(0, 1)}, 5)["x"] == uniform(0, 1).draw(param_rng(5, "x"))


def test_constants_pass_through_and_types_are_plain_python():
    out = sample({"opt": "adam", "layers": (64, 32), "u": uniform(0, 1), "q": quniform(16, 256, 16)}, 0)
    assert out["opt"] == "adam" and out["layers"] == (64, 32)
    assert type(out["u"]) is float and type(out["q"]) is int
    assert type(sample({"c": choice([1, 2])}, 0)["c"]) is int


@PROPS
@given(finite, finite, st.integers(0, 2**32))
def test_uniform_respects_bounds(x, y, seed):
    low, high = sorted((x, y))
    assume(low < high)
    p = uniform(low, high)
    rng = np.random.default_rng(seed)
    for _ in range(20):
        assert low <= p.draw(rng) <= high


@PROPS
@given(st.floats(1e-8, 1e3), st.floats(1.0001, 1e4), st.integers(0, 2**32))
def test_loguniform_respects_bounds(low, factor, seed):
    p = loguniform(low, low * factor)
    rng = np.random.default_rng(seed)
    for _ in range(20):
        assert low <= p.draw(rng) <= low * factor


def test_loguniform_is_uniform_in_log_space():
    p = loguniform(1e-4, 1.0)
    rng = np.random.default_rng(0)
    logs = np.log10([p.draw(rng) for _ in range(4000)])
    assert abs(np.median(logs) - (-2.0)) < 0.1
    assert abs(np.mean(logs < -3) - 0.25) < 0.03


@PROPS
@given(finite, st.floats(0.01, 1e4), st.sampled_from([0.1, 0.25, 1.0, 3.0, 16.0]), st.integers(0, 2**32))
def test_quniform_lands_on_the_grid_inside_bounds(low, width, q, seed):
    high = low + width
    try:
        p = quniform(low, high, q)
    except SearchSpaceError:
        assert math.floor(high / q + 1e-9) < math.ceil(low / q - 1e-9)  # no grid point inside
        return
    rng = np.random.default_rng(seed)
    if width / q < 1000:
        assert set(p.values()) >= {p.draw(rng) for _ in range(20)}
    for _ in range(20):
        v = p.draw(rng)
        assert low - 1e-9 * max(1, abs(low)) <= v <= high + 1e-9 * max(1, abs(high))
        assert abs(v / q - round(v / q)) < 1e-6


def test_quniform_ints_and_clean_decimals():
    p = quniform(16, 128, 16)
    rng = np.random.default_rng(1)
    values = {p.draw(rng) for _ in range(300)}
    assert values == {16, 32, 48, 64, 80, 96, 112, 128}
    assert quniform(0.0, 0.5, 0.1).values() == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: uniform(1, 0), "low < high"),
        (lambda: uniform(1, 1), "low < high"),
        (lambda: uniform(0, float("inf")), "finite"),
        (lambda: uniform(float("nan"), 1), "finite"),
        (lambda: uniform(True, 2), "real number"),
        (lambda: uniform("0", 1), "real number"),
        (lambda: loguniform(0, 1), "0 < low"),
        (lambda: loguniform(-1, 1), "0 < low"),
        (lambda: quniform(0, 1, 0), "q > 0"),
        (lambda: quniform(0.1, 0.2, 1), "no multiple"),
        (lambda: choice([]), "at least one option"),
        (lambda: choice("abc"), "list or tuple"),
        (lambda: choice({1, 2}), "sorted"),
        (lambda: choice(5), "list or tuple"),
    ],
)
def test_bad_parameters_fail_with_clear_errors(make, match):
    with pytest.raises(SearchSpaceError, match=match) as info:
        make()
    assert "Fix:" in str(info.value) or "Received" in str(info.value)


def test_bad_spaces_and_seeds():
    with pytest.raises(SearchSpaceError, match="dict"):
        sample([("a", 1)], 0)
    with pytest.raises(SearchSpaceError, match="string keys"):
        sample({1: uniform(0, 1)}, 0)
    with pytest.raises(SearchSpaceError, match="rng"):
        sample({"a": uniform(0, 1)}, None)
    with pytest.raises(SearchSpaceError, match="non-negative int"):
        sample({"a": uniform(0, 1)}, -1)


# ---------------------------------------------------------------------------
# Grids
# ---------------------------------------------------------------------------
@PROPS
@given(st.lists(st.integers(1, 4), min_size=0, max_size=5), st.integers(0, 3))
def test_grid_enumerates_the_cartesian_product(sizes, n_constants):
    space = {f"p{i}": choice([f"v{i}_{j}" for j in range(k)]) for i, k in enumerate(sizes)}
    space.update({f"const{i}": i for i in range(n_constants)})
    points = grid(space)
    assert len(points) == math.prod(sizes) == grid_size(space)
    assert len({tuple(sorted(p.items())) for p in points}) == len(points)  # no duplicates
    assert all(p[f"const{i}"] == i for p in points for i in range(n_constants))


def test_grid_order_and_rejection_of_distributions():
    assert grid({"a": choice([1, 2]), "b": choice(["x", "y"])}) == [
        {"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 2, "b": "x"}, {"a": 2, "b": "y"},
    ]  # fmt: skip
    assert grid({}) == [{}]
    with pytest.raises(SearchSpaceError, match="'lr'.*choice") as info:
        grid({"units": choice([1]), "lr": loguniform(1e-3, 1e-1)})
    assert "RandomSearch" in str(info.value)


# ---------------------------------------------------------------------------
# Metric direction
# ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, mode",
    [
        ("accuracy", "max"), ("val_accuracy", "max"), ("val_sparse_categorical_accuracy", "max"),
        ("auc", "max"), ("val_precision", "max"), ("recall", "max"), ("f1_score", "max"),
        ("loss", "min"), ("val_loss", "min"), ("mae", "min"), ("val_mse", "min"), ("mape", "min"),
        ("mean_absolute_percentage_error", "min"), ("top5_error", "min"), ("rmse", "min"),
    ],
)  # fmt: skip
def test_metric_direction_is_inferred(name, mode):
    assert Metric(name).mode == mode


def test_unknown_or_ambiguous_metric_asks_for_a_mode():
    with pytest.raises(SearchError, match=r"mode='max'"):
        Metric("throughput")
    with pytest.raises(SearchError, match="both"):
        Metric("accuracy_loss")
    with pytest.raises(SearchError, match="'max' or 'min'"):
        Metric("accuracy", mode="up")
    assert Metric("throughput", mode="max").mode == "max"


def test_metric_picks_the_best_not_the_worst():
    acc = [0.71, 0.93, 0.55]
    assert Metric("val_accuracy").best(acc) == 0.93 and Metric("val_accuracy").argbest(acc) == 1
    assert Metric("val_loss").best([0.9, 0.2, 0.4]) == 0.2
    assert Metric("mape").argbest({"a": 5.2, "b": 3.8, "c": 4.6}) == "b"
    assert Metric("accuracy").better(0.9, 0.8) and not Metric("accuracy").better(0.8, 0.9)
    assert Metric("loss").better(0.1, 0.2)
    # NaN (a diverged model) is never the best, in either direction
    assert Metric("loss").best([float("nan"), 3.0]) == 3.0
    assert Metric("accuracy").ranked([float("nan"), 0.1, 0.5]) == [2, 1, 0]
    assert not Metric("loss").better(float("nan"), 1.0) and Metric("loss").better(1.0, float("nan"))
    with pytest.raises(SearchError, match="no values"):
        Metric("loss").best([])


# ---------------------------------------------------------------------------
# Grid and random searches
# ---------------------------------------------------------------------------
def test_grid_search_configs_and_best():
    s = GridSearch({"units": choice([8, 16, 32]), "batch_size": choice([64, 128])}, epochs=2,
                   metric="val_accuracy")  # fmt: skip
    configs = s.configs()
    assert [c.id for c in configs] == [f"c{i:03d}" for i in range(6)]
    assert {c.batch_size for c in configs} == {64, 128} and all(c.epochs == 2 for c in configs)
    for i, c in enumerate(configs):
        for e in range(2):
            assert s.report(c.id, e, 0.5 + 0.01 * i + 0.1 * e) == Decision()
    assert s.finished and s.active() == []
    assert s.best() == ("c005", pytest.approx(0.65))
    assert [row[0] for row in s.leaderboard()][:2] == ["c005", "c004"]


def test_reports_are_validated():
    s = GridSearch({"a": choice([1, 2])}, epochs=2)
    with pytest.raises(SearchError, match="Unknown config id"):
        s.report("nope", 0, 1.0)
    with pytest.raises(SearchError, match="expected a report for epoch 0"):
        s.report("c000", 1, 1.0)
    s.report("c000", 0, 1.0)
    with pytest.raises(SearchError, match="expected a report for epoch 1"):
        s.report("c000", 0, 1.0)
    s.report("c000", 1, 1.0)
    with pytest.raises(SearchError, match="budget of 2"):
        s.report("c000", 2, 1.0)
    with pytest.raises(SearchError, match="real number"):
        s.report("c001", 0, "high")
    with pytest.raises(SearchError, match="no configuration has reported"):
        GridSearch({"a": choice([1])}).best()


def test_random_search_is_reproducible_and_independent_per_parameter():
    space = {"lr": loguniform(1e-4, 1e-1), "wd": loguniform(1e-4, 1e-1), "units": choice([16, 32, 64])}
    a = RandomSearch(space, n=8, seed=1).configs()
    b = RandomSearch(space, n=8, seed=1).configs()
    c = RandomSearch(space, n=8, seed=2).configs()
    assert a == b and a != c
    assert all(cfg.params["lr"] != cfg.params["wd"] for cfg in a)
    assert len({cfg.params["lr"] for cfg in a}) == 8
    with pytest.raises(SearchError, match="seed"):
        RandomSearch(space, n=2, seed=-1)
    with pytest.raises(SearchError, match="`n` must be a positive int"):
        RandomSearch(space, n=0, seed=0)


# ---------------------------------------------------------------------------
# Successive halving and Hyperband
# ---------------------------------------------------------------------------
def _configs(n, epochs=1):
    return [Config(f"c{i:02d}", {"i": i}, 32, epochs) for i in range(n)]


@PROPS
@given(st.integers(1, 30), st.integers(2, 4), st.integers(1, 3), st.integers(2, 20), st.randoms(use_true_random=False),
       st.sampled_from(["val_accuracy", "val_loss"]))  # fmt: skip
def test_successive_halving_keeps_the_top_1_over_eta_each_rung(n, eta, min_epochs, extra, rnd, metric_name):
    max_epochs = min_epochs + extra
    sh = SuccessiveHalving(_configs(n), min_epochs, max_epochs, eta=eta, metric=metric_name)
    metric = Metric(metric_name)
    values = {c.id: [rnd.random() for _ in range(max_epochs)] for c in sh.configs()}
    alive = [c.id for c in sh.configs()]
    assert all(sh.budget(cid) == sh.rungs[0] for cid in alive)
    for k, rung in enumerate(sh.rungs):
        # a random interleaving of the configs, each one's epochs in order
        todo = {cid: list(range(len(sh.history(cid)), rung)) for cid in alive}
        order = []
        while any(todo.values()):
            cid = rnd.choice([c for c, left in todo.items() if left])
            order.append((cid, todo[cid].pop(0)))
        decisions = [sh.report(cid, e, values[cid][e]) for cid, e in order]
        if k == len(sh.rungs) - 1:
            assert not any(decisions)
            break
        assert not any(decisions[:-1])  # a rung is decided once, by its last report
        decision = decisions[-1]
        keep = max(1, len(alive) // eta)
        expected = set(metric.ranked({cid: values[cid][rung - 1] for cid in alive})[:keep])
        assert set(decision.budgets) == expected
        assert all(b == sh.rungs[k + 1] for b in decision.budgets.values())
        assert set(decision.stopped) == set(alive) - expected
        for cid in decision.stopped:
            assert not sh.should_continue(cid) and sh.budget(cid) == rung
            with pytest.raises(SearchError, match="was stopped"):
                sh.report(cid, rung, 0.5)
        alive = [cid for cid in alive if cid in expected]
        assert sh.active() == alive
    assert sh.finished
    assert all(len(sh.history(cid)) == max_epochs for cid in alive)


def test_successive_halving_nine_configs_eta_three():
    sh = SuccessiveHalving(_configs(9), 1, 9, eta=3, metric="val_accuracy")
    assert sh.rungs == [1, 3, 9]
    quality = {c.id: i / 10 for i, c in enumerate(sh.configs())}
    for cid in sh.active():
        d = sh.report(cid, 0, quality[cid])
    assert set(d.budgets) == {"c06", "c07", "c08"} and len(d.stopped) == 6
    for e in (1, 2):
        for cid in ["c06", "c07", "c08"]:
            d = sh.report(cid, e, quality[cid])
    assert d.budgets == {"c08": 9} and set(d.stopped) == {"c06", "c07"}
    for e in range(3, 9):
        sh.report("c08", e, quality["c08"])
    assert sh.finished and sh.best()[0] == "c08"


def test_successive_halving_accepts_a_search_and_validates():
    sh = SuccessiveHalving(RandomSearch({"x": uniform(0, 1)}, n=4, seed=0), min_epochs=1, max_epochs=4, eta=2)
    assert [c.epochs for c in sh.configs()] == [4] * 4 and sh.metric.mode == "min"
    with pytest.raises(SearchError, match="max_epochs"):
        SuccessiveHalving(_configs(2), 1)
    with pytest.raises(SearchError, match="eta"):
        SuccessiveHalving(_configs(2), 1, 3, eta=1)
    with pytest.raises(SearchError, match="min_epochs <= max_epochs"):
        SuccessiveHalving(_configs(2), 5, 3)
    with pytest.raises(SearchError, match="non-empty list of Config"):
        SuccessiveHalving([], 1, 3)


def test_hyperband_brackets():
    hb = Hyperband({"lr": loguniform(1e-4, 1e-1)}, max_epochs=27, eta=3, seed=0, metric="val_accuracy")
    assert [len(b.configs()) for b in hb.brackets] == [27, 12, 6, 4]
    assert [b.rungs for b in hb.brackets] == [[1, 3, 9, 27], [3, 9, 27], [9, 27], [27]]
    assert len(hb.configs()) == 49 and len({c.id for c in hb.configs()}) == 49
    assert hb.configs() == Hyperband({"lr": loguniform(1e-4, 1e-1)}, 27, 3, 0, metric="val_accuracy").configs()
    # the first bracket halves independently of the others
    first = hb.brackets[0]
    rnd = random.Random(0)
    for c in first.configs():
        d = hb.report(c.id, 0, rnd.random())
    assert len(d.budgets) == 9 and len(d.stopped) == 18
    assert all(hb.budget(cid) == 3 for cid in d.budgets)
    assert all(not hb.should_continue(cid) for cid in d.stopped)
    assert hb.budget(hb.brackets[3].configs()[0].id) == 27
    assert len(hb.active()) == 49 - 18


@pytest.mark.parametrize("value", [[1e-3, 1e-2], (32, 64)])
def test_a_plain_list_in_a_grid_is_refused_with_both_fixes(value):
    """scikit-learn's ParameterGrid reads a list as values to try; passed on as a constant it would reach Keras as one
    value: the grid refuses it when the search is made, before any cluster work, naming both fixes."""
    with pytest.raises(SearchSpaceError, match=r"plain (list|tuple)") as info:
        GridSearch({"units": choice([32]), "lr": value}, epochs=1)
    assert f"choice({list(value)!r})" in str(info.value) and f"choice([{value!r}])" in str(info.value)
    assert [p["lr"] for p in grid({"lr": choice(list(value))})] == list(value)
    assert grid({"layers": choice([value])}) == [{"layers": value}]  # the list itself, as one constant
