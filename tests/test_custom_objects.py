"""Custom Keras objects defined in a script's ``__main__`` work everywhere (fit, evaluate, transform,
save/load, model selection), and a user error on the executors fails at once."""

from __future__ import annotations

import keras
import pytest

from trainer.runtime.shipping import custom_objects_for, model_to_bytes


@pytest.mark.spark
@pytest.mark.timeout(600)
def test_custom_objects_from_main_work_everywhere_and_errors_fail_fast(drivers_script):
    """tests/custom_objects_script.py, run as a script on the drivers cluster (its classes in ``__main__``, like
    a notebook's), through conftest's ``drivers_script``, which also runs test_gpus.py's GPU checks in it."""
    out = drivers_script
    for key in ("evaluate", "loaded_evaluate", "builder_evaluate", "selection_evaluate"):
        assert set(out[key]) == {"loss", "mae"}, out
    assert out["loaded_evaluate"]["loss"] == pytest.approx(out["evaluate"]["loss"], rel=1e-4)
    assert out["loaded_layer"] == "Scale" and out["same_predictions"]
    for name in ("evaluate", "transform"):
        error = out[f"{name}_error"]
        assert error is not None and "Scale" in error, out  # Keras's own message from the executor
        assert out[f"{name}_failed_attempts"] == 0, out  # at once: no task failed, so Spark retried none


def test_custom_objects_are_found_wherever_they_are_defined():
    @keras.saving.register_keras_serializable(package="tests")
    class Doubled(keras.layers.Layer):
        def call(self, x):
            return 2 * x

    class Shift(keras.layers.Layer):
        def call(self, x):
            return x + 1

    def my_loss(y_true, y_pred):
        return keras.ops.mean(keras.ops.abs(y_true - y_pred), axis=-1)

    model = keras.Sequential([keras.Input((3,)), Doubled(), Shift(), keras.layers.Dense(2, activation="relu")])
    model.compile(optimizer="adam", loss=my_loss)
    found = custom_objects_for(model, model_to_bytes(model))
    assert found == {"tests>Doubled": Doubled, "Shift": Shift, "my_loss": my_loss}
