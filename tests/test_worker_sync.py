"""The worker's Keras callback (trainer.runtime.ps_worker.exchange): its parts alone, and against a real
parameter server, without Spark.

The callback is driven by hand, exchange by exchange, so that another
client's commits land exactly between them: the staleness the server records
for the worker must count every commit its weights have not seen, also those
before its last reply (a commit in flight with `overlap`, a validation pull).
"""

from __future__ import annotations

import numpy as np
import pytest

from trainer.algorithms import DynSGD
from trainer.ps import ParameterServer, PSClient
from trainer.transport.wire import new_secret

SECRET = new_secret()


def tiny_model():
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def _record() -> dict:
    return {"epochs": [], "commits": 0, "comm_s": 0.0, "rows": 8,
            "exchange_s": {"state": 0.0, "payload": 0.0, "round_trip": 0.0, "load": 0.0}}


def _alone(budget=None, algorithm=None):
    """The callback on a model, with no server: its parts that need none."""
    from trainer.runtime.ps_worker.exchange import make_sync_callback

    callback = make_sync_callback(None, algorithm or DynSGD(window=4), 3, _record(), budget)
    callback.set_model(tiny_model())
    callback.start_epoch(2)
    return callback


def test_a_commit_says_who_when_its_loss_and_with_shared_epochs_its_batches():
    callback = _alone()
    callback.step, callback.since = 7, 4
    assert callback.commit_meta({"loss": 0.25}) == {"worker": 3, "epoch": 2, "step": 7, "loss": 0.25}
    shared = _alone(budget=100)
    shared.since = 4
    assert shared.commit_meta({"loss": 1.0})["batches"] == 4
    assert shared.commit_meta(None)["loss"] == 0.0  # no logs: the running loss of Keras's tracker (no batch yet)


def test_each_exchange_is_booked_with_its_parts():
    callback = _alone()
    callback.book(0.5, {"state": 0.1, "payload": 0.1, "round_trip": 0.2, "load": 0.1})
    callback.book(0.25, {"state": 0.0, "payload": 0.05, "round_trip": 0.2, "load": 0.0})
    assert callback.record["commits"] == 2 and callback.record["comm_s"] == 0.75
    assert callback.record["exchange_s"] == pytest.approx({"state": 0.1, "payload": 0.15, "round_trip": 0.4,
                                                           "load": 0.1})


def test_the_servers_directives_set_the_rate_and_stop_and_a_shared_epoch_ends_at_its_budget():
    callback = _alone(budget=100)
    callback.follow({"learning_rate": 0.05})
    assert float(callback.model.optimizer.learning_rate) == pytest.approx(0.05) and not callback.stopped
    callback.check_epoch_over({"epoch_batches": 99})
    assert not callback.epoch_over
    callback.check_epoch_over({"epoch_batches": 100})
    assert callback.epoch_over and callback.model.stop_training
    callback.follow({"stop": True})
    assert callback.stopped


def test_a_commit_names_the_versions_its_base_has_not_seen_except_under_a_synchronous_algorithm():
    from trainer.algorithms import SyncAveraging

    callback = _alone()
    callback.seen_version, callback.base_version = 9, 6
    meta = {}
    callback.note_unseen(meta, in_flight=True)
    assert meta == {"unseen": 2}  # the reply in flight counted one of the three
    synchronous = _alone(algorithm=SyncAveraging(every=4))
    synchronous.seen_version, meta = 9, {}
    synchronous.note_unseen(meta, in_flight=False)
    assert meta == {}


def run(overlap: bool, validation=None) -> list[tuple[int, int]]:
    """Worker 0's callback and a bare client for worker 1 on one DynSGD server; returns (worker,
    staleness) of every update. Worker 1 commits once right after the HELLOs."""
    from trainer.runtime.ps_worker.exchange import make_sync_callback

    model = tiny_model()
    algorithm = DynSGD(window=1)
    record = _record()
    with ParameterServer(algorithm, model.get_weights(), 2, SECRET) as ps:
        with PSClient(*ps.address, SECRET, 0, timeout=10).connect() as c0, \
                PSClient(*ps.address, SECRET, 1, timeout=10).connect() as c1:
            _, meta = c0.hello()
            c1.hello()
            callback = make_sync_callback(c0, algorithm, 0, record, None, validation, overlap=overlap)
            callback.begin(model, meta["version"])
            callback.start_epoch(0)
            c1.commit([np.full_like(w, 0.5) for w in model.get_weights()], {})  # version 1
            if validation is not None:
                callback.validate_center()  # pulls version 1, keeps the worker's own weights (version 0)
            for _ in range(2):
                callback.since = 1
                callback.exchange(None)
                if callback.in_flight is not None:
                    callback.in_flight.result()  # applied before the next exchange, reply not folded yet
            callback.finish()
        return [(r.worker, r.staleness) for r in ps.updates]


@pytest.mark.timeout(120)
def test_an_overlapped_commit_counts_the_commits_before_its_base_reply():
    # Worker 0's first commit is version 2 (stale by worker 1's); its second was computed on
    # the HELLO's center plus its own first commit, so worker 1's commit is still unseen.
    assert run(overlap=True) == [(1, 0), (0, 1), (0, 1)]
    assert run(overlap=False) == [(1, 0), (0, 1), (0, 0)]  # the reply of version 2 was applied


@pytest.mark.timeout(120)
def test_a_commit_after_a_validation_pull_counts_what_the_pull_showed_but_the_weights_did_not_take():
    validation = (np.zeros((8, 4), np.float32), np.zeros((8, 1), np.float32))
    assert run(overlap=False, validation=validation) == [(1, 0), (0, 1), (0, 0)]
