"""Property tests of the model hopper (MOP) scheduler, and the task-parallel baseline's events: pure state
machines, no Spark."""

from __future__ import annotations

import json
import random
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.selection.engine.task_parallel import TaskParallelScheduler
from trainer.selection.engine.placement import (
    Assignment,
    EpochDone,
    MopScheduler,
    ScheduleError,
    ScheduledTask,
    simulate,
)
from trainer.selection.search import Config, SuccessiveHalving

PROPS = settings(max_examples=100, deadline=None)


# ---------------------------------------------------------------------------
# A driver that feeds completion events and checks every MOP rule independently
# ---------------------------------------------------------------------------
class Checker:
    """Shadow state built only from the scheduler's outputs."""

    def __init__(self, sched: MopScheduler) -> None:
        self.sched = sched
        self.W = sched.num_workers
        self.worker_busy: dict[int, str] = {}
        self.model_on: dict[str, int] = {}
        self.done_pairs: dict[tuple[str, int], set[int]] = {}  # (model, epoch) -> shards done
        self.started_pairs: set[tuple[str, int, int]] = set()
        self.in_flight_epoch: dict[tuple[str, int], int] = {}
        self.dropped: set[str] = set()
        self.epoch_events: list[EpochDone] = []

    def on_assign(self, a: Assignment) -> None:
        assert isinstance(a, Assignment)
        assert a.worker not in self.worker_busy, f"worker {a.worker} got two models: {a}"
        assert a.model not in self.model_on, f"model {a.model} on two workers: {a}"
        assert a.model not in self.dropped, f"dropped model was assigned: {a}"
        key = (a.model, a.epoch, a.worker)
        assert key not in self.started_pairs, f"shard trained twice in one epoch: {a}"
        for e in range(a.epoch):  # every earlier epoch finished on every shard
            assert self.done_pairs.get((a.model, e), set()) == set(range(self.W)), (
                f"{a} started before epoch {e} was finished"
            )
        self.started_pairs.add(key)
        self.in_flight_epoch[(a.model, a.worker)] = a.epoch
        self.worker_busy[a.worker] = a.model
        self.model_on[a.model] = a.worker

    def on_complete(self, worker: int) -> tuple[int, str]:
        model = self.worker_busy.pop(worker)
        del self.model_on[model]
        epoch = self.in_flight_epoch.pop((model, worker))
        self.done_pairs.setdefault((model, epoch), set()).add(worker)
        return worker, model


def drive(sched, pick, maybe_drop=None, checker=None):
    """Run `sched` to the end. `pick(n)` chooses which of n running tasks completes."""
    checker = checker or Checker(sched)
    for a in sched.start():
        checker.on_assign(a)
    steps = 0
    limit = 10 * len(sched.models) * sched.num_workers * 4 + 10
    while True:
        running = sorted(checker.worker_busy.items())
        assert {w: m for w, m in running} == sched.running
        if maybe_drop is not None:
            victim = maybe_drop(sched)
            if victim is not None:
                checker.dropped.add(victim)
                for a in sched.drop(victim):
                    checker.on_assign(a)
                running = sorted(checker.worker_busy.items())
        if not running:
            break
        worker, model = running[pick(len(running))]
        checker.on_complete(worker)
        for a in sched.complete(worker, model):
            checker.on_assign(a)
        steps += 1
        assert steps <= limit, "scheduler did not terminate"
    assert sched.done, "nothing runs but the scheduler says work is left (deadlock)"
    return checker


def check_complete(sched: MopScheduler, checker: Checker, budgets: dict) -> None:
    W = sched.num_workers
    for m in sched.models:
        if m in checker.dropped:
            continue
        for e in range(budgets[m]):
            assert checker.done_pairs.get((m, e)) == set(range(W)), (m, e)
        assert not any(mm == m and e >= budgets[m] for (mm, e, _) in checker.started_pairs)
        assert [ev.epoch for ev in sched.epochs_done if ev.model == m] == list(range(budgets[m]))
    for ev in sched.epochs_done:
        assert checker.done_pairs[(ev.model, ev.epoch)] == set(range(W))


@st.composite
def setups(draw):
    M = draw(st.integers(1, 12))
    W = draw(st.integers(1, 6))
    ids = [f"m{i}" for i in range(M)]
    if draw(st.booleans()):
        epochs = draw(st.integers(1, 3))
        budgets = {m: epochs for m in ids}
    else:
        budgets = {m: draw(st.integers(1, 3)) for m in ids}
        epochs = dict(budgets)
    seed = draw(st.integers(0, 2**31))
    return ids, W, epochs, budgets, seed


def data_picker(data):
    return lambda n: data.draw(st.integers(0, n - 1), label="completes")


# ---------------------------------------------------------------------------
# MOP rules, termination, determinism, replay
# ---------------------------------------------------------------------------
@PROPS
@given(setups(), st.data())
def test_every_shard_once_per_epoch_and_no_overlap(setup, data):
    ids, W, epochs, budgets, seed = setup
    sched = MopScheduler(ids, W, epochs, seed=seed)
    checker = drive(sched, data_picker(data))
    check_complete(sched, checker, budgets)
    assert len(sched.schedule) == sum(budgets.values()) * W
    assert [t.seq for t in sched.schedule] == list(range(len(sched.schedule)))


@PROPS
@given(setups(), st.data())
def test_terminates_with_drops_at_any_time(setup, data):
    ids, W, epochs, budgets, seed = setup

    def maybe_drop(sched):
        if data.draw(st.integers(0, 7), label="drop?") != 0:
            return None
        alive = [m for m in sched.models if m not in sched.dropped]
        return data.draw(st.sampled_from(alive), label="victim") if alive else None

    sched = MopScheduler(ids, W, epochs, seed=seed)
    checker = drive(sched, data_picker(data), maybe_drop)
    check_complete(sched, checker, budgets)
    # a dropped model emits nothing after its drop and never runs again
    for m in checker.dropped:
        assert sched.remaining(m) == 0


@PROPS
@given(setups(), st.data())
def test_drops_from_the_epoch_hook(setup, data):
    ids, W, epochs, budgets, seed = setup
    drop_at = {m: data.draw(st.one_of(st.none(), st.integers(0, budgets[m] - 1))) for m in ids}
    holder = {}

    def hook(ev: EpochDone) -> None:
        if drop_at[ev.model] == ev.epoch:
            assert holder["s"].drop(ev.model) == []  # deferred to complete()'s return
            holder["c"].dropped.add(ev.model)

    sched = holder["s"] = MopScheduler(ids, W, epochs, seed=seed, on_epoch_done=hook)
    holder["c"] = Checker(sched)
    checker = drive(sched, data_picker(data), checker=holder["c"])
    for m in ids:
        trained = drop_at[m] + 1 if drop_at[m] is not None else budgets[m]
        assert [ev.epoch for ev in sched.epochs_done if ev.model == m] == list(range(trained))
        assert sum(1 for t in sched.schedule if t.model == m) == trained * W
    check_complete(sched, checker, budgets)


@PROPS
@given(setups(), st.data())
def test_same_seed_same_event_order_same_schedule(setup, data):
    ids, W, epochs, budgets, seed = setup
    picks: list[int] = []

    def recording(n):
        i = data.draw(st.integers(0, n - 1))
        picks.append(i)
        return i

    first = MopScheduler(ids, W, epochs, seed=seed)
    drive(first, recording)
    again = iter(picks)
    second = MopScheduler(ids, W, epochs, seed=seed)
    drive(second, lambda n: next(again))
    assert second.schedule == first.schedule
    assert second.epochs_done == first.epochs_done


@PROPS
@given(setups(), st.data())
def test_replay_reproduces_under_any_completion_order(setup, data):
    ids, W, epochs, budgets, seed = setup
    drop_at = {m: data.draw(st.one_of(st.none(), st.integers(0, budgets[m] - 1))) for m in ids}

    def make():
        holder = {}

        def hook(ev):
            if drop_at[ev.model] == ev.epoch:
                holder["s"].drop(ev.model)
                holder["c"].dropped.add(ev.model)

        s = holder["s"] = MopScheduler(ids, W, epochs, seed=seed, on_epoch_done=hook)
        holder["c"] = Checker(s)
        return s, holder["c"]

    first, c1 = make()
    drive(first, data_picker(data), checker=c1)
    recorded = json.loads(json.dumps(first.schedule))  # survives a JSON round trip
    second, c2 = make()
    second.replay(recorded)
    drive(second, data_picker(data), checker=c2)  # a different completion order
    assert second.schedule == first.schedule
    assert sorted(second.epochs_done) == sorted(first.epochs_done)


def test_seed_changes_the_tie_breaking():
    ids = [f"m{i}" for i in range(8)]
    firsts = {tuple(MopScheduler(ids, 3, 1, seed=s).start()) for s in range(10)}
    assert len(firsts) > 1


def test_replay_rejects_a_schedule_that_breaks_the_rules():
    sched = MopScheduler(["a", "b"], 2, 1)
    sched.replay([ScheduledTask(0, "a", 0, 0), ScheduledTask(1, "b", 1, 0), ScheduledTask(2, "a", 0, 0)])
    sched.start()
    with pytest.raises(ScheduleError, match="cannot be issued"):
        sched.complete(0, "a")  # entry 2 trains shard 0 of epoch 0 a second time


def test_replay_input_validation():
    with pytest.raises(ValueError, match="seq 0, 1, 2"):
        MopScheduler(["a"], 1).replay([(1, "a", 0, 0)])
    with pytest.raises(ValueError, match="does not have"):
        MopScheduler(["a"], 1).replay([(0, "zz", 0, 0)])
    sched = MopScheduler(["a"], 1)
    sched.start()
    with pytest.raises(ScheduleError, match="before start"):
        sched.replay([])


def test_replay_of_a_prefix_continues_with_the_policy():
    full = MopScheduler(["a", "b", "c"], 2, 2, seed=3)
    full.simulate(lambda m, w, e: 1.0)
    resumed = MopScheduler(["a", "b", "c"], 2, 2, seed=3)
    resumed.replay(full.schedule[:4])
    resumed.simulate(lambda m, w, e: 1.0)
    assert resumed.schedule[:4] == full.schedule[:4]
    assert len(resumed.schedule) == len(full.schedule)


# ---------------------------------------------------------------------------
# Event API errors and budgets
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", [MopScheduler, TaskParallelScheduler])
def test_event_errors_are_clear(kind):
    sched = kind(["a", "b"], 2, epochs=1)
    with pytest.raises(ScheduleError, match="before start"):
        sched.complete(0, "a")
    first = sched.start()
    assert {a.worker for a in first} == {0, 1}
    with pytest.raises(ScheduleError, match="already called"):
        sched.start()
    wrong = "b" if sched.running[0] == "a" else "a"
    with pytest.raises(ScheduleError, match="expected worker 0 to be running"):
        sched.complete(0, wrong)
    with pytest.raises(ScheduleError, match="Unknown worker"):
        sched.complete(5, "a")
    with pytest.raises(ScheduleError, match="Unknown model"):
        sched.drop("zz")
    with pytest.raises(ValueError, match="positive int"):
        sched.extend("a", 0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(model_ids=[], num_workers=1), "at least one model"),
        (dict(model_ids=["a", "a"], num_workers=1), "unique"),
        (dict(model_ids=["a"], num_workers=0), "num_workers"),
        (dict(model_ids=["a", "b"], num_workers=1, epochs={"a": 1}), "exactly one entry"),
        (dict(model_ids=["a"], num_workers=1, epochs=0), "epochs"),
    ],
)
@pytest.mark.parametrize("kind", [MopScheduler, TaskParallelScheduler])
def test_constructor_validation(kind, kwargs, match):
    with pytest.raises(ValueError, match=f"{kind.__name__}: .*{match}"):
        kind(**kwargs)


def test_extend_reopens_a_parked_model_and_rejects_shrinking():
    sched = MopScheduler(["a", "b"], 2, epochs=1)
    sim = sched.simulate(lambda m, w, e: 1.0)
    assert sched.done and sim.makespan == 2.0
    assert sched.extend("a", 1) == []  # same budget: nothing new
    new = sched.extend("a", 2)
    assert not sched.done
    assert len(new) == 1 and new[0].model == "a" and new[0].epoch == 1
    with pytest.raises(ScheduleError, match="at least the current budget"):
        sched.extend("a", 1)
    sched.drop("b")
    with pytest.raises(ScheduleError, match="was dropped"):
        sched.extend("b", 3)


@pytest.mark.parametrize("kind", [MopScheduler, TaskParallelScheduler])
def test_drop_while_running_frees_the_worker_without_an_epoch_event(kind):
    sched = kind(["a"], 1, epochs=2)
    (a,) = sched.start()
    assert sched.drop("a") == []
    assert sched.complete(0, "a") == []
    assert sched.epochs_done == [] and sched.done


def _run_to_end(sched, order=lambda pending: 0):
    """Complete assignments one at a time (``order`` picks which of the pending ones); returns them all."""
    done, pending = [], sched.start()
    while pending:
        a = pending.pop(order(pending))
        done.append(a)
        pending += sched.complete(a.worker, a.model)
    return done


def test_task_parallel_pins_each_model_to_one_worker_for_every_epoch():
    sched = TaskParallelScheduler(["a", "b", "c"], 2, epochs=3)
    units = _run_to_end(sched, order=lambda pending: len(pending) - 1)  # the last-issued finishes first
    assert sched.done and len(units) == 9
    homes = {m: {a.worker for a in units if a.model == m} for m in "abc"}
    assert all(len(workers) == 1 for workers in homes.values()), homes
    for m in "abc":
        assert [a.epoch for a in units if a.model == m] == [0, 1, 2]
    assert [(e.model, e.epoch) for e in sched.epochs_done if e.model == "c"] == [("c", 0), ("c", 1), ("c", 2)]
    assert [t.seq for t in sched.schedule] == list(range(9))


def test_task_parallel_extend_and_drop_from_the_epoch_hook():
    def hook(event: EpochDone) -> None:
        if event == EpochDone("a", 0):
            assert sched.extend("a", 3) == [] and sched.drop("b") == []  # inside the hook: no assignments

    sched = TaskParallelScheduler(["a", "b"], 1, epochs=2, on_epoch_done=hook)
    units = _run_to_end(sched)
    assert [(a.model, a.epoch) for a in units] == [("a", 0), ("a", 1), ("a", 2)]
    assert sched.done and sched.dropped == {"b"} and sched.budget("a") == 3
    assert sched.extend("a", 4) == [Assignment("a", 0, 3)]  # parked at its budget: reopened
    with pytest.raises(ScheduleError, match="does not replay"):
        TaskParallelScheduler(["a"], 1).replay([])


# ---------------------------------------------------------------------------
# Simulation: Gantt chart sanity and makespan quality
# ---------------------------------------------------------------------------
def _lower_bound(d, ids, W, E):
    chain = max(sum(d[(m, w)] for w in range(W)) * E for m in ids)
    load = max(sum(d[(m, w)] for m in ids) * E for w in range(W))
    total = sum(d.values()) * E
    return max(total / W, chain, load), total / W


@PROPS
@given(
    st.integers(1, 6),
    st.integers(0, 6),
    st.integers(1, 3),
    st.integers(0, 10**6),
    st.sampled_from(["pair", "model", "worker"]),
)
def test_makespan_within_small_factor_of_ideal(W, extra, E, seed, kind):
    M = W + extra  # models >= workers
    ids = [f"m{i}" for i in range(M)]
    rng = random.Random(seed)
    if kind == "pair":
        d = {(m, w): rng.uniform(1, 2) for m in ids for w in range(W)}
    elif kind == "model":
        f = {m: rng.uniform(1, 2) for m in ids}
        d = {(m, w): f[m] for m in ids for w in range(W)}
    else:
        f = {w: rng.uniform(1, 2) for w in range(W)}
        d = {(m, w): f[w] for m in ids for w in range(W)}
    sim = simulate(d, ids, W, epochs=E, seed=seed)
    bound, ideal = _lower_bound(d, ids, W, E)
    assert sim.ideal == pytest.approx(ideal)
    assert sim.makespan >= bound - 1e-9
    assert sim.makespan <= 1.5 * bound
    assert sim.makespan <= 2.0 * ideal  # durations within 2x of each other
    # the Gantt chart never overlaps on a worker or for a model
    for key in ("worker", "model"):
        by = {}
        for b in sim.bars:
            by.setdefault(getattr(b, key), []).append((b.start, b.end))
        for spans in by.values():
            spans.sort()
            assert all(s2 >= e1 - 1e-9 for (_, e1), (s2, _) in zip(spans, spans[1:]))
    assert len(sim.bars) == M * W * E


def test_equal_durations_pack_perfectly_when_models_are_a_multiple_of_workers():
    for W, M in [(2, 4), (4, 8), (3, 6), (4, 4)]:
        sim = simulate(lambda m, w, e: 1.0, [f"m{i}" for i in range(M)], W, epochs=2)
        assert sim.makespan == pytest.approx(sim.ideal) and sim.efficiency == pytest.approx(1.0)


def test_simulate_validates_durations():
    with pytest.raises(ValueError, match="no duration"):
        simulate({("a", 0): 1.0}, ["a"], 2)
    with pytest.raises(ValueError, match="finite and >= 0"):
        simulate(lambda m, w, e: -1.0, ["a"], 1)
    sched = MopScheduler(["a"], 1)
    sched.start()
    with pytest.raises(ScheduleError, match="fresh scheduler"):
        sched.simulate(lambda m, w, e: 1.0)


# ---------------------------------------------------------------------------
# Successive halving driving the scheduler: drops and extends mid-run
# ---------------------------------------------------------------------------
@PROPS
@given(st.integers(1, 12), st.integers(1, 4), st.integers(2, 3), st.integers(0, 10**6))
def test_successive_halving_on_the_scheduler(n, W, eta, seed):
    configs = [Config(f"c{i:02d}", {}, 32, 9) for i in range(n)]
    search = SuccessiveHalving(configs, min_epochs=1, max_epochs=4, eta=eta, metric="val_accuracy")
    quality = {c.id: random.Random(seed + i).random() for i, c in enumerate(configs)}
    holder = {}

    def hook(ev: EpochDone) -> None:
        decision = search.report(ev.model, ev.epoch, quality[ev.model] + 0.01 * ev.epoch)
        for cid in decision.stopped:
            holder["s"].drop(cid)
        for cid, budget in decision.budgets.items():
            holder["s"].extend(cid, budget)

    ids = [c.id for c in configs]
    sched = holder["s"] = MopScheduler(ids, W, {i: search.budget(i) for i in ids}, seed, on_epoch_done=hook)
    sim = sched.simulate(lambda m, w, e: 1.0 + zlib.crc32(f"{m}/{w}".encode()) % 3 / 10)
    assert sched.done and search.finished
    winner, _ = search.best()
    assert winner == max(quality, key=quality.get)
    for cid in ids:
        trained = sum(1 for b in sim.bars if b.model == cid) // W
        assert trained == len(search.history(cid)) == search.budget(cid)
    assert len(search.history(winner)) == 4
