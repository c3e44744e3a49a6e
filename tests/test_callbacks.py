"""Validation and driver-side Keras callbacks on a real cluster: validation metrics per epoch,
EarlyStopping that stops the workers, ReduceLROnPlateau, a best-model checkpoint, CSVLogger, TensorBoard."""

from __future__ import annotations

import csv

import keras
import numpy as np
import pytest

from trainer import ADAG, SyncAveraging, Trainer
from trainer.fit.epoch_callbacks import check_callbacks

W = np.array([1.0, -2.0, 0.5, 3.0], np.float32)


def regression_model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    return model


def rising_problem(spark, seed=0):
    """Training labels x.w, validation labels -x.w: the better the fit, the worse the validation loss."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(1200, 4)).astype(np.float32)
    xv = rng.normal(size=(200, 4)).astype(np.float32)
    train = spark.createDataFrame([(r.tolist(), float(r @ W)) for r in x], "features array<float>, label double")
    val = spark.createDataFrame([(r.tolist(), float(-(r @ W))) for r in xv], "features array<float>, label double")
    return train.cache(), val.cache()


@pytest.mark.timeout(400)
@pytest.mark.parametrize("algorithm", [ADAG(window=4), SyncAveraging(every=4)], ids=["adag", "sync"])
def test_early_stopping_stops_the_workers_and_restores_the_best_center(spark, tmp_path, algorithm):
    train, val = rising_problem(spark)
    epochs = 25
    stopper = keras.callbacks.EarlyStopping(monitor="val_loss", patience=2, restore_best_weights=True)
    callbacks = [
        stopper,
        keras.callbacks.ModelCheckpoint(str(tmp_path / "best.keras"), monitor="val_loss", save_best_only=True),
        keras.callbacks.ReduceLROnPlateau(monitor="val_loss", patience=1, factor=0.5),
        keras.callbacks.CSVLogger(str(tmp_path / "epochs.csv")),
        keras.callbacks.TensorBoard(str(tmp_path / "tb")),
    ]
    fitted = Trainer(regression_model(), algorithm=algorithm, num_workers=2, batch_size=16, epochs=epochs,
                     verbose=False).fit(train, validation=val, callbacks=callbacks)
    history = fitted.history
    val_losses = [e["val_loss"] for e in history.epochs]
    assert len(val_losses) < epochs, history.epochs
    assert all(e["val_rows"] == 200 for e in history.epochs), history.epochs
    assert all({"updates", "bytes", "staleness", "epoch_time_s"} <= set(e) for e in history.epochs)
    # the workers really stopped. The driver's epoch ends when every worker has ended it, so the
    # slowest worker sets the pace: under a synchronous algorithm no worker ran all the epochs; under an
    # asynchronous one a fast worker may finish its epochs before the slowest one's epoch stops the
    # fit (seen on a loaded 2-core machine), and the slowest one must not have run them all.
    ended = [len([e for e in w["epochs"] if "end" in e]) for w in history.workers]
    assert (max(ended) if algorithm.synchronous else min(ended)) < epochs, history.workers
    assert any(e.get("event") == "stopped_by_callback" for e in history.events)
    assert any(e.get("kind") == "directive" and "learning_rate" in e for e in history.events)
    # the returned model is the best epoch's center (the one the best-model checkpoint saved)
    best = int(np.argmin(val_losses))
    assert stopper.best_epoch == history.epochs[best]["epoch"]
    checkpoint = keras.saving.load_model(tmp_path / "best.keras")
    for saved, returned in zip(checkpoint.get_weights(), fitted.keras_model.get_weights()):
        np.testing.assert_allclose(saved, returned, rtol=1e-6)
    if algorithm.synchronous:  # every worker validated the same center: the metrics are exactly its own
        assert fitted.evaluate(val)["loss"] == pytest.approx(val_losses[best], rel=1e-3)
    with open(tmp_path / "epochs.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [float(r["val_loss"]) for r in rows] == pytest.approx(val_losses[: len(rows)], rel=1e-5)
    assert float(rows[-1]["learning_rate"]) < 0.05
    assert list((tmp_path / "tb").rglob("events.out.tfevents.*"))


@pytest.mark.timeout(300)
def test_validation_fraction_gives_distributed_validation_metrics(digits):
    from conftest import digits_model

    train, _ = digits
    fitted = Trainer(digits_model(), num_workers=2, epochs=2, verbose=False).fit(train, validation=0.2)
    epochs = fitted.history.epochs
    assert len(epochs) == 2
    assert 200 < epochs[0]["val_rows"] < 400  # about a fifth of 1,500 rows
    assert epochs[-1]["val_accuracy"] > 0.5
    assert epochs[-1]["val_loss"] < epochs[0]["val_loss"] * 1.5


def test_callback_checks_fail_before_any_cluster_work():
    model = regression_model()
    with pytest.raises(ValueError, match="monitors 'val_loss'.*no validation"):
        check_callbacks([keras.callbacks.EarlyStopping(monitor="val_loss")], model, has_validation=False)
    with pytest.raises(TypeError, match="keras.callbacks.Callback"):
        check_callbacks([print], model, has_validation=True)
    scheduled = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    scheduled.compile(optimizer=keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9)),
                      loss="mse")
    with pytest.raises(ValueError, match="ReduceLROnPlateau needs an optimizer with a plain learning rate"):
        check_callbacks([keras.callbacks.ReduceLROnPlateau()], scheduled, has_validation=True)
