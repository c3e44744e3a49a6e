"""Elastic searches (``ModelSelector(num_workers=(min, max))``): chunks served by tasks that come and go.

The Spark test runs one search in a driver process of its own (tests/elastic_search_driver.py: its own cluster, with
Spark's dynamic allocation on): a worker daemon added while it trains is used, one of the first two killed as its
task starts a unit is noticed at once and that unit is trained again elsewhere, and every model trains every chunk
once per epoch (the search stops once every model ended two epochs after the kill). The rest needs no Spark: the
scheduler under any order of serves, leaves and completions, and the driver's rules for a task that takes a chunk
over, is re-run by Spark, is lost with its executor, or finds its chunk needed by nobody.
"""

from __future__ import annotations

import collections
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from test_selection_runner import LAYOUT, FakeSelector
from trainer.selection import GridSearch, ModelSelector, SelectionError, choice
from trainer.selection.engine.elastic_placement import ElasticMopScheduler
from trainer.selection.engine.hopper import HopperRejected
from trainer.selection.engine.placement import ScheduleError
from trainer.selection.engine.search_checkpoints import CheckpointStore
from trainer.selection.engine.search_run import make_search_run

DRIVER = Path(__file__).with_name("elastic_search_driver.py")


def test_only_served_chunks_take_units_and_a_left_unit_goes_back_to_its_model():
    sched = ElasticMopScheduler(["a", "b"], 3, epochs=1, seed=0)
    assert sched.start() == []  # nobody serves a chunk yet
    (first,) = sched.serve(0)
    assert first.worker == 0 and sched.running == {0: first.model}
    other = "b" if first.model == "a" else "a"
    (second,) = sched.serve(1)
    assert second == (other, 1, 0)
    assert sched.leave(1) == []  # `other` is free again, but it trained no shard and the others are not served
    assert sched.needs(1) and sched.running == {0: first.model}
    with pytest.raises(ScheduleError):
        sched.complete(1, other)  # the unit that left is not running any more
    (again,) = sched.serve(1)
    assert again == (other, 1, 0)  # issued again: the model still needs that chunk in its epoch
    assert len(sched.schedule) == 3
    with pytest.raises(ScheduleError, match="does not replay"):
        ElasticMopScheduler(["a"], 2).replay([])


@pytest.mark.parametrize("seed", range(12))
def test_every_model_trains_every_chunk_once_per_epoch_whatever_serves_and_leaves(seed):
    rng = random.Random(seed)
    chunks, budgets = rng.randint(1, 4), {f"m{i}": rng.randint(1, 3) for i in range(rng.randint(1, 5))}
    sched = ElasticMopScheduler(list(budgets), chunks, epochs=budgets, seed=seed)
    sched.start()
    trained: collections.Counter = collections.Counter()
    for step in range(10_000):
        if sched.done:
            break
        running = sched.running
        roll = rng.random()
        if running and roll < 0.6:
            shard, model = rng.choice(sorted(running.items()))
            trained[(model, sched.epoch(model), shard)] += 1
            out = sched.complete(shard, model)
        elif roll < 0.85 or not sched.served:
            out = sched.serve(rng.randrange(chunks))
        else:
            out = sched.leave(rng.choice(sorted(sched.served)))  # its unit, if any, was not trained
        for a in out:
            assert a.worker in sched.served and a.epoch == sched.epoch(a.model)
    assert sched.done, f"stuck after {step} events"
    expected = {(m, e, c) for m, b in budgets.items() for e in range(b) for c in range(chunks)}
    assert trained == {k: 1 for k in expected}


def _run(num_chunks: int = 2, configs: int = 1, epochs: int = 1, store=None, resume: bool = False):
    search = GridSearch({"x": choice(list(range(configs)))}, epochs=epochs, metric="loss")
    ids = [c.id for c in search.configs()]
    states = {cid: [np.zeros(3, np.float32), np.zeros((), np.int64)] for cid in ids}
    run = make_search_run(FakeSelector("mop", num_workers=num_chunks), search, {cid: LAYOUT for cid in ids}, states,
                          store=store, resume=resume, replay=None, callbacks=(), description={"ids": ids},
                          elastic=True)
    run.start()
    return run


def _hello(run, chunk: int, task: int, round_: int, process: str = "") -> dict:
    return run.hello(chunk, task, {"rows": 10, "val_rows": 0, "round": round_, "process": process or f"p{task}"})


def _commit(run, chunk: int, task: int, work: dict) -> None:
    run.result(chunk, task, {"model": work["model"], "epoch": work["epoch"], "seq": work["seq"],
                             "train": {"loss": 1.0}, "rows": 10}, [np.ones(3, np.float32), np.ones((), np.int64)])


def test_a_later_round_takes_a_chunk_over_once_the_unit_in_flight_is_committed_and_a_stale_task_stops():
    run = _run()
    assert _hello(run, 0, 10, 0) == {}
    work, arrays = run.next_work(0, 10, 0.01)
    assert work["op"] == "train" and not work["keep"] and len(arrays) == 2
    assert _hello(run, 0, 11, 1) == {}  # the next round's task for the same chunk
    assert run.next_work(0, 11, 0.01)[0] == {"op": "wait"}  # the unit is still on task 10
    _commit(run, 0, 10, work)  # committed by the task it was handed to
    assert run.next_work(0, 10, 0.01)[0] == {"op": "stop"}  # task 10 no longer holds the chunk
    assert _hello(run, 0, 9, 0) == {"stop": True}  # an older round's task: the chunk is held by a later one
    assert run.next_work(0, 11, 0.01)[0] == {"op": "stop"}  # the model trained chunk 0: nobody needs it
    assert [e["event"] for e in run.events] == ["served", "took over", "ended"]
    assert run.may_start_round(1) is False  # chunk 1 is needed but its task of round 1 has not come yet
    assert _hello(run, 1, 12, 0, process="p10") == {}  # in the process of task 10, which trained the model last
    work, arrays = run.next_work(1, 12, 0.01)
    assert work["keep"] is True and arrays == ()  # the process holds the state: none is sent
    _commit(run, 1, 12, work)
    assert run.finished and [len(h) for h in run.history.values()] == [1]


def test_a_lost_task_s_unit_is_trained_again_and_a_spark_retry_fences_the_silent_attempt():
    run = _run(epochs=2)
    _hello(run, 1, 20, 0)
    work, _ = run.next_work(1, 20, 0.01)
    run.lost(1, 20)  # its executor died: the connection dropped
    (lost,) = [e for e in run.events if e["event"] == "lost"]
    assert lost["returned"] == work["model"] and lost["chunk"] == 1
    assert run.may_start_round(0)  # chunk 1 is needed, served by nobody, its round-0 task came and went
    _hello(run, 1, 21, 0)  # Spark's retry of the same task
    again, _ = run.next_work(1, 21, 0.01)
    assert (again["model"], again["epoch"]) == (work["model"], work["epoch"]) and again["seq"] != work["seq"]
    _hello(run, 1, 22, 0)  # a later attempt of the same task while 21 went silent: 21 is gone
    with pytest.raises(HopperRejected):
        _commit(run, 1, 21, again)
    taken, _ = run.next_work(1, 22, 0.01)
    assert taken["seq"] == again["seq"]  # the same unit, handed to the live attempt
    _commit(run, 1, 22, taken)
    assert sum(u["worker"] == 1 for u in run.units) == 1  # committed once
    assert run.next_work(1, 22, 0.01)[0] == {"op": "stop"}  # the model trained chunk 1 this epoch: it needs 0


def test_an_elastic_search_needs_the_model_hopper_and_cannot_replay():
    search = GridSearch({"x": choice([1, 2])}, epochs=1, metric="loss")
    with pytest.raises(SelectionError, match="needs strategy='mop'"):
        ModelSelector(lambda p: None, search, strategy="task_parallel", num_workers=(1, 2))
    selector = ModelSelector(lambda p: None, search, num_workers=(1, 3))
    assert selector.num_workers == 3 and selector.options.elastic == (1, 3)
    with pytest.raises(SelectionError, match="fixed num_workers"):
        selector._check_fit_args(resume=False, replay=[])


@pytest.mark.spark
@pytest.mark.timeout(400)
def test_an_elastic_search_uses_a_worker_that_joins_and_trains_a_lost_worker_s_unit_elsewhere(tmp_path):
    out = tmp_path / "search.json"
    run = subprocess.run([sys.executable, str(DRIVER), str(out)], capture_output=True, text=True, timeout=360,
                         cwd=DRIVER.parent.parent)
    assert run.returncode == 0 and out.is_file(), run.stdout[-3000:] + run.stderr[-3000:]
    found = json.loads(out.read_text())
    disturbed, events, units = found["disturbed"], found["membership"], found["units"]
    assert set(disturbed) == {"added", "killed"} and found["best"]  # stopped two epochs after the kill
    by_pair = collections.defaultdict(list)
    for u in units:
        by_pair[(u["model"], u["epoch"])].append(u["worker"])
    assert all(len(c) == len(set(c)) for c in by_pair.values())  # no chunk twice in a model's epoch
    for model, epochs in found["history"].items():  # each ended epoch: every chunk once
        assert epochs and all(sorted(by_pair[(model, e["epoch"])]) == [0, 1, 2] for e in epochs)
        assert [e["epoch"] for e in epochs] == list(range(len(epochs)))
    served = [e for e in events if e["event"] in ("served", "took over")]
    before = {e["process"] for e in served if e["time"] < disturbed["added"]}
    joiners = {u["process"] for u in units} - before
    assert joiners, "the worker that joined trained nothing"
    (lost,) = [e for e in events if e["event"] == "lost"]
    assert 0 <= lost["time"] - disturbed["killed"] < 5  # noticed at once: its connection dropped
    if lost["returned"] is not None:  # its unit in flight was trained by another task
        again = [u for u in units if u["model"] == lost["returned"] and u["worker"] == lost["chunk"]
                 and u["process"] != lost["process"]]
        assert again
    assert len({e["process"] for e in served}) >= 3


def test_a_task_on_a_decommissioned_executor_ends_after_its_unit_and_its_chunk_goes_to_the_next_round():
    run = _run(configs=2)
    run.hello(0, 40, {"rows": 10, "val_rows": 0, "round": 0, "process": "p40", "executor": "7"})
    work, _ = run.next_work(0, 40, 0.01)
    run.retire({"7"})  # Spark decommissions executor 7: the unit in flight is committed, not lost
    _commit(run, 0, 40, work)
    assert run.next_work(0, 40, 0.01)[0] == {"op": "stop"}  # the other model still needs chunk 0, elsewhere
    assert [e["event"] for e in run.events] == ["served", "retired"] and run.may_start_round(0)
    assert len(run.units) == 1


def test_an_interrupted_elastic_search_resumes_from_its_checkpoints_without_training_an_epoch_again(tmp_path):
    first = _run(epochs=2, store=CheckpointStore(tmp_path))
    for task, chunk in ((50, 0), (51, 1)):  # epoch 0 on both chunks, then the search is interrupted
        _hello(first, chunk, task, 0)
        work, _ = first.next_work(chunk, task, 0.01)
        assert work["epoch"] == 0
        _commit(first, chunk, task, work)
    first.close()
    first.finish_checkpoints()
    again = _run(epochs=2, store=CheckpointStore(tmp_path), resume=True)
    assert again.resumed == {"c000": 1} and not again.finished
    _hello(again, 1, 60, 0)
    work, arrays = again.next_work(1, 60, 0.01)
    assert work["epoch"] == 1 and [a.tolist() for a in arrays] == [[1.0, 1.0, 1.0], 1]  # the checkpoint, not zeros
