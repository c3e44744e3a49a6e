"""The first fit learns like plain Keras: with no algorithm named, 2 and 8 workers (8 time-shared on this
machine's cores) reach plain Keras's quality on three small problems, for the same epochs and the same compiled
optimizer (jobs/bench_defaults.py, on an embedded cluster of its own: 8 task slots, more than the session's);
and 2 workers keep it when slow exchanges make the automatic window grow to its bound, near the optimum, where
two long trajectories summed onto the center overshoot it (the MNIST job's lost runs, docs/algorithms.md).

Bounds (issue 29): accuracy at most 0.02 below plain Keras's, loss at most 1.2x. Measured on this machine
(docs/algorithms.md has the table): at 2 and 8 workers within 0.0005 and 0.99-1.00x, at 4 within 0.003 and
1.02x; plain Keras alone moves by 0.004 and 1.06x from seed to seed on these problems, so the bounds leave a
margin of five times that. The old default (ADAG, window 12) missed them by 0.2-0.5 accuracy (REFERENCE.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from trainer_jobs.bench_defaults import ACCURACY_GAP, LOSS_RATIO, compare, make_problem

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_the_defaults_learn_like_plain_keras_at_2_and_8_workers(tmp_path, eight_workers_at_a_time):
    done = subprocess.run([sys.executable, str(REPO / "jobs" / "bench_defaults.py"), "--workers", "2,8",
                           "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=1150)
    result = json.loads((tmp_path / "defaults.json").read_text()) if (tmp_path / "defaults.json").is_file() else None
    assert result is not None, done.stdout[-2000:] + done.stderr[-3000:]
    rows = result["rows"]
    assert {(r["problem"], r["workers"]) for r in rows} == {(p, n) for p in ("binary", "classes", "regression")
                                                           for n in (2, 8)}
    for row in rows:
        assert row["loss_ratio"] <= LOSS_RATIO, row
        if "accuracy" in row:
            assert row["accuracy"] >= row["plain_accuracy"] - ACCURACY_GAP, row
    by = {(r["problem"], r["workers"]): r for r in rows}
    assert by[("binary", 8)]["window"] == 1  # 8 workers: the staleness bound holds the window at one batch
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.backend
@pytest.mark.timeout(2400)
def test_allreduce_with_its_defaults_learns_like_plain_keras_at_2_and_8_workers(tmp_path, eight_workers_at_a_time):
    """AllReduce's defaults (the compiled rate scaled to the global batch) meet the same bounds, under each Keras
    backend, on the problem it missed most with the compiled rate: the regression (MSE 4.44 against plain
    Keras's 0.70 at 2 workers). With the rate scaled, under TensorFlow (2026-11-27): MSE 0.994x plain Keras's at
    2 workers, 0.952x at 8; the binary and 4-class problems 0.0-0.003 accuracy below it at 1 to 8
    (docs/algorithms.md).

    Under torch at 2 workers only: 8 torch processes time-sharing 2 cores take 4.5 s a step in gloo's
    all-reduce (the 8-worker fit alone 525 s, 13 minutes of make test's backend run; it passed, 0.958x plain
    Keras's MSE, 2026-11-27); under TensorFlow and JAX at 2 and 8."""
    import keras

    backend = keras.backend.backend()
    workers = [2] if backend == "torch" else [2, 8]
    done = subprocess.run([sys.executable, str(REPO / "jobs" / "bench_defaults.py"), "--workers",
                           ",".join(map(str, workers)), "--algorithm", "allreduce", "--problems", "regression",
                           "--backend", backend, "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=1500)
    path = tmp_path / "defaults.json"
    assert path.is_file(), done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(path.read_text())
    assert result["metadata"]["keras_backend"] == backend
    assert [(r["problem"], r["workers"]) for r in result["rows"]] == [("regression", n) for n in workers]
    for row in result["rows"]:
        assert row["loss_ratio"] <= LOSS_RATIO, row
    assert done.returncode == 0, done.stderr[-3000:]


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


def digits_cnn():
    """Two 3x3 convolutions over the 8x8 digits: near its optimum after 20 epochs (plain Keras 0.98)."""
    import keras

    model = keras.Sequential([
        keras.Input((64,)), keras.layers.Reshape((8, 8, 1)),
        keras.layers.Conv2D(16, 3, activation="relu"), keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.Flatten(), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


# Calibration (2026-11-27, this test's conditions: 2 workers, the digits CNN, 20 epochs, Adam at Keras's default
# rate, every commit held 50 ms by the server so that the automatic window grows to its bound; test accuracy
# by seed 0, 1, 2, 3, ...):
#   plain Keras                                                  0.987, 0.983, 0.980, 0.987 (mean of 0-2: 0.983)
#   the bound until 2026-11-27, half an epoch: windows of 24     0.926, 0.929, 0.845, 0.987: fails (0.845 < 0.903)
#   the bound (N - 1) * window <= 10: windows of 10              0.956, 0.983, 0.987, 0.983, 0.993, 0.983, 0.997,
#                                                                0.990 (8 seeds; worst 0.956, 0.053 above 0.903)
# With windows fixed at 23 the spread was the same: 0.724, 0.990, 0.987, 0.801.
LONG_WINDOW_SEEDS = (0, 1, 2)
LONG_WINDOW_EPOCHS = 20
LONG_WINDOW_GAP, LONG_WINDOW_MEAN_GAP = 0.08, 0.03


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_workers_keep_plain_keras_accuracy_when_slow_exchanges_grow_the_window(digits):
    import keras

    from trainer import Trainer
    from trainer.runtime.cadence import max_auto_window
    from trainer.runtime.worker import epoch_batches_budget

    train, test = digits
    x, y = (np.stack(train.toPandas()["features"]).astype(np.float32), train.toPandas()["label"].to_numpy())
    xt, yt = (np.stack(test.toPandas()["features"]).astype(np.float32), test.toPandas()["label"].to_numpy())

    def slow_exchange(record) -> None:  # a busy link or server: exchanges dear against steps of a few ms
        time.sleep(0.05)

    plain, ours, windows = [], [], set()
    for seed in LONG_WINDOW_SEEDS:
        keras.utils.set_random_seed(seed)
        model = digits_cnn()
        model.fit(x, y, batch_size=32, epochs=LONG_WINDOW_EPOCHS, verbose=0)
        plain.append(model.evaluate(xt, yt, verbose=0, return_dict=True)["accuracy"])
        keras.utils.set_random_seed(seed)
        fitted = Trainer(digits_cnn(), num_workers=2, batch_size=32, epochs=LONG_WINDOW_EPOCHS, seed=seed,
                         on_update=slow_exchange, verbose=False).fit(train)
        ours.append(fitted.evaluate(test)["accuracy"])
        windows |= {w["window"]["last"] for w in fitted.history.workers}
    bound = max_auto_window(epoch_batches_budget(len(x) // 2, 32, 2), 2)  # 2 shards of 750 rows
    assert windows == {bound}, f"the slow exchanges did not grow the window to its bound {bound}: {windows}"
    floor = float(np.mean(plain)) - LONG_WINDOW_GAP
    assert min(ours) >= floor, f"2 workers {ours} against plain Keras {plain}: a run below {floor:.3f}"
    assert np.mean(ours) >= np.mean(plain) - LONG_WINDOW_MEAN_GAP, f"2 workers {ours} against plain Keras {plain}"
