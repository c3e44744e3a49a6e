"""The first fit learns like plain Keras: with no algorithm named, 2 workers reach plain Keras's quality on three
small problems and 8 (time-shared on this machine's cores) on one, for the same epochs and the same compiled
optimizer (benchmarks/bench_defaults.py, on an embedded cluster of its own: 8 task slots, more than the session's);
and at the staleness bound of the automatic window, near the optimum, where long trajectories summed onto the
center overshoot it (the MNIST job's lost runs, docs/algorithms.md), 2 workers keep it: in lockstep
(benchmarks/bench_staleness.py, the quality, over four seeds), and in a real fit whose slow exchanges grow the window
to that bound (the mechanism).

Bounds: accuracy at most 0.02 below plain Keras's, loss at most 1.2x. Measured on this machine (docs/algorithms.md
has the table): at 2 and 8 workers within 0.0005 and 0.99-1.00x, at 4 within 0.003 and 1.02x; plain Keras alone
moves by 0.004 and 1.06x from seed to seed on these problems, so the bounds leave a margin of five times that.
The old default (ADAG, window 12) missed them by 0.2-0.5 accuracy.

The batteries run under TensorFlow, in make test's main run: the rate's scaling and the period's sizing are the
same code under every backend (trainer/runtime/collective/rates.py, averaging.py), and each backend's group is
checked exactly against plain Keras (tests/test_allreduce.py, tests/test_local_sgd.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import eight_workers_at_a_time
from trainer_benchmarks.bench_defaults import ACCURACY_GAP, LOSS_RATIO, compare, make_problem

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def batteries(tmp_path_factory):
    """``rows(algorithm)``: the rows of ONE run of benchmarks/bench_defaults.py for the three batteries (all-reduce
    first: the benchmark's docstring says why): one embedded cluster, one driver and one plain-Keras run per
    problem. Every problem at 2 workers; at 8, the default on ``binary`` only (``--largest-problems``): each
    8-worker fit starts 8 training processes on 2 cores, and what 8 add to 2 (the window held at one batch by the
    staleness bound, quality time-shared) one problem shows."""
    done: dict[str, list[dict]] = {}

    def rows(algorithm: str) -> list[dict]:
        if not done:
            out = tmp_path_factory.mktemp("defaults")
            with eight_workers_at_a_time():
                proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_defaults.py"), "--workers",
                                       "2,8", "--algorithm", "allreduce,localsgd,default", "--allreduce-problems",
                                       "regression", "--localsgd-problems", "classes", "--largest-problems",
                                       "binary", "--backend", "tensorflow", "--out", str(out)],
                                      cwd=REPO, capture_output=True, text=True, timeout=2000)
            path = out / "defaults.json"
            assert path.is_file(), proc.stdout[-2000:] + proc.stderr[-3000:]
            result = json.loads(path.read_text())
            for name in ("allreduce", "localsgd", "default"):
                done[name] = [r for r in result["rows"] if r["algorithm"] == name]
        return done[algorithm]

    return rows


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_the_defaults_learn_like_plain_keras_at_2_and_8_workers(batteries):
    rows = batteries("default")
    assert {(r["problem"], r["workers"]) for r in rows} == {("binary", 2), ("classes", 2), ("regression", 2),
                                                           ("binary", 8)}
    for row in rows:
        assert row["loss_ratio"] <= LOSS_RATIO, row
        if "accuracy" in row:
            assert row["accuracy"] >= row["plain_accuracy"] - ACCURACY_GAP, row
    by = {(r["problem"], r["workers"]): r for r in rows}
    assert by[("binary", 8)]["window"] == 1  # 8 workers: the staleness bound holds the window at one batch


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_allreduce_with_its_defaults_learns_like_plain_keras(batteries):
    """AllReduce's defaults (the compiled rate scaled to the global batch) meet the same bounds on the problem it
    missed most with the compiled rate: the regression (MSE 4.44 against plain Keras's 0.70 at 2 workers). With
    the rate scaled, under TensorFlow: MSE 0.994x plain Keras's at 2 workers, 0.952x at 8 (docs/algorithms.md);
    the scaling to N workers is `test_the_learning_rate_follows_the_global_batch_unless_told_otherwise`'s."""
    rows = batteries("allreduce")
    assert [(r["problem"], r["workers"]) for r in rows] == [("regression", 2)]
    for row in rows:
        assert row["loss_ratio"] <= LOSS_RATIO, row


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_localsgd_with_its_defaults_learns_like_plain_keras(batteries):
    """LocalSGD's defaults (its period sized by time, at most 16 steps; bfloat16 on the wire; the compiled rate
    scaled to the N replicas) meet the same bounds on the 4-class problem (each backend's engine is checked
    exactly in tests/test_local_sgd.py), and every worker recorded the period its group chose."""
    rows = batteries("localsgd")
    assert [(r["problem"], r["workers"]) for r in rows] == [("classes", 2)]
    for row in rows:
        assert row["loss_ratio"] <= LOSS_RATIO, row
        assert row["accuracy"] >= row["plain_accuracy"] - ACCURACY_GAP, row
        assert 1 <= row["window"] <= 16, row  # the period the group took


def test_the_bounds_and_the_problems():
    (x, y), (xt, yt) = make_problem("classes")
    assert x.shape == (10_000, 8) and xt.shape == (2_000, 8) and set(y.tolist()) == {0, 1, 2, 3}
    assert make_problem("binary")[0][0].shape == (10_000, 10)
    assert abs(float(make_problem("regression")[0][1].std()) - 1.0) < 1e-3
    plain = {"accuracy": 0.95, "loss": 0.2}
    assert compare("binary", 2, plain, {"accuracy": 0.931, "loss": 0.23}, 5)["within"]
    assert not compare("binary", 2, plain, {"accuracy": 0.929, "loss": 0.23}, 5)["within"]
    assert not compare("binary", 2, plain, {"accuracy": 0.95, "loss": 0.25}, 5)["within"]
    assert compare("regression", 8, {"loss": 10.0}, {"loss": 11.9}, 1)["within"]
    with pytest.raises(ValueError, match="Unknown problem"):
        make_problem("images")


# Calibration of the lockstep simulation (benchmarks/bench_staleness.py: the digits CNN, 20 epochs, 2 workers
# committing in turn, every base missing the other's last window; 2026-11-27, test accuracy):
#   seeds                                      0-9: mean, worst   10-19: mean, worst   0-3: mean
#   plain Keras                                0.980, 0.970       0.975, 0.963         0.984
#   window 24 (half an epoch, the bound until 2026-11-27)  0-2: 0.875, 0.943, 0.916
#   window 10 (the bound (N - 1) * window <= 10 until now)  0.970, 0.946   0.977, 0.966   0.966
#   window 5 (the bound (N - 1) * window <= 5)  0.977, 0.929       0.975, 0.953         0.983
# So over four seeds the gap is 0.001 at the bound (5), 0.019 at 10 and about 0.07 at 24: the test tells the
# half-epoch bound from this one; 5 against 10 takes the benchmark's 20 seeds (docs/algorithms.md).
LOCKSTEP_SEEDS = (0, 1, 2, 3)
LOCKSTEP_MEAN_GAP = 0.02
SLOW_EXCHANGE_EPOCHS, SLOW_EXCHANGE_FLOOR = 8, 0.85


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_staleness_bound_keeps_plain_keras_accuracy_when_workers_commit_in_turn():
    """The quality the bound buys, with timing taken out: 2 workers in lockstep at their largest automatic
    window, every commit's base missing the other worker's last window (benchmarks/bench_staleness.py), against
    plain Keras from the same initial weights. A fit's interleaving depends on the machine's load (the same
    seed ended 0.88 on CI and 0.98 here at window 10); the lockstep order is the one the bound is written
    for, so the mean over four seeds is a property of the bound."""
    from trainer.algorithms.cadence import max_auto_window
    from trainer_benchmarks.bench_staleness import plain_keras, simulate

    window = max_auto_window(None, 2)
    plain = [plain_keras(seed) for seed in LOCKSTEP_SEEDS]
    ours = [simulate(2, window, seed) for seed in LOCKSTEP_SEEDS]
    assert np.mean(ours) >= np.mean(plain) - LOCKSTEP_MEAN_GAP, (
        f"2 workers at window {window}: {ours} against plain Keras {plain}")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_slow_exchanges_grow_the_window_of_2_workers_to_its_bound_and_the_fit_learns(digits):
    """In a real fit, exchanges dear against steps of a few ms (every commit held 50 ms by the server: a busy
    link or server) grow the automatic window to the staleness bound and no further; the fit learns the
    digits (the quality at the bound is the lockstep test's above)."""
    from trainer import Trainer
    from trainer.algorithms.cadence import max_auto_window
    from trainer.runtime.ps_worker.worker_task import epoch_batches_budget
    from trainer_benchmarks.bench_staleness import digits_cnn

    train, test = digits

    def slow_exchange(record) -> None:
        time.sleep(0.05)

    fitted = Trainer(digits_cnn(), num_workers=2, batch_size=32, epochs=SLOW_EXCHANGE_EPOCHS, seed=0,
                     on_update=slow_exchange, verbose=False).fit(train)
    windows = {w["window"]["last"] for w in fitted.history.workers}
    bound = max_auto_window(epoch_batches_budget(1500 // 2, 32, 2), 2)  # 2 shards of 750 rows
    assert windows == {bound}, f"the slow exchanges did not grow the window to its bound {bound}: {windows}"
    staleness = np.bincount(np.asarray(fitted.history.update_log["staleness"])).tolist()
    accuracy = fitted.evaluate(test)["accuracy"]
    assert accuracy >= SLOW_EXCHANGE_FLOOR, (accuracy, "commits by staleness", staleness, fitted.history.events)
