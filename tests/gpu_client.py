"""A driver for tests/test_gpus.py: a fit and a model selection with GPUs per worker on fake-GPU workers.

Runs in its own process because Spark allows one SparkContext per process and
the test session already holds one. Usage: ``python tests/gpu_client.py OUT.json MASTER``.
The master is the test session's drivers cluster (3 workers made with
``LocalCluster(worker_resources={"gpu": 1})``: each announces one address through a
discovery script, "0", "1" and "2"; no device exists); it trains with
``gpus_per_worker=1`` and writes what each task was given and what it set as JSON.
"""

from __future__ import annotations

import json
import sys

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
    return [{k: r.get(k) for k in ("worker", "cpus", "gpus", "visible_devices")} for r in records]


def main(out_path: str, master: str) -> None:
    from sklearn.datasets import load_digits

    from trainer import Trainer, spark_session
    from trainer.selection import GridSearch, ModelSelector, choice

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    rows = [(x[i].tolist(), int(data.target[i])) for i in range(600)]
    out: dict = {}
    with spark_session(master, "gpu-test", expected_executors=2,
                       **{"spark.cores.max": "2", "spark.executor.resource.gpu.amount": "1"}) as spark:
        df = spark.createDataFrame(rows, "features array<float>, label int")
        fitted = Trainer(digits_model, num_workers=2, epochs=1, gpus_per_worker=1, verbose=False).fit(df)
        out["fit"] = devices(fitted.history.workers)
        search = GridSearch({"lr": choice([0.003, 0.01])}, epochs=1, metric="loss")
        result = ModelSelector(selection_model, search, num_workers=2, gpus_per_worker=1, verbose=False).fit(df)
        out["select"] = devices(result.tasks)
    with open(out_path, "w") as fh:
        json.dump(out, fh)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
