"""Local SGD in an elastic fit (``trainer.algorithms.elastic_local_sgd``): the outer step, and the server's rounds
over the chunk tasks training at the time (``trainer.ps.rounds``), on a real server with real clients; the Spark
fits are in tests/test_elastic.py."""

from __future__ import annotations

import numpy as np
import pytest

from ps_fakes import client, initial_center, ones, run_in_thread, server, wait_for
from trainer.algorithms import LocalSGD
from trainer.algorithms.elastic_local_sgd import ElasticLocalSGD, OuterRounds, outer_step
from trainer.fit.membership import Membership


def test_the_outer_step_scales_and_accelerates_the_trained_weights_only():
    center = [np.zeros(2, np.float32), np.zeros(2, np.float32), np.array([7], np.int64)]
    deltas = [[np.array([1.0, 3.0], np.float32), np.array([2.0, 2.0], np.float32), np.zeros(1, np.float32)],
              [np.array([3.0, 1.0], np.float32), np.array([4.0, 0.0], np.float32), np.zeros(1, np.float32)]]
    trained = [True, False, False]
    new, velocity = outer_step(center, deltas, None, trained, factor=2.0, momentum=0.5)
    # trained: mean (2, 2) times 2 workers = 4; Nesterov from zero velocity: v = 4, step = 4 + 0.5 * 4
    np.testing.assert_allclose(new[0], [6.0, 6.0])
    np.testing.assert_allclose(new[1], [3.0, 1.0])  # BatchNormalization's statistics: the mean alone
    assert new[2][0] == 7 and new[2].dtype == np.int64  # an integer weight stays
    np.testing.assert_allclose(velocity[0], [4.0, 4.0])
    again, _ = outer_step(new, deltas[:1], velocity, trained, factor=1.0, momentum=0.5)  # one worker left
    np.testing.assert_allclose(again[0] - new[0], [1.0 + 0.5 * 3.0, 3.0 + 0.5 * 5.0])  # v = 0.5 * 4 + d
    assert center[0].tolist() == [0.0, 0.0]  # pure
    with pytest.raises(ValueError, match="at least one"):
        outer_step(center, [], None, trained, 1.0, 0.0)


def test_local_sgd_s_elastic_form_keeps_its_settings_and_its_deltas_travel_in_bf16():
    elastic = ElasticLocalSGD.of(LocalSGD(period=8, outer_momentum=0.25), 4)
    assert (elastic.window, elastic.wire, elastic.outer_momentum, elastic.lr_scaling) == (8, "bf16", 0.25, "linear")
    assert ElasticLocalSGD.of(LocalSGD(), 4).window_bound == 16 and elastic.synchronous
    # every worker trains at 4 times the rate, as a fixed fit of 4; a round of 2 takes half the averaged step
    assert elastic.rate_factor == 4.0 and elastic.round_factor(4) == 1.0 and elastic.round_factor(2) == 0.5
    assert ElasticLocalSGD.of(LocalSGD(lr_scaling="none"), 4).round_factor(2) == 1.0
    weights = [np.array([1.0, 2.5], np.float32), np.array([3], np.int64)]
    anchor = [np.array([0.5, 0.5], np.float32), np.array([1], np.int64)]
    payload, residual = elastic.worker_commit(weights, anchor, None)
    assert payload[0].dtype == np.int16 and elastic.check_payload(payload, [(2,), (1,)]) is None
    np.testing.assert_allclose(elastic.deltas(payload, anchor)[0] + residual[0], [0.5, 2.0])
    new, new_anchor = elastic.worker_apply(weights, anchor, [np.array([9.0, 9.0], np.float32), np.array([0])])
    assert new[0].tolist() == [9.0, 9.0] and new[1][0] == 3 and new_anchor is new  # its own seed state kept


def test_a_worker_trains_at_the_maximum_s_rate_and_a_rate_the_driver_sets_is_scaled_the_same_way():
    import keras

    from trainer.runtime.collective.rates import ScaledRate
    from trainer.runtime.ps_worker.exchange import make_sync_callback

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    algorithm = ElasticLocalSGD.of(LocalSGD(), 3)
    rate = ScaledRate(model, algorithm.rate_factor)  # what a chunk task's process sets once, at its model's build
    rate.apply()
    assert float(model.optimizer.learning_rate) == pytest.approx(0.3)
    callback = make_sync_callback(None, algorithm, 0, {"epochs": []}, None)
    callback.set_model(model)
    callback.rate = rate
    callback.follow({"learning_rate": 0.05})  # ReduceLROnPlateau on the driver, in the user's terms
    assert float(model.optimizer.learning_rate) == pytest.approx(0.15) and rate.base == 0.05


def _commit(ps_client, batches: int = 1, epoch: int = 0):
    return ps_client.commit([np.ones(3, np.float32), np.ones((2, 2), np.float32)], {"epoch": epoch,
                                                                                     "batches": batches})


@pytest.mark.timeout(30)
def test_a_round_waits_for_every_task_training_now_and_not_for_one_that_left():
    members = Membership(3)
    rounds = OuterRounds(ElasticLocalSGD(period=2, wire="fp32", outer_momentum=0.0, lr_scaling="none"))
    member = [{"host": "h", "pid": pid} for pid in range(3)]
    with server(rounds, num_workers=6, on_member=members.heard, admit=members.admit) as ps:
        with client(ps, 0) as a, client(ps, 1) as b, client(ps, 2) as c:
            for task, m in zip((a, b, c), member):
                task.hello({"epoch": 0, "member": m})
            first, out = run_in_thread(_commit, a, 2)
            assert not wait_for(lambda: "result" in out, 0.3)  # b and c train: the round waits
            second, out_b = run_in_thread(_commit, b, 2)
            c.epoch_done(0)  # c's pass ended: the round no longer waits for it
            first.join(5), second.join(5)
            center, meta = out["result"]
            np.testing.assert_allclose(center[0], 1.0)  # the mean of two deltas of ones, factor 1
            assert ps.committed_batches(0, 0) == 2 and ps.committed_batches(0, 1) == 2
            third, out = run_in_thread(_commit, a, 1)
            assert not wait_for(lambda: "result" in out, 0.3)  # b still trains
            ps.drop_member("h:1")  # b went silent (hung): dropped by the fit's heartbeat
            third.join(5)
            np.testing.assert_allclose(out["result"][0][0], 2.0)
            with client(ps, 3) as d:  # a task that joins is in the next round
                d.hello({"epoch": 1, "member": member[2]})
                fourth, out = run_in_thread(_commit, a, 1)
                assert not wait_for(lambda: "result" in out, 0.3)
            fourth.join(5)  # d's task ended without EPOCH_DONE (as a lost one): a's round closes alone
            np.testing.assert_allclose(out["result"][0][0], 3.0)
            with client(ps, 4) as e:  # a process's first task (cold: its first step compiles) is not waited for
                e.hello({"epoch": 1, "member": member[1], "cold": True})
                np.testing.assert_allclose(_commit(a, 1)[0][0], 4.0)
                fifth, out = run_in_thread(_commit, e, 1, 1)  # from its first commit on, it is
                assert not wait_for(lambda: "result" in out, 0.3)
                np.testing.assert_allclose(_commit(a, 1)[0][0], 5.0)
                fifth.join(5)
        assert ps.committed_batches(0, 0) == 6 and ps.committed_batches(1, 3) == 0 and ps.committed_batches(1, 4) == 1
    assert ps.failure is None
