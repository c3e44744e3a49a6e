"""Searches that learn (TPESearch, ASHA): the space on Optuna, ask-and-tell, stops without a barrier, seeds,
resume and replay of the study; the driver adding configurations (fake tasks, real sockets); real searches.

The first part is pure (Optuna, no Spark, no Keras). The fake-task tests drive the real driver-side run over
real sockets, as tests/test_selection_runner.py does; the last two run through ModelSelector on the shared
2-worker cluster: TPE with ASHA under model hopper parallelism (stops and promotions without a barrier, the
seed's start-up suggestions whatever the timing), and a sequential TPE study stopped, resumed and compared with
a whole run of the same seed.
"""

from __future__ import annotations

import collections
import json
import sys
import threading

import numpy as np
import pytest

optuna = pytest.importorskip("optuna")

from trainer.selection import (  # noqa: E402
    ASHA, Hyperband, ModelSelector, RandomSearch, SelectionCallback, TPESearch, choice, loguniform, quniform, randint,
    when,
)
from trainer.selection.search.model_based import AskTellSearch, startup_trials  # noqa: E402
from trainer.selection.engine.search_run import make_search_run  # noqa: E402
from trainer.selection.engine.hopper import HopperClient, HopperServer  # noqa: E402
from trainer.selection.engine.placement import MopScheduler  # noqa: E402
from trainer.selection.search import SearchError  # noqa: E402
from trainer.selection.engine.search_checkpoints import CheckpointStore  # noqa: E402
from trainer.selection.search.space import SearchSpaceError, decode, encode, grid, sample, suggest  # noqa: E402
from trainer.transport.wire import new_secret  # noqa: E402

SPACE = {"lr": loguniform(1e-4, 1e-1), "arch": choice(["a", "b"]), "units": when("arch", "b", randint(8, 64))}


def loss(params: dict, epoch: int) -> float:
    """A made-up validation loss: best near lr = 1e-2, falling with epochs."""
    return abs(np.log10(params["lr"]) + 2) + 1.0 / (1 + epoch)


def run_to_end(search, order=None) -> list:
    """Report every epoch of every trial, trials taken round-robin (or in ``order``'s rotation); the decisions."""
    queue = collections.deque(search.active())
    decisions = []
    while queue:
        cid = queue.popleft() if order is None else order(queue)
        epoch = len(search.history(cid))
        decision = search.report(cid, epoch, loss(search.config(cid).params, epoch))
        decisions.append((cid, epoch, decision))
        queue.extend(c.id for c in decision.added)
        queue.extend(m for m in decision.budgets if m != cid)  # trials that waited at a rung, promoted now
        if search.should_continue(cid):  # at its rung a trial goes on or waits, decided in the same report
            queue.append(cid)
    return decisions


# ============================================================ the space on Optuna
def test_space_maps_onto_optuna_distributions_and_back():
    space = {"lr": loguniform(1e-4, 1e-1), "drop": quniform(0.0, 0.5, 0.1), "layers": randint(1, 4),
             "width": randint(16, 256, log=True), "shape": choice([(8,), (16, 8)]), "act": choice(["relu", "tanh"]),
             "filters": when("act", "relu", choice([8, 16])), "opt": "adam"}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        trial = study.ask()
        point = suggest(space, trial)
        params = decode(space, json.loads(json.dumps(point)))  # the point travels as JSON to the tasks
        assert encode(space, params) == point  # and back: what a study is told to try (common random numbers)
        d = trial.distributions
        assert d["lr"].log and isinstance(d["layers"], optuna.distributions.IntDistribution) and d["width"].log
        assert params["shape"] in [(8,), (16, 8)] and params["opt"] == "adam"
        assert params["drop"] in [0.0, 0.1, 0.2, 0.3, 0.4, 0.5] and 1 <= params["layers"] <= 4
        assert ("filters" in params) == (params["act"] == "relu") == ("filters" in d)
        study.tell(trial, 0.0)


def test_randint_and_when_in_the_plain_samplers():
    space = {"arch": choice(["cnn", "mlp"]), "units": when("arch", "mlp", randint(32, 256, log=True))}
    draws = [sample(space, seed) for seed in range(40)]
    assert all(("units" in d) == (d["arch"] == "mlp") for d in draws)
    assert all(32 <= d["units"] <= 256 and isinstance(d["units"], int) for d in draws if "units" in d)
    with pytest.raises(SearchSpaceError, match="conditional"):
        grid({"arch": choice(["cnn"]), "units": when("arch", "mlp", choice([1]))})
    with pytest.raises(SearchSpaceError, match="does not come before it"):
        sample({"units": when("arch", "mlp", choice([1])), "arch": choice(["mlp"])}, 0)


# ============================================================ ask and tell
def test_a_seed_reproduces_the_suggestions():
    def configs(seed, order=None, sampler="tpe"):
        search = ASHA(SPACE, max_epochs=2, eta=2, n_trials=12, max_concurrent=2, n_startup_trials=3, seed=seed,
                      sampler=sampler)
        run_to_end(search, order)
        return [c.params for c in search.configs()]

    first = configs(5)
    assert len(first) == 12 and configs(5) == first  # the same reports in the same order: the same suggestions
    assert configs(6) != first
    # Reports in another order (as under MOP): the random start-up is the same, what TPE learns may not be.
    # The first max_concurrent + n_startup_trials - 1 = 4 configurations are the start-up.
    assert configs(5, order=lambda queue: queue.pop())[:4] == first[:4]
    # Random suggestions depend on the seed and the trial's number alone, whatever the order of the reports.
    assert configs(5, sampler="random") == configs(5, order=lambda queue: queue.pop(), sampler="random")


def test_tpe_start_up_is_sized_by_the_budget_so_a_small_budget_gets_suggestions_from_tpe():
    assert [startup_trials(n, None, 4) for n in (1, 6, 9, 15, 40)] == [2, 2, 3, 5, 5]
    assert startup_trials(40, 28, 4) == 2 and startup_trials(None, 28, 4) == 2  # 7 trials of 4 epochs
    assert TPESearch(SPACE, 4, max_total_epochs=28).n_startup_trials == 2
    assert TPESearch(SPACE, 4, max_total_epochs=28, n_startup_trials=5).n_startup_trials == 5

    def configs(sampler):  # the jobs' comparison: 28 epochs, 4 per trial, 3 at once
        search = AskTellSearch(SPACE, 4, max_total_epochs=28, max_concurrent=3, seed=2, sampler=sampler)
        run_to_end(search)
        return [c.params for c in search.configs()]

    tpe, random = configs("tpe"), configs("random")
    # 3 + 2 - 1 = 4 random trials, the draws of RandomSearch of the seed (and of Hyperband's); TPE suggests the last 3.
    assert random == [c.params for c in RandomSearch(SPACE, 7, seed=2).configs()]
    assert tpe[:4] == [c.params for c in Hyperband(SPACE, 4, eta=2, seed=2).configs()][:4]
    # (With a fixed start-up of 5, all 7 would be asked before 5 ended: a random search.)
    assert len(tpe) == len(random) == 7 and tpe[:4] == random[:4]
    assert all(t != r for t, r in zip(tpe[4:], random[4:]))


def test_asha_waits_below_its_rung_and_promotes_later_without_a_barrier():
    search = ASHA(SPACE, max_epochs=4, min_epochs=1, eta=2, n_trials=6, max_concurrent=3, seed=0)
    assert [c.id for c in search.configs()] == ["c000", "c001", "c002"] and search.budget("c000") == 1
    # Alone at rung 1 a trial is not among the best half: it waits, told to the study as pruned, and its place
    # goes to a new configuration in the same decision.
    decision = search.report("c000", 0, 0.5)
    assert decision.paused == ("c000",) and not decision.stopped and [c.id for c in decision.added] == ["c003"]
    assert search.stopped("c000") and search.budget("c000") == 1
    assert search.study.trials[0].state == optuna.trial.TrialState.PRUNED
    # The best of two goes on at once, while the third has not reported.
    assert search.report("c001", 0, 0.1).budgets == {"c001": 2}
    # Three at the rung: only the best goes on; the third waits too.
    decision = search.report("c002", 0, 0.9)
    assert decision.paused == ("c002",) and [c.id for c in decision.added] == ["c004"] and not decision.budgets
    # Four at the rung: the best two are c001 and c000, which waited: the freed place promotes c000 now.
    decision = search.report("c003", 0, 0.95)
    assert decision.paused == ("c003",) and decision.budgets == {"c000": 2} and not decision.added
    assert not search.stopped("c000") and search.budget("c000") == 2 and search.should_continue("c000")
    # Alone at rung 2 it waits again: its outcome goes into the study as a new trial of the same point.
    assert search.report("c000", 1, 0.4).paused == ("c000",)
    added = [t for t in search.study.trials if t.intermediate_values == {1: 0.5, 2: 0.4}]
    assert [(t.params, t.state) for t in added] == [(search.study.trials[0].params, optuna.trial.TrialState.PRUNED)]


def test_budget_of_epochs_is_granted_rung_by_rung_and_never_exceeded():
    search = TPESearch(SPACE, max_epochs=4, pruner="asha", eta=2, max_total_epochs=25, max_concurrent=3, seed=1)
    run_to_end(search)
    trained = sum(len(search.history(c.id)) for c in search.configs())
    assert trained <= 25 and trained >= 25 - search.rungs[0]
    assert search.finished and any(search.stopped(c.id) for c in search.configs())
    assert {len(search.history(c.id)) for c in search.configs()} <= {1, 2, 4}


def test_resume_retells_the_study_into_a_fresh_search():
    def make():
        return TPESearch(SPACE, max_epochs=4, pruner="asha", eta=2, n_trials=10, max_concurrent=3, seed=2,
                         n_startup_trials=3)

    first = make()
    done = run_to_end(first)
    log = json.loads(json.dumps(first.state()))  # as progress.json keeps it
    again = make()
    again.restore(log)
    assert again.state() == first.state()
    assert [(t.params, t.state, t.intermediate_values) for t in again.study.trials] == \
        [(t.params, t.state, t.intermediate_values) for t in first.study.trials]
    # Interrupted half-way: the restored search goes on from there, and suggests what the whole run did.
    half = {"version": log["version"], "search": log["search"], "trials": log["trials"],
            "events": log["events"][:len(done) // 2]}
    resumed = make()
    resumed.restore(half)
    assert resumed.active() and len(resumed.configs()) <= len(first.configs())
    run_to_end(resumed)
    assert resumed.finished and len(resumed.configs()) == 10
    assert [c.params for c in resumed.configs()] == [c.params for c in first.configs()]
    # Each trial's sampler is seeded by the seed and the trial's number: wherever the run was interrupted, a resumed
    # random search suggests the configurations of the whole run (a shared generator would be at another draw).
    whole = ASHA(SPACE, max_epochs=4, eta=2, n_trials=10, max_concurrent=3, seed=2)
    events = run_to_end(whole)
    for cut in range(len(events)):
        again = ASHA(SPACE, max_epochs=4, eta=2, n_trials=10, max_concurrent=3, seed=2)
        again.restore({**whole.state(), "events": whole.state()["events"][:cut]})
        run_to_end(again)
        assert [c.params for c in again.configs()] == [c.params for c in whole.configs()], cut


def test_replay_follows_the_logged_decisions_whatever_the_order_of_reports():
    def make():
        return ASHA(SPACE, max_epochs=4, eta=2, n_trials=8, max_concurrent=3, seed=3, sampler="tpe",
                    n_startup_trials=3)

    first = make()
    run_to_end(first)
    replayed = make()
    replayed.follow(first.state())
    run_to_end(replayed, order=lambda queue: queue.pop())  # newest first: another order of reports
    assert {c.id: c.params for c in replayed.configs()} == {c.id: c.params for c in first.configs()}
    assert {c.id for c in replayed.configs() if replayed.stopped(c.id)} == \
        {c.id for c in first.configs() if first.stopped(c.id)}


def test_arguments_are_checked_and_optuna_is_named_when_missing(monkeypatch):
    with pytest.raises(SearchError, match="give a budget"):
        TPESearch(SPACE, max_epochs=2)
    with pytest.raises(SearchError, match="unknown pruner"):
        TPESearch(SPACE, max_epochs=2, n_trials=2, pruner="hyperband")
    with pytest.raises(SearchError, match="smaller than one trial's first rung"):
        TPESearch(SPACE, max_epochs=4, max_total_epochs=3)
    monkeypatch.setitem(sys.modules, "optuna", None)
    with pytest.raises(SearchError, match=r"pip install '\.\[search\]' in the checkout"):
        ASHA(SPACE, max_epochs=2, n_trials=2)


def test_mop_scheduler_adds_a_model_during_the_run():
    sched = MopScheduler(["a", "b"], 2, 1, seed=0)
    started = sched.start()
    assert {a.model for a in started} == {"a", "b"}
    assert sched.add("c", 1) == []  # both workers busy
    freed = started[0]
    assert [a.model for a in sched.complete(freed.worker, freed.model)] == ["c"]


# ============================================================ the driver, fake tasks over real sockets
LAYOUT = [("float32", (3,)), ("int64", ())]


class FakeSelector:
    num_workers, seed, verbose, stop_search = 2, 0, False, False

    def __init__(self, strategy: str = "mop") -> None:
        self.strategy = strategy


def _admit(config):
    return LAYOUT, [np.zeros(3, np.float32), np.zeros((), np.int64)], {"point": {}, "batch_size": 1,
                                                                      "input_shape": [3], "build_seed": 0}


def _fake_task(host, port, secret, worker, errors, seen):
    try:
        with HopperClient(host, port, secret, worker, timeout=30) as client:
            client.hello({"rows": 100, "val_rows": 10})
            cache = {}
            while True:
                work, arrays = client.next_work()
                if work["op"] != "train":
                    return
                cid = work["model"]
                seen.append((cid, worker, work["epoch"], "config" in work))
                state = cache[cid] if work["keep"] else [np.array(a) for a in arrays]
                cache[cid] = [state[0] + 1, state[1] + 1]
                v = (int(cid[1:]) % 5) / 5 + 1.0 / (2 + work["epoch"])
                client.send_result({"model": cid, "epoch": work["epoch"], "seq": work["seq"], "train": {"loss": v},
                                    "val": {"val_loss": v}, "rows": 100, "val_rows": 10, "train_s": 0.0,
                                    "val_s": 0.0}, cache[cid])
    except Exception as exc:  # surfaced by the caller
        errors.append(exc)


def _drive(search, store=None, resume=False, stop_after=None, strategy="mop"):
    ids = [c.id for c in search.configs()]
    selector = FakeSelector(strategy)
    states = {cid: [np.zeros(3, np.float32), np.zeros((), np.int64)] for cid in ids}
    run = make_search_run(selector, search, {cid: LAYOUT for cid in ids}, states, store=store, resume=resume,
                          replay=None, callbacks=(), description={"ids": ids}, admit=_admit)
    if stop_after is not None:
        hook = run.sched.on_epoch_done

        def stop(event):
            hook(event)
            if sum(len(h) for h in run.history.values()) >= stop_after:
                selector.stop_search = True

        run.sched.on_epoch_done = stop
    secret = new_secret()
    server = HopperServer(run, 2, secret, wait_s=0.5)
    host, port = server.start()
    errors, seen = [], []
    try:
        run.start()
        run.begin_attempt(0)
        threads = [threading.Thread(target=_fake_task, args=(host, port, secret, w, errors, seen)) for w in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        run.close()
        server.stop()
        run.flush_checkpoints(force=True)
    assert run.error is None and not errors, (run.error, errors)
    return run, seen


def _asha():
    return ASHA(SPACE, max_epochs=4, eta=2, max_total_epochs=20, max_concurrent=3, seed=1, sampler="tpe")


def test_driver_adds_the_configurations_the_search_asks_for_and_resumes(tmp_path):
    search = _asha()
    run, seen = _drive(search)
    ids = [c.id for c in search.configs()]
    assert len(ids) > 3 and run.sched.done
    assert sum(len(h) for h in run.history.values()) == 20  # the budget, exactly
    per_epoch = collections.Counter((cid, epoch) for cid, _, epoch, _ in seen)
    assert set(per_epoch.values()) == {2}  # every added model visits both shards every epoch
    assert {cid for cid, _, _, sent in seen if sent} == set(ids[3:])  # how to build it: to the tasks
    # Interrupted after 8 epochs, then resumed: no epoch trained twice, the same budget in all.
    first = _asha()
    _drive(first, store=CheckpointStore(tmp_path), stop_after=8)
    resumed = _asha()
    run2, seen2 = _drive(resumed, store=CheckpointStore(tmp_path), resume=True)
    assert sum(run2.resumed.values()) >= 8
    assert sum(len(h) for h in run2.history.values()) == 20
    assert not {(cid, e) for cid, _, e, _ in seen2} & {(cid, e) for cid, n in run2.resumed.items() for e in range(n)}


def test_task_parallel_runs_a_model_based_search_too():
    search = _asha()
    run, seen = _drive(search, strategy="task_parallel")
    assert sum(len(h) for h in run.history.values()) == 20 and len(search.configs()) > 3
    per_epoch = collections.Counter((cid, epoch) for cid, _, epoch, _ in seen)
    assert set(per_epoch.values()) == {1}  # a whole epoch per unit, on the worker the configuration is pinned to
    workers = collections.defaultdict(set)
    for cid, worker, _, _ in seen:
        workers[cid].add(worker)
    assert all(len(pinned) == 1 for pinned in workers.values())


# ============================================================ Spark + TensorFlow: TPE with ASHA on the shared cluster
def _digits_mlp(params: dict):
    import keras

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(params["units"], activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(params["lr"]), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_tpe_with_asha_stops_a_trial_early_and_its_place_takes_a_new_one(digits, tmp_path):
    train, val = digits

    def make():
        return TPESearch({"lr": choice([3e-2, 1e-7]), "units": 16}, max_epochs=2, pruner="asha", eta=2,
                         n_trials=5, max_concurrent=2, n_startup_trials=5, seed=7, batch_size=64,
                         metric="val_accuracy")

    # Seed 7's first three (random start-up) suggestions are a useless, a good and a useless learning rate: whatever
    # the order of the reports, one useless trial is below its rung. Only the learning rate varies, so each task
    # builds and traces one Keras model for all the trials
    # (trainer.runtime.search_worker.search_task.compiled_signature).
    search = make()
    result = ModelSelector(_digits_mlp, search, num_workers=2, seed=0, verbose=False).fit(train, validation=val)
    board = result.leaderboard.set_index("config_id")
    assert len(result.configs) == 5 and board["stopped"].any()
    # What the seed promises under MOP: it fixes the start-up suggestions (here all five), whatever the timing.
    alone = make()
    run_to_end(alone, order=lambda queue: queue.pop())
    assert [c.params for c in result.configs] == [c.params for c in alone.configs()]
    # Promotion without a barrier: a trial trains past the first rung before the last one has reached it.
    first_rung_end = max(u["end"] for u in result.units if u["epoch"] == 0)
    assert min(u["start"] for u in result.units if u["epoch"] == 1) < first_rung_end
    assert board.loc[result.best_config.id, "param_lr"] == 3e-2 and result.best_value > 0.8
    # A useless trial waits at its rung for good, and its place goes to a new configuration in the same decision.
    waits = [e for e in result.search_log["events"] if e[6] == [e[0]] and e[5] and board.loc[e[0], "stopped"]]
    assert waits, result.search_log["events"]
    stopped, added = waits[0][0], waits[0][5]
    end = max(u["end"] for u in result.units if u["model"] == stopped)
    firsts = [u for u in result.units if u["model"] == added[0] and u["epoch"] == 0]
    assert len(firsts) == 2 and min(u["start"] for u in firsts) >= end - 1e-6
    assert board.loc[stopped, "epochs_done"] == 1
    # the same result files as the other searches, with the search's log
    paths = result.save(tmp_path)
    assert json.loads(paths["json"].read_text())["search_log"]["search"] == "TPESearch"


class StopAfterEpochs(SelectionCallback):
    """Stop the search after ``epochs`` reported epochs (an interruption)."""

    def __init__(self, epochs: int) -> None:
        self.epochs, self.seen = epochs, 0

    def on_epoch_end(self, config_id, epoch, logs):
        self.seen += 1
        if self.seen >= self.epochs:
            self.selector.stop_search = True


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_a_tpe_study_resumes_where_it_stopped_and_its_seed_reproduces_it(digits, tmp_path):
    train, val = digits

    def select(checkpoint_dir=None):
        # Sequential: one trial at a time, so the reports come in one order and TPE learns the same things.
        search = TPESearch({"lr": loguniform(1e-4, 1e-1), "units": 16}, max_epochs=1, n_trials=4, max_concurrent=1,
                           n_startup_trials=1, seed=3, batch_size=64)
        return search, ModelSelector(_digits_mlp, search, strategy="sequential", num_workers=1, seed=0,
                                     verbose=False, checkpoint_dir=checkpoint_dir)

    whole_search, selector = select()
    whole = selector.fit(train, validation=val)
    stopped_search, selector = select(tmp_path)
    stopped = selector.fit(train, validation=val, callbacks=[StopAfterEpochs(2)])
    assert stopped.interrupted and [len(h) for h in stopped.history.values()][:2] == [1, 1]
    resumed_search, selector = select(tmp_path)
    resumed = selector.fit(train, validation=val, resume=True)
    assert not resumed.interrupted and resumed.resumed_epochs == {"c000": 1, "c001": 1}
    assert {u["model"] for u in resumed.units} == {"c002", "c003"}  # the completed trials are not trained again
    # The study goes on: its first trials, with their values, are the interrupted run's.
    kept = [(t.params, t.state, t.value) for t in stopped_search.study.trials[:2]]
    assert [(t.params, t.state, t.value) for t in resumed_search.study.trials[:2]] == kept
    assert len(resumed_search.study.trials) == 4 and all(t.value is not None for t in resumed_search.study.trials)
    # The same seed suggests the same configurations, TPE's included (c001 on), across the interruption too.
    assert [c.params for c in resumed.configs] == [c.params for c in whole.configs]
    assert [t.value for t in whole_search.study.trials] == pytest.approx(
        [t.value for t in resumed_search.study.trials], rel=1e-5)
