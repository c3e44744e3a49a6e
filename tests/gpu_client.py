"""The GPU checks of tests/test_gpus.py: a fit and a model selection with GPUs per worker on fake-GPU workers.

`gpu_runs` runs them in a session on the test session's drivers cluster (3 workers made
with ``LocalCluster(worker_resources={"gpu": 1})``: each announces one address through a
discovery script, "0", "1" and "2"; no device exists), with executors of one GPU each: it
trains with ``gpus_per_worker=1`` and returns what each task was given and what it set.
tests/custom_objects_script.py calls it in its own driver, so that the two scripts' checks
pay for one driver and its executors (tests/conftest.py's ``drivers_script``).
"""

from __future__ import annotations

import numpy as np


def digits_model(lr: float = 0.01):
    import keras

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(lr), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def selection_model(params):
    return digits_model(params["lr"])


def devices(records: list[dict]) -> list[dict]:
    return [{k: r.get(k) for k in ("worker", "cpus", "gpus", "visible_devices", "shared_gpu")} for r in records]


#: The session settings the GPU runs need: 2 executors of one GPU each.
GPU_SESSION = {"spark.cores.max": "2", "spark.executor.resource.gpu.amount": "1"}


def gpu_runs(spark) -> dict:
    """A fit and a selection with ``gpus_per_worker=1`` on `spark` (executors of one GPU each): what each task
    was given and what it set visible, as ``{"fit": [...], "select": [...]}``."""
    from sklearn.datasets import load_digits

    from trainer import Trainer
    from trainer.selection import GridSearch, ModelSelector, choice

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    rows = [(x[i].tolist(), int(data.target[i])) for i in range(600)]
    df = spark.createDataFrame(rows, "features array<float>, label int")
    fitted = Trainer(digits_model, num_workers=2, epochs=1, gpus_per_worker=1, verbose=False).fit(df)
    search = GridSearch({"lr": choice([0.003, 0.01])}, epochs=1, metric="loss")
    result = ModelSelector(selection_model, search, num_workers=2, gpus_per_worker=1, verbose=False).fit(df)
    return {"fit": devices(fitted.history.workers), "select": devices(result.tasks)}

