"""Model selection runner: driver logic with fake tasks, then real Spark + TensorFlow runs.

The first half drives the real driver-side run (`_Run`, `HopperServer`) with
fake tasks over real sockets: every unit adds 1 to each state array, so the
final state of a model counts the units it went through and checks the state
hand-over (including the "keep" shortcut and checkpoints) without Keras.
The second half (marked ``spark``) runs tiny searches on the shared
2-worker LocalCluster and one end-to-end run of ``jobs/select_mnist.py``.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import keras
import numpy as np
import pytest

from trainer.transport.wire import new_secret
from trainer.selection import (
    CheckpointError, GridSearch, ModelSelector, SelectionCallback, SelectionError, SuccessiveHalving,
    TaskParallelScheduler, choice,
)
from trainer.selection.engine.search_checkpoints import CheckpointStore
from trainer.selection.engine.hopper import HopperClient, HopperServer
from trainer.selection.engine.search_run import make_search_run
from trainer.runtime.search_worker.search_task import canonical_order

REPO = Path(__file__).resolve().parents[1]


# =========================================================================== fakes
class FakeSelector:
    """What `make_search_run` needs from a ModelSelector."""

    def __init__(self, strategy: str = "mop", num_workers: int = 2, seed: int = 0) -> None:
        self.strategy, self.num_workers, self.seed = strategy, num_workers, seed
        self.verbose = False
        self.stop_search = False


LAYOUT = [("float32", (3,)), ("int64", ())]


def fake_value(cid: str, epoch: int) -> float:
    """A made-up validation loss: lower for higher config numbers, falling with epochs."""
    return 1.0 / (1 + int(cid[1:])) + 1.0 / (2 + epoch)


def fake_task(host, port, secret, worker, rows, errors):
    try:
        with HopperClient(host, port, secret, worker, timeout=30) as client:
            client.hello({"rows": rows, "val_rows": 10})
            cache = {}
            while True:
                work, arrays = client.next_work()
                if work["op"] != "train":
                    return
                cid = work["model"]
                state = cache[cid] if work["keep"] else [np.array(a) for a in arrays]
                new = [state[0] + 1, state[1] + 1]
                cache[cid] = new
                v = fake_value(cid, work["epoch"])
                client.send_result({"model": cid, "epoch": work["epoch"], "seq": work["seq"], "train": {"loss": v},
                                    "val": {"val_loss": v, "val_accuracy": 1 - v}, "rows": rows, "val_rows": 10,
                                    "train_s": 0.0, "val_s": 0.0}, new)
    except Exception as exc:  # surfaced by drive()
        errors.append(exc)


def drive(search, selector, *, store=None, resume=False, replay=None, callbacks=()):
    ids = [c.id for c in search.configs()]
    states = {cid: [np.zeros(3, np.float32), np.zeros((), np.int64)] for cid in ids}
    run = make_search_run(selector, search, {cid: LAYOUT for cid in ids}, states, store=store, resume=resume,
                          replay=replay, callbacks=callbacks, description={"ids": ids, "strategy": selector.strategy})
    for cb in callbacks:
        cb.selector = selector
    secret = new_secret()
    server = HopperServer(run, selector.num_workers, secret, wait_s=0.5)
    host, port = server.start()
    errors: list[Exception] = []
    try:
        run.start()
        run.begin_attempt(0)
        threads = [threading.Thread(target=fake_task, args=(host, port, secret, w, 100 + w, errors))
                   for w in range(selector.num_workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "fake tasks hung"
    finally:
        run.close()
        server.stop()
        run.flush_checkpoints(force=True)
    if run.error is not None:
        raise run.error
    assert not errors, errors
    return run


def units_per_pair(units):
    return collections.Counter((u["model"], u["worker"], u["epoch"]) for u in units)


class StopAfterEpochs(SelectionCallback):
    """Stop the search once every configuration completed `epochs` epochs."""

    def __init__(self, configs: int, epochs: int = 1) -> None:
        self.configs, self.epochs, self.done = configs, epochs, set()

    def on_epoch_end(self, config_id, epoch, logs):
        if epoch + 1 >= self.epochs:
            self.done.add(config_id)
        if len(self.done) >= self.configs:
            self.selector.stop_search = True


# ================================================================ driver logic, fake tasks
def test_fake_mop_grid_every_pair_once_and_state_continuity():
    search = GridSearch({"x": choice([1, 2, 3, 4, 5])}, epochs=3, metric="val_loss")
    run = drive(search, FakeSelector("mop", num_workers=3))
    ids = [c.id for c in search.configs()]
    assert run.finished
    assert units_per_pair(run.units) == {k: 1 for k in itertools.product(ids, range(3), range(3))}
    for cid in ids:  # 3 epochs x 3 shards, each unit adds 1
        assert run.states[cid][0].tolist() == [9.0] * 3 and int(run.states[cid][1]) == 9
        assert [r["value"] for r in run.history[cid]] == pytest.approx([fake_value(cid, e) for e in range(3)])
    for worker in range(3):  # one model per worker at a time
        spans = sorted((u["start"], u["end"]) for u in run.units if u["worker"] == worker)
        assert all(a[1] <= b[0] + 1e-6 for a, b in zip(spans, spans[1:]))
    assert search.best()[0] == "c004"  # lowest loss


def test_fake_successive_halving_drops_and_extends():
    base = GridSearch({"x": choice(list(range(6)))}, metric="val_loss")
    search = SuccessiveHalving(base, min_epochs=1, max_epochs=3, eta=3, metric="val_loss")
    run = drive(search, FakeSelector("mop", num_workers=2))
    epochs = {cid: len(h) for cid, h in run.history.items()}
    assert sorted(epochs.values()) == [1, 1, 1, 1, 3, 3]
    assert {cid for cid, e in epochs.items() if e == 3} == {"c004", "c005"}  # the two lowest losses go on
    assert units_per_pair(run.units) == {
        (cid, w, e): 1 for cid, n in epochs.items() for w in range(2) for e in range(n)
    }
    assert all(run.states[cid][0][0] == 2 * n for cid, n in epochs.items())


def test_fake_task_parallel_pins_models_and_keeps_state_on_the_worker():
    search = GridSearch({"x": choice([1, 2, 3])}, epochs=3, metric="val_loss")
    run = drive(search, FakeSelector("task_parallel", num_workers=2))
    for cid in ["c000", "c001", "c002"]:
        mine = [u for u in run.units if u["model"] == cid]
        assert len(mine) == 3 and len({u["worker"] for u in mine}) == 1
        assert [u["sent_state"] for u in sorted(mine, key=lambda u: u["epoch"])] == [True, False, False]
        assert run.states[cid][0][0] == 3  # one unit = one whole epoch


def test_task_parallel_scheduler_sequential_order():
    sched = TaskParallelScheduler(["a", "b"], num_workers=1, epochs=2)
    order = []
    pending = sched.start()
    while pending:
        a = pending.pop(0)
        order.append((a.model, a.epoch))
        pending += sched.complete(a.worker, a.model)
    assert order == [("a", 0), ("a", 1), ("b", 0), ("b", 1)] and sched.done


def test_fake_resume_continues_without_redoing_epochs(tmp_path):
    def make():
        return GridSearch({"x": choice([1, 2, 3, 4])}, epochs=3, metric="val_loss")

    first = drive(make(), FakeSelector(), store=CheckpointStore(tmp_path), callbacks=[StopAfterEpochs(4, 1)])
    assert not first.finished
    done = {cid: len(h) for cid, h in first.history.items()}
    assert min(done.values()) >= 1
    with pytest.raises(CheckpointError, match="resume=True"):
        drive(make(), FakeSelector(), store=CheckpointStore(tmp_path))
    second = drive(make(), FakeSelector(), store=CheckpointStore(tmp_path), resume=True)
    assert second.finished and second.resumed == done
    assert all(u["epoch"] >= done[u["model"]] for u in second.units)
    expected = {(cid, w, e): 1 for cid, n in done.items() for w in range(2) for e in range(n, 3)}
    assert units_per_pair(second.units) == expected
    for cid in done:  # state went through the checkpoint: still one +1 per unit overall
        assert second.states[cid][0].tolist() == [6.0] * 3
        assert [r["epoch"] for r in second.history[cid]] == [0, 1, 2]
    with pytest.raises(CheckpointError, match="differs"):
        drive(GridSearch({"x": choice([1, 2])}, epochs=3, metric="val_loss"), FakeSelector(),
              store=CheckpointStore(tmp_path), resume=True)


def test_fake_replay_reproduces_the_schedule():
    def make():
        return GridSearch({"x": choice([1, 2, 3, 4, 5])}, epochs=2, metric="val_loss")

    first = drive(make(), FakeSelector(seed=3, num_workers=3))
    again = drive(make(), FakeSelector(seed=3, num_workers=3), replay=list(first.sched.schedule))
    assert again.sched.schedule == first.sched.schedule


def test_canonical_order_ignores_the_order_spark_delivers():
    rng = np.random.default_rng(0)
    x = rng.random((300, 8), dtype=np.float32)
    y = rng.integers(0, 3, 300).astype(np.float32)
    x[7], y[7] = x[3], y[3]  # a duplicated row
    a = canonical_order(x, y)
    perm = rng.permutation(300)
    b = canonical_order(x[perm], y[perm])
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert sorted(map(tuple, a[0].tolist())) == sorted(map(tuple, x.tolist()))


def test_selector_arguments_are_checked():
    search = GridSearch({"x": choice([1])}, metric="val_loss")
    with pytest.raises(SelectionError, match="Unknown strategy 'hogwild'"):
        ModelSelector(lambda p: None, search, strategy="hogwild")
    with pytest.raises(SelectionError, match="num_workers=1"):
        ModelSelector(lambda p: None, search, strategy="sequential", num_workers=2)
    with pytest.raises(SelectionError, match="model_fn"):
        ModelSelector("model.keras", search)
    with pytest.raises(SelectionError, match="Search"):
        ModelSelector(lambda p: None, {"x": 1})


# ============================================================== Spark + TensorFlow
SPACE = {"units": choice([8, 32]), "lr": choice([1e-3, 3e-2])}


def digits_model(params: dict) -> keras.Model:
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(params["units"], activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(optimizer=keras.optimizers.Adam(params["lr"]), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def digits_search(metric: str) -> GridSearch:
    return GridSearch(SPACE, epochs=2, batch_size=64, metric=metric)


@pytest.fixture(scope="module")
def digits(spark):
    from trainer_jobs.support.datasets import digits_dataframe

    train, val = digits_dataframe(spark).randomSplit([0.8, 0.2], seed=1)
    return train.cache(), val.cache()


@pytest.fixture(scope="module")
def accuracy_run(digits):
    train, val = digits
    return ModelSelector(digits_model, digits_search("val_accuracy"), num_workers=2, seed=7,
                         verbose=False).fit(train, validation=val)


@pytest.mark.spark
@pytest.mark.core
@pytest.mark.backend
@pytest.mark.timeout(900)
def test_every_model_trains_every_shard_once_per_epoch(accuracy_run):
    ids = [c.id for c in accuracy_run.configs]
    expected = {k: 1 for k in itertools.product(ids, range(2), range(2))}
    assert units_per_pair(accuracy_run.units) == expected
    assert collections.Counter((s.model, s.worker, s.epoch) for s in accuracy_run.schedule) == expected
    for key in ("worker", "model"):  # one model per worker, and a model on one worker, at a time
        for value in {u[key] for u in accuracy_run.units}:
            spans = sorted((u["start"], u["end"]) for u in accuracy_run.units if u[key] == value)
            assert all(a[1] <= b[0] + 1e-6 for a, b in zip(spans, spans[1:])), (key, value, spans)
    tasks = accuracy_run.tasks
    assert [t["worker"] for t in tasks] == [0, 1]
    assert all(set(t["builds"]) == set(ids) for t in tasks)  # each model built once per task, then cached
    assert sum(t["rows"] + t["val_rows"] for t in tasks) == 1797


@pytest.mark.spark
@pytest.mark.core
@pytest.mark.timeout(900)
def test_leaderboard_and_best_model_for_accuracy(accuracy_run, digits, tmp_path):
    board = accuracy_run.leaderboard
    assert len(board) == 4 and list(board["epochs_done"]) == [2] * 4
    assert list(board["rank"]) == [1, 2, 3, 4]
    assert board["final_metric"].is_monotonic_decreasing  # accuracy: higher is better
    assert accuracy_run.best_config.id == board.iloc[0]["config_id"]
    assert accuracy_run.best_value == pytest.approx(board["final_metric"].max())
    by_loss = accuracy_run.ranked("val_loss")
    assert by_loss["final_metric"].is_monotonic_increasing  # loss: lower is better
    metrics = accuracy_run.best_model.evaluate(digits[1])
    assert set(metrics) >= {"loss", "accuracy"} and metrics["accuracy"] > 0.5
    paths = accuracy_run.save(tmp_path)
    for key in ("gantt", "curves"):
        assert paths[key].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(list((tmp_path / "curves").glob("c*.png"))) == 4
    assert len(paths["leaderboard"].read_text().strip().splitlines()) == 5
    saved = json.loads(paths["json"].read_text())
    assert len(saved["schedule"]) == 16 and saved["metric"] == {"name": "val_accuracy", "mode": "max"}


@pytest.mark.spark
@pytest.mark.timeout(1200)
def test_replay_interrupt_and_resume_with_loss(accuracy_run, digits, tmp_path):
    train, val = digits
    recorded = accuracy_run.schedule
    # Same seed, replayed schedule, selected on loss, stopped once every model finished epoch 1.
    stopped = ModelSelector(digits_model, digits_search("val_loss"), num_workers=2, seed=7, verbose=False,
                            checkpoint_dir=tmp_path).fit(train, validation=val, replay=accuracy_run,
                                                         callbacks=[StopAfterEpochs(4, 1)])
    assert stopped.interrupted
    assert stopped.schedule == recorded[: len(stopped.schedule)]
    done = {cid: len(h) for cid, h in stopped.history.items()}
    assert min(done.values()) >= 1 and len(list((tmp_path / "models").glob("*.npz"))) == 4
    # Same shards in the same row order, same seeds, same schedule: the same epoch-1 metrics.
    assert [t["data_checksum"] for t in stopped.tasks] == [t["data_checksum"] for t in accuracy_run.tasks]
    for cid in done:
        assert stopped.history[cid][0]["val"]["val_loss"] == pytest.approx(
            accuracy_run.history[cid][0]["val"]["val_loss"], rel=1e-5)

    resumed = ModelSelector(digits_model, digits_search("val_loss"), num_workers=2, seed=7, verbose=False,
                            checkpoint_dir=tmp_path).fit(train, validation=val, resume=True, replay=recorded)
    assert not resumed.interrupted and resumed.resumed_epochs == done
    assert resumed.schedule == recorded  # replay: same seed, same schedule
    assert all(u["epoch"] >= done[u["model"]] for u in resumed.units)  # completed epochs are not redone
    assert units_per_pair(resumed.units) == {(cid, w, e): 1 for cid, n in done.items() for w in range(2)
                                             for e in range(n, 2)}
    board = resumed.leaderboard
    assert list(board["epochs_done"]) == [2] * 4
    assert board["final_metric"].is_monotonic_increasing  # loss: lower is better
    assert resumed.best_value == pytest.approx(board["final_metric"].min())
    assert resumed.best_config.id == board.iloc[0]["config_id"]
    for cid in done:  # checkpointed weights AND optimizer state: the resumed run ends where the whole one did
        assert resumed.history[cid][-1]["val"]["val_loss"] == pytest.approx(
            accuracy_run.history[cid][-1]["val"]["val_loss"], rel=1e-5)


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_select_mnist_job_end_to_end(drivers_cluster, tmp_path):
    """The job script in its own process (the tests' SparkContext is taken), on the session's drivers cluster."""
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(REPO), TRAINER_DATA_DIR=str(tmp_path / "data"))
    proc = subprocess.run(
        [sys.executable, str(REPO / "jobs" / "select_mnist.py"), "--limit", "300", "--max-configs", "2",
         "--epochs", "1", "--workers", "2", "--master", drivers_cluster.master_url, "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    rows = {r["mode"]: r for r in json.loads((out / "select_mnist.json").read_text())["rows"]}
    assert set(rows) == {"mop", "task_parallel", "sequential"}
    assert rows["sequential"]["workers"] == 1 and rows["sequential"]["vs_ideal"] == pytest.approx(2.0)
    assert rows["task_parallel"]["data_copies"] == pytest.approx(2.0, rel=0.01)  # N full copies vs data once
    assert rows["task_parallel"]["vs_task_parallel"] == pytest.approx(1.0)
    assert rows["sequential"]["max_config_gap"] == 0.0
    assert 0.0 <= rows["mop"]["max_config_gap"] <= 1.0  # accuracies of the same configs
    assert all(0.0 <= r["test_accuracy"] <= 1.0 for r in rows.values())
    assert "| test_accuracy |" in proc.stdout and "sequential: " in proc.stdout
    for name in ("select_mnist.csv", "select_mnist.md", "select_mnist_configs.csv", "select_mnist_gantt.png",
                 "mop/gantt.png", "mop/leaderboard.csv", "task_parallel/gantt.png", "sequential/gantt.png"):
        assert (out / name).is_file(), name


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_select_forecast_job_end_to_end(drivers_cluster, tmp_path):
    """The forecasting selection job on a short series: its best model gets a test MAPE in the series' units. The
    model hopper only: the three strategies are the jobs' shared code (jobs/support/selection.py), run each by
    `test_select_mnist_job_end_to_end`; what is the forecasting job's own is its data and its metric."""
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(REPO / "jobs" / "select_forecast.py"), "--limit", "1200", "--val-hours", "200",
         "--max-configs", "2", "--epochs", "1", "--workers", "2", "--strategies", "mop",
         "--master", drivers_cluster.master_url, "--out", str(out)],
        cwd=REPO, env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"),
                                                                              str(REPO)])),
                           TRAINER_DATA_DIR=str(tmp_path / "data")),
        capture_output=True, text=True, timeout=1400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    rows = {r["mode"]: r for r in json.loads((out / "select_forecast.json").read_text())["rows"]}
    assert set(rows) == {"mop"}
    assert all(r["metric_name"] == "val_loss" and 0 < r["test_mape"] < 100 for r in rows.values()), rows
    configs = json.loads((out / "select_forecast_configs.json").read_text())["rows"]
    assert len(configs) == 2  # 2 configurations, one strategy
    assert (out / "select_forecast_gantt.png").stat().st_size > 0
