"""The first fit with the defaults against plain Keras: small problems a new user tries, 1 to 8 workers.

``Trainer(build, num_workers=N, epochs=3, batch_size=32).fit(df)`` with no algorithm named (the default
algorithm: DOWNPOUR with an automatic window, docs/algorithms.md) against plain ``model.fit`` on the same rows,
same epochs, same compiled optimizer (Adam at Keras's default rate), on three problems a Dense(16) network
learns in 3 epochs:

* ``binary``: 10,000 rows of 10 features, a noisy almost-linear boundary;
* ``classes``: 10,000 rows of 8 features, 4 overlapping Gaussian classes;
* ``regression``: 10,000 rows of 10 features, a linear target with two nonlinear terms and noise, standardized.

Each is large enough for plain Keras to settle in 3 epochs: over 5 seeds of plain Keras its accuracy moved by
at most 0.004 and its loss by at most 1.06x, so a comparison against one plain run means something (with 3,000
rows the loss of plain Keras alone moved by 1.4x from seed to seed). The initial weights are the same on both
sides (Keras seeded before the model is built). Quality is measured on 2,000 held-out rows of each: accuracy (classification) and the loss (cross-entropy or
MSE). A run is within the bounds when its accuracy is at most 0.02 below plain Keras's and its loss at most
1.2x plain Keras's (``within``). More workers than cores share them (time-shared): only quality is
measured here, never speed. `tests/test_defaults.py` runs it in `make test`: every problem at 2 workers, and
``binary`` at 8 (``--largest-problems binary``: the staleness bound holds the window at one batch there).

``--algorithm allreduce`` holds `AllReduce` with its defaults (the compiled rate scaled to the global batch)
to the same bounds, under the Keras backend of ``--backend`` (or KERAS_BACKEND). Several algorithms run on one
cluster, one after the other in the order given, each over its problems (``--allreduce-problems`` narrows
all-reduce's), every problem's plain Keras run trained once: `make test` runs
``--algorithm allreduce,localsgd,default`` under TensorFlow. All-reduce goes first: at 8 workers its 8 training
processes start beside Python workers that have not loaded TensorFlow for the default algorithm's fits yet (the
other order kept 8 such workers alive beside them, and a `.ci/run` lost a JVM to the out-of-memory killer).

    python benchmarks/bench_defaults.py --workers 1,2,4,8 --out results/defaults
    python benchmarks/bench_defaults.py --workers 1,2,4,8 --algorithm allreduce --backend torch
    python benchmarks/bench_defaults.py --workers 2,8 --algorithm allreduce,localsgd,default \
        --allreduce-problems regression --localsgd-problems classes --largest-problems binary
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from trainer import Trainer
from trainer_jobs.support.cli import add_verbose_arg, parse_workers, start_logging
from trainer_jobs.support.report import markdown_table, write_report
from trainer_jobs.support.scaling import cluster_session

PROBLEMS = ("binary", "classes", "regression")
ACCURACY_GAP = 0.02
LOSS_RATIO = 1.2
ALGORITHMS = ("default", "allreduce", "localsgd")
COLUMNS = ["algorithm", "problem", "workers", "plain_accuracy", "accuracy", "plain_loss", "loss", "loss_ratio", "window",
           "within"]


ROWS, TEST_ROWS = 10_000, 2_000


def make_problem(kind: str, seed: int = 0) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """((x, y) training rows, (x, y) test rows) of one problem (module docstring)."""
    rng = np.random.default_rng(seed)
    n, total = ROWS, ROWS + TEST_ROWS
    if kind == "binary":
        d = 10
        x = rng.normal(size=(total, d)).astype(np.float32)
        logits = x @ rng.normal(size=d) + 0.5 * np.sin(3 * x[:, 0])
        y = (logits + rng.normal(scale=0.5, size=total) > 0).astype(np.int32)
    elif kind == "classes":
        d = 8
        centers = rng.normal(scale=1.0, size=(4, d))
        y = rng.integers(0, 4, size=total).astype(np.int32)
        x = (centers[y] + rng.normal(size=(total, d))).astype(np.float32)
    elif kind == "regression":
        d = 10
        x = rng.normal(size=(total, d)).astype(np.float32)
        raw = x @ (2 * rng.normal(size=d)) + 2 * np.sin(2 * x[:, 1]) + x[:, 2] ** 2 + rng.normal(scale=4.0, size=total)
        y = ((raw - raw[:n].mean()) / raw[:n].std()).astype(np.float32)
    else:
        raise ValueError(f"Unknown problem {kind!r}. Expected one of: {', '.join(PROBLEMS)}.")
    return (x[:n], y[:n]), (x[n:], y[n:])


def builder(kind: str, features: int):
    """A function building the problem's compiled Dense(16) network (Adam at Keras's default rate)."""

    def build():
        import keras

        out, loss, metrics = {
            "binary": (keras.layers.Dense(1, activation="sigmoid"), "binary_crossentropy", ["accuracy"]),
            "classes": (keras.layers.Dense(4, activation="softmax"), "sparse_categorical_crossentropy", ["accuracy"]),
            "regression": (keras.layers.Dense(1), "mse", []),
        }[kind]
        model = keras.Sequential([keras.Input((features,)), keras.layers.Dense(16, activation="relu"), out])
        model.compile(optimizer="adam", loss=loss, metrics=metrics)
        return model

    return build


def plain_keras(kind: str, epochs: int, batch_size: int, seed: int) -> dict[str, float]:
    """Plain ``model.fit`` in this process: the problem's test metrics."""
    import keras

    (x, y), (xt, yt) = make_problem(kind, seed)
    keras.utils.set_random_seed(seed)  # the same initial weights as the distributed fit's (main)
    model = builder(kind, x.shape[1])()
    model.fit(x, y, batch_size=batch_size, epochs=epochs, verbose=0)
    return {k: float(v) for k, v in model.evaluate(xt, yt, verbose=0, return_dict=True).items()}


def frames(spark, kind: str, seed: int):
    """The problem's training and test rows as DataFrames (features array<float>, label)."""
    (x, y), (xt, yt) = make_problem(kind, seed)
    label = "label float" if kind == "regression" else "label int"

    def frame(a, b):
        return spark.createDataFrame([(r.tolist(), v.item()) for r, v in zip(a, b)],
                                     f"features array<float>, {label}").cache()

    return frame(x, y), frame(xt, yt)


def compare(kind: str, workers: int, plain: dict, ours: dict, window) -> dict:
    """One row: ours against plain Keras, and whether it is within the bounds."""
    row = {"problem": kind, "workers": workers, "plain_loss": plain["loss"], "loss": ours["loss"],
           "loss_ratio": ours["loss"] / plain["loss"], "window": window}
    within = row["loss_ratio"] <= LOSS_RATIO
    if "accuracy" in plain:
        row.update(plain_accuracy=plain["accuracy"], accuracy=ours["accuracy"])
        within = within and ours["accuracy"] >= plain["accuracy"] - ACCURACY_GAP
    row["within"] = bool(within)
    return row


def _names(parser, what: str, text: str, known: tuple[str, ...]) -> list[str]:
    names = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in names if k not in known]
    if unknown or not names:
        parser.error(f"unknown {what}(s) {', '.join(unknown) or '(none)'}; expected {', '.join(known)}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="1,2,4,8", help="worker counts (default 1,2,4,8)")
    parser.add_argument("--problems", default=",".join(PROBLEMS), help=f"comma-separated ({', '.join(PROBLEMS)})")
    parser.add_argument("--epochs", type=int, default=3, help="epochs (default 3)")
    parser.add_argument("--batch-size", type=int, default=32, help="minibatch per worker (default 32)")
    parser.add_argument("--seed", type=int, default=0, help="data and model seed (default 0)")
    parser.add_argument("--algorithm", default="default",
                        help="the algorithm(s), comma-separated: default (the Trainer's, no algorithm named), "
                             "allreduce and/or localsgd (default: default)")
    parser.add_argument("--allreduce-problems", help="the problems of allreduce (default: --problems)")
    parser.add_argument("--localsgd-problems", help="the problems of localsgd (default: --problems)")
    parser.add_argument("--largest-problems",
                        help="the only problems that run at the largest worker count, for every algorithm "
                             "(default: all of each algorithm's)")
    parser.add_argument("--out", default="results/defaults", help="results directory (default results/defaults)")
    add_verbose_arg(parser)
    args = parser.parse_args(argv)
    try:
        counts = parse_workers(args.workers)
    except ValueError as exc:
        parser.error(str(exc))
    algorithms = _names(parser, "algorithm", args.algorithm, ALGORITHMS)
    problems = {"default": _names(parser, "problem", args.problems, PROBLEMS)}
    problems["allreduce"] = _names(parser, "problem", args.allreduce_problems or args.problems, PROBLEMS)
    problems["localsgd"] = _names(parser, "problem", args.localsgd_problems or args.problems, PROBLEMS)
    largest = set(_names(parser, "problem", args.largest_problems, PROBLEMS)) if args.largest_problems else None
    start_logging(args)
    import keras  # after start_logging: --backend is set before Keras starts

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    slots = max(counts)
    with cluster_session(None, 2 if slots > 1 else 1, max(1, (slots + 1) // 2), "defaults") as spark:
        prepared: dict[str, tuple] = {}  # per problem, once for every algorithm: plain Keras, the frames, the width
        for algorithm, kind in [(a, k) for a in algorithms for k in PROBLEMS if k in problems[a]]:
            if kind not in prepared:
                train, test = frames(spark, kind, args.seed)
                prepared[kind] = (plain_keras(kind, args.epochs, args.batch_size, args.seed), train, test,
                                  len(train.first()["features"]))
            plain, train, test, features = prepared[kind]
            for n in counts:
                if largest is not None and n == max(counts) and kind not in largest:
                    continue
                started = time.time()
                keras.utils.set_random_seed(args.seed)  # the driver builds the initial center as plain Keras did
                named = {} if algorithm == "default" else {"algorithm": algorithm}
                fitted = Trainer(builder(kind, features), num_workers=n, epochs=args.epochs,
                                 batch_size=args.batch_size, seed=args.seed, verbose=False, **named).fit(train)
                # the parameter server's last window, or local SGD's period: the batches between two exchanges
                windows = [(w.get("window") or {}).get("last") or w.get("period") for w in fitted.history.workers]
                rows.append({"algorithm": algorithm, **compare(kind, n, plain, fitted.evaluate(test),
                                                              max((w for w in windows if w), default=1))})
                rows[-1]["seconds"] = time.time() - started
                print(markdown_table(rows[-1:], COLUMNS), flush=True)
    text = write_report(out, "defaults", "The defaults against plain Keras",
                        f"{args.epochs} epochs, batch {args.batch_size}, seed {args.seed}; within: accuracy at most "
                        f"{ACCURACY_GAP} below plain Keras's and loss at most {LOSS_RATIO}x", rows, COLUMNS,
                        {"job": "bench_defaults", **vars(args), "keras_backend": keras.backend.backend()})
    print(text)
    return 0 if all(r["within"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
