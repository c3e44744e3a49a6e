"""Run as a script (its classes live in ``__main__``, like a notebook's): custom Keras objects
through fit, evaluate, transform, save/load and model selection on the Spark master it is given
(the test session's drivers cluster); then, in the same session (executors of one GPU each), the GPU
checks of tests/test_gpus.py (tests/gpu_client.py's `gpu_runs`): one driver and its executors for
both. Prints one JSON line of results for tests/conftest.py's ``drivers_script``.

    python tests/custom_objects_script.py OUT_DIR spark://127.0.0.1:PORT
"""

from __future__ import annotations

import json
import sys

import keras
import numpy as np

from gpu_client import GPU_SESSION, gpu_runs  # this script's folder is on sys.path
from trainer import Trainer, spark_session
from trainer.errors import TaskFailedError
from trainer.fit.fitted import FittedModel
from trainer.runtime.shipping import ModelPackage
from trainer.selection import GridSearch, ModelSelector, choice


class Scale(keras.layers.Layer):
    """Multiplies by a trainable scalar (not registered with Keras: found by the trainer)."""

    def build(self, input_shape):
        self.factor = self.add_weight(shape=(), initializer="ones", name="factor")

    def call(self, x):
        return x * self.factor


def soft_relu(x):
    return keras.ops.log1p(keras.ops.exp(x))


def half_mse(y_true, y_pred):
    return 0.5 * keras.ops.mean(keras.ops.square(y_true - y_pred), axis=-1)


def build(params=None):
    model = keras.Sequential([keras.Input((4,)), Scale(), keras.layers.Dense(8, activation=soft_relu),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam((params or {}).get("lr", 0.02)), loss=half_mse, metrics=["mae"])
    return model


def failed_task_attempts(spark) -> int:
    """Failed task attempts of every stage of this application that Spark still tracks."""
    tracker = spark.sparkContext.statusTracker()
    stages = {s for job in tracker.getJobIdsForGroup() if (info := tracker.getJobInfo(job)) for s in info.stageIds}
    return sum(info.numFailedTasks for s in stages if (info := tracker.getStageInfo(s)))


def main(out_dir: str, master: str) -> None:
    out: dict = {}
    with spark_session(master, "custom-objects", expected_executors=2, **GPU_SESSION) as spark:
        rng = np.random.default_rng(0)
        x = rng.normal(size=(600, 4)).astype(np.float32)
        y = x @ np.array([1.0, -1.0, 0.5, 2.0], np.float32)
        df = spark.createDataFrame([(r.tolist(), float(t)) for r, t in zip(x, y)],
                                   "features array<float>, label double").cache()
        fitted = Trainer(build(), num_workers=2, epochs=3, batch_size=16, verbose=False).fit(df)
        out["evaluate"] = fitted.evaluate(df)
        predictions = np.array([r.prediction for r in fitted.transform(df.limit(20)).collect()])
        fitted.save(f"{out_dir}/fitted")
        loaded = FittedModel.load(f"{out_dir}/fitted")
        again = np.array([r.prediction for r in loaded.transform(df.limit(20)).collect()])
        out["loaded_layer"] = type(loaded.keras_model.layers[0]).__name__
        out["same_predictions"] = bool(np.allclose(predictions, again, atol=1e-5))
        out["loaded_evaluate"] = loaded.evaluate(df)

        built = Trainer(build, num_workers=2, epochs=1, batch_size=16, verbose=False).fit(df)  # builder by value
        out["builder_evaluate"] = built.evaluate(df)

        search = GridSearch({"lr": choice([0.01, 0.03])}, epochs=1, batch_size=32, metric="val_loss")
        result = ModelSelector(build, search, num_workers=2, verbose=False).fit(df, validation=0.2)
        out["selection_evaluate"] = result.best_model.evaluate(df)

        # A deterministic user error on the executors fails at once with the executor's message.
        broken = FittedModel(fitted.keras_model, fitted.history, "features", "label", fitted.spec)
        broken._package = ModelPackage(fitted._shipped().data, {})  # as before: the custom objects left behind
        for name, call in (("evaluate", lambda: broken.evaluate(df)), ("transform", lambda: broken.transform(df))):
            before = failed_task_attempts(spark)
            try:
                call()
                out[f"{name}_error"] = None
            except TaskFailedError as exc:
                out[f"{name}_error"] = str(exc)
            out[f"{name}_failed_attempts"] = failed_task_attempts(spark) - before
        out["gpus"] = gpu_runs(spark)
    print("RESULT " + json.dumps(out, default=float))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
