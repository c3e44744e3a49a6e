"""A Spark driver program for the fault tests: trains on MNIST and writes what happened as JSON.

The tests run it as a separate process against a LocalCluster they own, so that
they can kill the driver itself (and restart it with ``--resume``) or let it
kill one of the cluster's workers in the middle of training.

The model is softmax regression with a strong L2 penalty on 12,000 MNIST
images, evaluated on the full 10,000-image test set, so half a point is 50
test images. The problem is strongly convex and the learning rate decays to
zero (cosine) over the run, so every run ends at the same optimum. The
optimizer state, iteration count included, is averaged with the weights
(SyncAveraging with ``average_optimizer_state=True``), so the schedule goes on
where it was after a retry or a resume. (With a constant learning rate, Adam's
end point jitters by half a point between runs: a test of "within 0.5 points"
needs a run that converges.)

    python tests/fault_driver.py --master spark://127.0.0.1:7077 --out result.json \
        [--baseline-out undisturbed.json] [--checkpoint-dir DIR [--resume]] [--kill-pgid PGID --kill-at-epoch 3]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import threading
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--master", required=True)
    parser.add_argument("--out", required=True, help="JSON file written at the end")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--checkpoint-dir", default=None)
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint-dir")
    parser.add_argument("--baseline-out", default=None, help="first train undisturbed and write that JSON here")
    parser.add_argument("--kill-pgid", type=int, default=None, help="process group to SIGKILL mid-training")
    parser.add_argument("--kill-at-epoch", type=int, default=3,
                        help="kill once every worker commits in this epoch (so all finished the ones before)")
    return parser.parse_args(argv)


def build_model(decay_steps: int):
    import keras

    model = keras.Sequential([
        keras.Input((784,)),
        keras.layers.Dense(10, activation="softmax", kernel_regularizer=keras.regularizers.L2(1e-2)),
    ], name="softmax_regression")
    schedule = keras.optimizers.schedules.CosineDecay(1e-2, decay_steps)
    model.compile(optimizer=keras.optimizers.Adam(schedule), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import numpy as np

    from trainer import SyncAveraging, Trainer
    from trainer.data.prep import images_to_dataframe, scale_pixels
    from trainer_jobs.support.datasets import load_mnist
    from trainer.spark.session import spark_session

    x_train, y_train, x_test, y_test = load_mnist(limit=12_000)
    spark = spark_session(args.master, "fault-driver", expected_executors=args.workers, executor_timeout=240)
    train = scale_pixels(images_to_dataframe(spark, x_train, y_train)).cache()
    train.count()
    print(f"driver {os.getpid()}: {train.count()} rows cached", flush=True)

    killed = threading.Event()
    epoch_of: dict[int, int] = {}  # worker -> epoch of its latest commit

    def on_update(record) -> None:
        epoch_of[record.worker] = record.epoch or 0
        every_worker_there = len(epoch_of) == args.workers and min(epoch_of.values()) >= args.kill_at_epoch
        if args.kill_pgid and not killed.is_set() and every_worker_there:
            killed.set()
            os.killpg(args.kill_pgid, signal.SIGKILL)
            print(f"killed process group {args.kill_pgid} at epoch {record.epoch}, version {record.version}",
                  flush=True)

    def fit(**options) -> dict:
        steps = args.epochs * math.ceil(len(x_train) / args.workers / 256)

        def model():  # a closure: cloudpickle ships it and build_model by value
            return build_model(steps)

        trainer = Trainer(model, num_workers=args.workers, batch_size=256,
                          algorithm=SyncAveraging(every=4, average_optimizer_state=True),
                          epochs=args.epochs, retry_timeout=10, verbose=False, seed=1, **options)
        fitted = trainer.fit(train, resume_from=args.checkpoint_dir if args.resume else None)
        _, accuracy = fitted.keras_model.evaluate(x_test, y_test, verbose=0)
        history = fitted.history
        return {
            "accuracy": float(accuracy),
            "killed": killed.is_set(),
            "events": history.events,
            "workers": [{k: w[k] for k in ("worker", "attempt", "start_epoch", "rows")} for w in history.workers],
            "epochs": [e["epoch"] for e in history.epochs],
        }

    x_test = (x_test.reshape(-1, 784) / 255.0).astype(np.float32)
    if args.baseline_out:  # an undisturbed run first, on the same cluster and data
        baseline = fit()
        Path(args.baseline_out).write_text(json.dumps(baseline, default=float))
        print(f"undisturbed accuracy {baseline['accuracy']:.4f}", flush=True)
    result = fit(checkpoint_dir=args.checkpoint_dir, checkpoint_every=20, on_update=on_update)
    Path(args.out).write_text(json.dumps(result, default=float))
    print(json.dumps({k: result[k] for k in ("accuracy", "killed", "epochs")}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
