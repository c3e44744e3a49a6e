"""MNIST model selection: model hopper parallelism vs task parallelism vs sequential training.

Searches 2 architectures (a small CNN and an MLP) x 2 learning rates x 2 batch
sizes = 8 configurations, selecting on validation accuracy, three times in the
same run on the same data:

* ``mop``: model hopper parallelism, N workers, each holding 1/N of the data;
* ``task_parallel``: N workers, each holding a full copy and training whole configurations;
* ``sequential``: one worker, the configurations one after the other.

``--search`` picks the search (``grid``, the default, is the 8 configurations
above; ``random``, ``halving``, ``hyperband``, ``tpe``, ``asha`` and
``tpe-asha`` sample ``SEARCH_SPACE``: the architecture, a log-uniform learning
rate, the batch size and, for the MLP, an int width). Several searches, or
several ``--seeds``, compare the searches at an equal budget of epochs instead
(Hyperband's for ``--max-epochs``/``--eta``), with the first strategy:

    python jobs/select_mnist.py --limit 6000 --search hyperband,random,tpe,tpe-asha --seeds 0,1,2

It reports the wall time of each, the time relative to ideal task parallelism
(sequential time / N) and to the measured task parallelism, the bytes of data
the tasks hold, every configuration's final validation accuracy and the largest
gap to the sequential run's, plus the test accuracy of each strategy's best
model. Results (JSON, CSV, markdown, leaderboards, Gantt charts,
learning curves) go to --out.

    python jobs/select_mnist.py --limit 6000 --epochs 2
    python jobs/select_mnist.py --master spark://master:7077 --workers 3 --out results/select_mnist
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from trainer.data.prep import scale_pixels
from trainer.selection import Search, choice, loguniform, randint, when
from trainer_jobs.support.cli import positive_float
from trainer_jobs.support.datasets import data_dir, load_mnist, parquet_images
from trainer_jobs.support.scaling import cluster_session, timing_valid
from trainer_jobs.support.selection import (
    compare_strategies, comparison_parser, first_configs, make_search, parse_comparison_args,
    run_search_comparison, score_best_models, write_comparison,
)

SPACE = {
    "arch": choice(["cnn", "mlp"]),
    "lr": choice([1e-3, 3e-3]),
    "batch_size": choice([32, 128]),
}
#: What the sampling searches draw from: a log-uniform learning rate, and an MLP width only for the MLP.
SEARCH_SPACE = {
    "arch": choice(["cnn", "mlp"]),
    "lr": loguniform(1e-4, 3e-2),
    "batch_size": choice([32, 64, 128]),
    "units": when("arch", "mlp", randint(32, 256, log=True)),
}


def model_fn(params: dict):
    """A small CNN on 28x28x1 images or an MLP (``units`` wide, default 128) on the 784 flat pixels, compiled
    with Adam(lr)."""
    import keras  # deferred: trainer's quiet settings must be in place when TensorFlow starts

    if params["arch"] == "cnn":
        layers = [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
        ]
    else:
        layers = [keras.Input((784,)), keras.layers.Dense(params.get("units", 128), activation="relu")]
    model = keras.Sequential([*layers, keras.layers.Dense(10, activation="softmax")], name=params["arch"])
    model.compile(optimizer=keras.optimizers.Adam(params["lr"]), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = comparison_parser(__doc__, default_out="results/select_mnist",
                               limit_help="use only the first N training rows",
                               data_help="folder with the MNIST idx files, or a Parquet/CSV file",
                               seed_help="seed of the split, the initial weights and shuffling")
    parser.add_argument("--val-fraction", type=positive_float, default=0.1,
                        help="training rows held out for validation (default 0.1)")
    args = parse_comparison_args(parser, argv)
    if not 0 < args.val_fraction < 1:
        parser.error("--val-fraction must be in (0, 1)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    x_train, y_train, x_test, y_test = load_mnist(args.data, limit=args.limit)
    print(f"MNIST: {len(x_train)} training and {len(x_test)} test images", flush=True)
    workers = 1 if args.strategy_list == ["sequential"] else args.workers
    out = Path(args.out)
    # Hold out the validation rows in numpy (seeded): cheaper than randomSplit on a big local relation.
    order = np.random.default_rng(args.seed).permutation(len(x_train))
    n_val = max(1, round(len(x_train) * args.val_fraction))
    val_idx, train_idx = np.sort(order[:n_val]), np.sort(order[n_val:])

    def make(name: str, seed: int) -> Search:
        search = make_search(name, grid=SPACE, space=SEARCH_SPACE, epochs=args.epochs, max_epochs=args.max_epochs,
                             eta=args.eta, seed=seed, metric="val_accuracy", max_concurrent=args.max_concurrent)
        return first_configs(search, args.max_configs) if name == "grid" else search

    with cluster_session(args.master, workers, args.cores_per_worker, "select-mnist") as spark:
        folder = data_dir(args.data_dir)
        train = scale_pixels(parquet_images(spark, folder, "mnist-train", x_train[train_idx], y_train[train_idx]))
        val = scale_pixels(parquet_images(spark, folder, "mnist-val", x_train[val_idx], y_train[val_idx]))
        test = scale_pixels(parquet_images(spark, folder, "mnist-test", x_test, y_test))
        train, val, test = train.cache(), val.cache(), test.cache()
        print(f"rows: {train.count()} train, {val.count()} validation, {test.count()} test", flush=True)
        if args.compare_searches:
            run_search_comparison(args, model_fn, make, train, val, out, "select_mnist", title="MNIST model selection",
                                  metadata={"job": "select_mnist", "train_rows": len(x_train), **vars(args)})
            return 0
        results = compare_strategies(model_fn, lambda: make(args.search_list[0], args.seed), train, val,
                                     strategies=args.strategy_list, num_workers=args.workers, seed=args.seed,
                                     out_dir=out, verbose=False, tls=args.tls)
        extra = score_best_models(results, "test_accuracy", lambda model: model.evaluate(test)["accuracy"])
    meta = {"job": "select_mnist", "train_rows": len(x_train), **vars(args)}
    valid = timing_valid(args.workers, args.cores_per_worker, args.master)
    write_comparison(results, out, "select_mnist", timing_valid=valid, extra=extra, metadata=meta, title="MNIST model selection")
    return 0


if __name__ == "__main__":
    sys.exit(main())
