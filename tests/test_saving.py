"""`FittedModel.save`: one ``.keras`` file that Keras users load as usual, or a directory; `FittedModel.load`
reads both, with the custom objects by value; loading never warns about the optimizer, and a loaded model
trains on at once (docs/guide.md, "Saving")."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path
from typing import NamedTuple

import keras
import numpy as np
import pytest

from trainer import ADAG, SyncAveraging, Trainer
from trainer.data.checks import DataSpec
from trainer.fit.fitted import CUSTOM_OBJECTS_FILE, ENTRY_PREFIX, FittedModel, TrainingHistory

REPO = Path(__file__).resolve().parents[1]


class Scale(keras.layers.Layer):
    """Multiplies by a trainable scalar; not registered with Keras, so loading needs `custom_objects`."""

    def build(self, input_shape):
        self.factor = self.add_weight(shape=(), initializer="ones", name="factor")

    def call(self, x):
        return x * self.factor


CUSTOM = {"Scale": Scale}


def scaled_digits_model():
    """A small compiled MLP for the 8x8 digits with one custom layer."""
    model = keras.Sequential([keras.Input((64,)), Scale(), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def optimizer_messages(load, caplog, capfd) -> list[str]:
    """What `load()` warned, logged or printed that mentions the optimizer."""
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.DEBUG):
        warnings.simplefilter("always")
        load()
    out, err = capfd.readouterr()
    texts = [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records] + (out + err).splitlines()
    return [t for t in texts if "optimizer" in t.lower()]


def unfitted(model) -> FittedModel:
    """A FittedModel made by hand (no Spark): saving and loading need no cluster."""
    return FittedModel(model, TrainingHistory("none", 1), "features", "label", DataSpec(10, 64, (64,), None))


# --------------------------------------------------------------------------- without Spark


def test_an_unbuilt_optimizer_is_built_before_saving(tmp_path, caplog, capfd):
    model = scaled_digits_model()
    assert not model.optimizer.built  # as the driver's model of a fit was before its optimizer was built
    path = unfitted(model).save(tmp_path / "model.keras")
    assert optimizer_messages(lambda: keras.saving.load_model(path, custom_objects=CUSTOM), caplog, capfd) == []
    assert optimizer_messages(lambda: FittedModel.load(path), caplog, capfd) == []


def test_bad_paths_give_clear_errors(tmp_path):
    fitted = unfitted(scaled_digits_model())
    (tmp_path / "old.keras").mkdir()
    with pytest.raises(IsADirectoryError, match=r"ONE file .* existing directory.*Received: path=.*old\.keras"):
        fitted.save(tmp_path / "old.keras")
    (tmp_path / "plain").write_text("not a directory")
    with pytest.raises(NotADirectoryError, match=r"existing file.*Received: path=.*plain'.*Fix"):
        fitted.save(tmp_path / "plain")
    with pytest.raises(FileNotFoundError, match="No saved FittedModel"):
        FittedModel.load(tmp_path / "missing.keras")
    fitted.keras_model.save(tmp_path / "keras_only.keras")  # Keras's own file: no trainer entries
    with pytest.raises(ValueError, match="fitted.json; this has none.*Fix: keras.saving.load_model"):
        FittedModel.load(tmp_path / "keras_only.keras")
    (tmp_path / "text.keras").write_text("not a zip")
    with pytest.raises(ValueError, match=r"neither.*text\.keras"):
        FittedModel.load(tmp_path / "text.keras")
    with pytest.raises(ValueError, match="neither"):
        FittedModel.load(tmp_path / "plain")
    with pytest.raises(ValueError, match="fitted.json; this has none"):
        FittedModel.load(tmp_path / "old.keras")  # an empty directory
    # A save that succeeds leaves only its file behind (no temporary next to it).
    fitted.save(tmp_path / "deep" / "er" / "model.keras")
    assert sorted(p.name for p in (tmp_path / "deep" / "er").iterdir()) == ["model.keras"]


# --------------------------------------------------------------------------- one real fit


class Fit(NamedTuple):
    fitted: FittedModel
    optimizer_built: bool  # the driver model's optimizer right after fit, before any save


@pytest.fixture(scope="module")
def fit(digits) -> Fit:
    """One cheap distributed fit (ADAG, 2 workers, 1 epoch) shared by the saving tests."""
    fitted = Trainer(scaled_digits_model(), algorithm=ADAG(window=4), num_workers=2, batch_size=32, epochs=1,
                     verbose=False).fit(digits[0])
    return Fit(fitted, fitted.keras_model.optimizer.built)


@pytest.fixture(scope="module")
def batch(digits) -> tuple[np.ndarray, np.ndarray]:
    rows = digits[1].limit(32).collect()
    return np.array([r.features for r in rows], np.float32), np.array([r.label for r in rows])


@pytest.fixture(scope="module")
def saved(fit, tmp_path_factory) -> Path:
    return fit.fitted.save(tmp_path_factory.mktemp("saving") / "model.keras")


@pytest.mark.spark
def test_keras_path_is_one_file_that_keras_loads_with_custom_objects(fit, saved, batch):
    assert saved.is_file()
    names = set(zipfile.ZipFile(saved).namelist())
    assert {"config.json", "metadata.json", "model.weights.h5"} <= names
    assert {ENTRY_PREFIX + n for n in ("fitted.json", "history.json", CUSTOM_OBJECTS_FILE)} <= names
    with pytest.raises(TypeError, match="Scale"):  # the custom layer is needed: nothing registered it
        keras.saving.load_model(saved)
    model = keras.saving.load_model(saved, custom_objects=CUSTOM)
    expected = fit.fitted.keras_model.predict(batch[0], verbose=0)
    np.testing.assert_allclose(model.predict(batch[0], verbose=0), expected, rtol=1e-5, atol=1e-6)

    loaded = FittedModel.load(saved)  # no custom objects given: they come back from the file
    assert type(loaded.keras_model.layers[0]).__name__ == "Scale"
    np.testing.assert_allclose(loaded.keras_model.predict(batch[0], verbose=0), expected, rtol=1e-5, atol=1e-6)
    assert loaded.history.num_updates == fit.fitted.history.num_updates > 0
    assert loaded.spec == fit.fitted.spec and loaded.features_col == "features"


@pytest.mark.spark
def test_loading_never_warns_about_the_optimizer(fit, saved, caplog, capfd):
    assert fit.optimizer_built  # the final center went into a model whose optimizer is built
    assert optimizer_messages(lambda: keras.saving.load_model(saved, custom_objects=CUSTOM), caplog, capfd) == []
    assert optimizer_messages(lambda: FittedModel.load(saved), caplog, capfd) == []


@pytest.mark.spark
def test_a_loaded_model_continues_training_with_a_fresh_optimizer(saved, batch):
    model = FittedModel.load(saved).keras_model
    fresh = scaled_digits_model()
    fresh.optimizer.build(fresh.trainable_variables)
    assert len(model.optimizer.variables) == len(fresh.optimizer.variables)
    assert int(model.optimizer.iterations) == 0  # the center holds no optimizer state: fresh moments, step 0
    before = model.get_weights()
    model.fit(*batch, batch_size=32, epochs=1, verbose=0)
    assert int(model.optimizer.iterations) == 1
    assert any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights()))


@pytest.mark.spark
def test_directory_form_still_works(fit, tmp_path, batch):
    out = fit.fitted.save(tmp_path / "fitted")
    assert sorted(p.name for p in out.iterdir()) == [CUSTOM_OBJECTS_FILE, "fitted.json", "history.json",
                                                     "model.keras"]
    loaded = FittedModel.load(out)
    np.testing.assert_allclose(loaded.keras_model.predict(batch[0], verbose=0),
                               fit.fitted.keras_model.predict(batch[0], verbose=0), rtol=1e-5, atol=1e-6)
    assert loaded.history.num_updates == fit.fitted.history.num_updates


@pytest.mark.spark
@pytest.mark.timeout(180)
def test_custom_objects_come_back_by_value_in_a_fresh_process(fit, saved, batch, tmp_path):
    np.save(tmp_path / "x.npy", batch[0])
    script = (
        "import json, sys, numpy as np, keras\n"
        "from trainer.fit.fitted import FittedModel\n"
        "try:\n"
        "    keras.saving.load_model(sys.argv[1])\n"
        "    plain = 'loaded'\n"
        "except Exception as exc:\n"
        "    plain = str(exc)\n"
        "model = FittedModel.load(sys.argv[1]).keras_model\n"
        "print('RESULT ' + json.dumps({'plain': plain, 'layer': type(model.layers[0]).__name__,\n"
        "                              'predictions': model.predict(np.load(sys.argv[2]), verbose=0).tolist()}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # tests/ is not on the path: Scale exists only in the file
    proc = subprocess.run([sys.executable, "-c", script, str(saved), str(tmp_path / "x.npy")], capture_output=True,
                          text=True, timeout=170, cwd=tmp_path, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    out = json.loads(lines[-1].removeprefix("RESULT "))
    assert "Scale" in out["plain"] and out["layer"] == "Scale"
    np.testing.assert_allclose(np.array(out["predictions"]), fit.fitted.keras_model.predict(batch[0], verbose=0),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.spark
def test_an_optimizer_averaging_algorithm_saves_the_centers_optimizer_state(digits, tmp_path, caplog, capfd):
    fitted = Trainer(scaled_digits_model(), algorithm=SyncAveraging(average_optimizer_state=True), num_workers=2,
                     batch_size=32, epochs=1, verbose=False).fit(digits[0])
    path = fitted.save(tmp_path / "averaged.keras")
    assert optimizer_messages(lambda: keras.saving.load_model(path, custom_objects=CUSTOM), caplog, capfd) == []
    model = FittedModel.load(path).keras_model
    batches = max(e["batches"] for w in fitted.history.workers for e in w["epochs"])
    assert int(model.optimizer.iterations) == batches > 0  # the workers' averaged step count, not 0
    assert len(model.optimizer.variables) == len(fitted.keras_model.optimizer.variables)
    for saved_var, center_var in zip(model.optimizer.variables, fitted.keras_model.optimizer.variables):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(saved_var), keras.ops.convert_to_numpy(center_var))
    moments = [keras.ops.convert_to_numpy(v) for v in model.optimizer.variables[2:]]
    assert any(np.any(m != 0) for m in moments)  # real Adam moments, not fresh zeros
