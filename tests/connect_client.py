"""A Spark Connect client for tests/test_connect.py: fit, transform, evaluate and model selection.

Runs in its own process because a Spark Connect session switches pyspark
into remote mode for the whole interpreter. Usage:
``python tests/connect_client.py sc://127.0.0.1:PORT OUT.json``; writes what
it saw as JSON (the test asserts on it) and exits 0, or raises.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np


def digits_model(lr: float = 0.01):
    import keras

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(lr), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def digits_frames(spark):
    """The digits as (train, test) DataFrames: 1,500 rows and 297, in a fixed shuffled order."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(x))
    rows = [(x[i].tolist(), int(data.target[i])) for i in order]
    return (spark.createDataFrame(rows[:1500], "features array<float>, label int"),
            spark.createDataFrame(rows[1500:], "features array<float>, label int"))


def selection_model(params):
    return digits_model(params["lr"])


def main(url: str, out_path: str) -> None:
    from trainer import ADAG, Trainer
    from trainer.errors import ClusterCapacityError, ConnectUnsupportedError
    from trainer.selection import GridSearch, ModelSelector, choice
    from trainer.spark.connect import MAX_INLINE_BYTES, is_connect, share_with_tasks
    from trainer.spark.cluster_facts import FitCluster
    from trainer.spark.launch import wait_for_slots
    from trainer.spark.session import spark_session

    out: dict = {}
    spark = spark_session(url)  # sc:// -> SparkSession.builder.remote(url)
    out["is_connect"] = is_connect(spark)
    try:
        spark.sparkContext  # noqa: B018
        out["has_spark_context"] = True
    except Exception as exc:  # pyspark: JVM_ATTRIBUTE_NOT_SUPPORTED
        out["has_spark_context"] = False
        out["spark_context_error"] = type(exc).__name__
    out["ps_host"] = FitCluster(spark).addresses()[0]

    train, test = digits_frames(spark)

    started = time.time()
    # slot_timeout: the server answers before its executors have registered, which takes over 10 s on a
    # loaded machine (the first fit is the first stage; the capacity check below keeps the default)
    fitted = Trainer(digits_model, algorithm=ADAG(window=8), num_workers=2, batch_size=32, epochs=5,
                     slot_timeout=120, verbose=False).fit(train)
    out["fit_s"] = time.time() - started
    out["fit_workers"] = sorted({w["worker"] for w in fitted.history.workers})
    out["fit_updates"] = fitted.history.num_updates
    out["evaluate"] = fitted.evaluate(test)
    predicted = fitted.transform(test).select("label", "prediction").toPandas()
    out["transform_rows"] = len(predicted)
    out["transform_accuracy"] = float(np.mean(np.argmax(np.stack(predicted["prediction"]), 1) == predicted["label"]))

    for strategy, workers in (("mop", 2), ("task_parallel", 2)):
        search = GridSearch({"lr": choice([0.003, 0.01])}, epochs=2, metric="val_accuracy")
        result = ModelSelector(selection_model, search, strategy=strategy, num_workers=workers,
                               verbose=False).fit(train, validation=test)
        out[f"select_{strategy}"] = {"configs": len(result.leaderboard),
                                    "best": float(result.best_value),
                                    "tasks": len(result.tasks)}

    started = time.time()
    try:
        wait_for_slots(spark, 3, 5.0)  # the server has 2 slots
        out["capacity_error"] = None
    except ClusterCapacityError as exc:
        out["capacity_error"] = str(exc)
    out["capacity_check_s"] = time.time() - started

    try:
        share_with_tasks(spark, np.zeros(MAX_INLINE_BYTES // 8 + 1024), "a test copy")
        out["inline_error"] = None
    except ConnectUnsupportedError as exc:
        out["inline_error"] = str(exc)

    with open(out_path, "w") as fh:
        json.dump(out, fh)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
