"""The first fit learns like plain Keras: with no algorithm named, 2 and 8 workers (8 time-shared on this
machine's cores) reach plain Keras's quality on three small problems, for the same epochs and the same compiled
optimizer (benchmarks/bench_defaults.py, on an embedded cluster of its own: 8 task slots, more than the session's);
and at the staleness bound of the automatic window, near the optimum, where long trajectories summed onto the
center overshoot it (the MNIST job's lost runs, docs/algorithms.md), 2 workers keep it: in lockstep
(benchmarks/bench_staleness.py, the quality, over four seeds), and in a real fit whose slow exchanges grow the window
to that bound (the mechanism).

Bounds (issue 29): accuracy at most 0.02 below plain Keras's, loss at most 1.2x. Measured on this machine
(docs/algorithms.md has the table): at 2 and 8 workers within 0.0005 and 0.99-1.00x, at 4 within 0.003 and
1.02x; plain Keras alone moves by 0.004 and 1.06x from seed to seed on these problems, so the bounds leave a
margin of five times that. The old default (ADAG, window 12) missed them by 0.2-0.5 accuracy.
"""

from __future__ import annotations

import contextlib
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


DEFAULTS_TEST = "test_the_defaults_learn_like_plain_keras_at_2_and_8_workers"


def battery_workers(backend: str) -> list[int]:
    """The worker counts of a battery: 2 and 8 in make test's main run (TensorFlow), 2 in the backend runs (JAX,
    torch): see test_allreduce_with_its_defaults_learns_like_plain_keras_at_2_and_8_workers."""
    return [2, 8] if backend == "tensorflow" else [2]


@pytest.fixture(scope="module")
def batteries(request, tmp_path_factory):
    """``rows(algorithm)``: the rows of benchmarks/bench_defaults.py at `battery_workers`, under this process's
    Keras backend. Under TensorFlow with the defaults' test selected (make test's main run), ONE run of the
    benchmark serves the three, all-reduce first (``--algorithm allreduce,localsgd,default``: the benchmark's
    docstring says why all-reduce goes first): one embedded cluster, one driver and one plain-Keras run per
    problem instead of one of each per algorithm. The backend runs select the all-reduce test only."""
    import keras

    backend = keras.backend.backend()
    selected = {item.originalname for item in request.session.items}
    done: dict[str, list[dict]] = {}

    def run(algorithms: list[str]) -> None:
        out = tmp_path_factory.mktemp("defaults")
        workers = battery_workers(backend)
        with eight_workers_at_a_time() if 8 in workers else contextlib.nullcontext():
            proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_defaults.py"), "--workers",
                                   ",".join(map(str, workers)), "--algorithm", ",".join(algorithms),
                                   "--allreduce-problems", "regression", "--localsgd-problems", "classes",
                                   "--backend", backend, "--out", str(out)],
                                  cwd=REPO, capture_output=True, text=True, timeout=2000)
        path = out / "defaults.json"
        assert path.is_file(), proc.stdout[-2000:] + proc.stderr[-3000:]
        result = json.loads(path.read_text())
        assert result["metadata"]["keras_backend"] == backend
        for algorithm in algorithms:
            done[algorithm] = [r for r in result["rows"] if r["algorithm"] == algorithm]

    def rows(algorithm: str) -> list[dict]:
        if algorithm not in done:
            every = backend == "tensorflow" and DEFAULTS_TEST in selected and not done
            run(["allreduce", "localsgd", "default"] if every else [algorithm])
        return done[algorithm]

    return rows


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_the_defaults_learn_like_plain_keras_at_2_and_8_workers(batteries):
    rows = batteries("default")
    assert {(r["problem"], r["workers"]) for r in rows} == {(p, n) for p in ("binary", "classes", "regression")
                                                           for n in (2, 8)}
    for row in rows:
        assert row["loss_ratio"] <= LOSS_RATIO, row
        if "accuracy" in row:
            assert row["accuracy"] >= row["plain_accuracy"] - ACCURACY_GAP, row
    by = {(r["problem"], r["workers"]): r for r in rows}
    assert by[("binary", 8)]["window"] == 1  # 8 workers: the staleness bound holds the window at one batch


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.backend
@pytest.mark.timeout(2400)
def test_allreduce_with_its_defaults_learns_like_plain_keras_at_2_and_8_workers(batteries):
    """AllReduce's defaults (the compiled rate scaled to the global batch) meet the same bounds, under each Keras
    backend, on the problem it missed most with the compiled rate: the regression (MSE 4.44 against plain
    Keras's 0.70 at 2 workers). With the rate scaled, under TensorFlow (2026-11-27): MSE 0.994x plain Keras's at
    2 workers, 0.952x at 8; the binary and 4-class problems 0.0-0.003 accuracy below it at 1 to 8
    (docs/algorithms.md).

    At 8 workers under TensorFlow only (make test's main run; the rate's scaling is the same code under every
    backend, rates.py); the backend runs at 2, where each backend's group trains: under torch, 8 processes
    time-sharing 2 cores took 4.5 s a step in gloo's all-reduce (the 8-worker fit alone 525 s; it passed, 0.958x
    plain Keras's MSE, 2026-11-27); under JAX the 8-worker fit took 115 of the battery's 173 CPU seconds, the
    backend run's largest test (2026-11-28, docs/testing.md)."""
    import keras

    rows = batteries("allreduce")
    workers = battery_workers(keras.backend.backend())
    assert [(r["problem"], r["workers"]) for r in rows] == [("regression", n) for n in workers]
    for row in rows:
        assert row["loss_ratio"] <= LOSS_RATIO, row


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_localsgd_with_its_defaults_learns_like_plain_keras_at_2_and_8_workers(batteries):
    """LocalSGD's defaults (its period sized by time, at most 16 steps; bfloat16 on the wire; the compiled rate
    scaled to the N replicas) meet the same bounds on the 4-class problem, in make test's main run (TensorFlow;
    each backend's engine is checked exactly in tests/test_local_sgd.py), and every worker recorded the period
    its group chose."""
    rows = batteries("localsgd")
    assert [(r["problem"], r["workers"]) for r in rows] == [("classes", n) for n in (2, 8)]
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
    from trainer.runtime.ps_worker.cadence import max_auto_window
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
    from trainer.runtime.ps_worker.cadence import max_auto_window
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
