"""A Spark Connect client for tests/test_connect.py: an all-reduce fit with a GPU per worker.

Runs in its own process because a Spark Connect session switches pyspark into
remote mode for the whole interpreter. Usage (under the ``KERAS_BACKEND`` its tasks are to use):
``python tests/allreduce_client.py sc://127.0.0.1:PORT OUT.json``; the server
runs on fake-GPU workers (each announces one address, no device exists), so
the backend trains on the CPU while each collective process is given, and
sets visible, its own GPU. Writes what it saw as JSON and exits 0, or raises.
"""

from __future__ import annotations

import json
import sys

from connect_client import digits_frames, digits_model  # this script's folder is on sys.path


def main(url: str, out_path: str) -> None:
    from trainer import Trainer
    from trainer.spark.connect import is_connect
    from trainer.spark.session import spark_session

    spark = spark_session(url)
    train, test = digits_frames(spark)
    # slot_timeout: the server answers before its executors have registered
    fitted = Trainer(digits_model, algorithm="allreduce", num_workers=2, batch_size=16, epochs=3, seed=1,
                     gpus_per_worker=1, slot_timeout=120, verbose=False).fit(train)
    out = {
        "is_connect": is_connect(spark),
        "workers": [{k: w.get(k) for k in ("worker", "gpus", "visible_devices", "devices", "backend")}
                    for w in fitted.history.workers],
        "epochs": len(fitted.history.epochs),
        "backend": fitted.history.backend,
        "accuracy": fitted.evaluate(test)["accuracy"],
    }
    spark.stop()
    with open(out_path, "w") as fh:
        json.dump(out, fh)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
