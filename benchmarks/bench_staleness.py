"""What staleness costs the default algorithm, with the timing taken out: N workers in one process, in lockstep.

A deterministic simulation of the default algorithm (DOWNPOUR, `trainer.algorithms`) with real Keras and
without Spark: N copies of the model, each with its own optimizer (optimizer state stays local, as in a
fit), each train ``window`` batches of their own shard from their last reply, then commit in turn through
the algorithm's own ``worker_payload`` and ``server_commit``. So every commit's base misses the other workers'
last windows, ``(N - 1) * window`` batches of staleness: the quantity `trainer.algorithms.cadence` bounds
(``STALENESS_BUDGET``). In a fit the interleaving depends on timing (a busy machine, a slow link) and the
same seed ends differently from run to run; here it is fixed, so a window's cost is a property of the
window and the seed, and a few seeds measure it.

The problem is the one where staleness shows: the digits CNN (sklearn's 8x8 digits, 1,500 training and 297
test images; two 3x3 convolutions), 20 epochs, batch 32, Adam at Keras's default rate, near its optimum
after 20 epochs (plain Keras 0.97-0.99), where trajectories summed onto the center overshoot it; the small
problems of `bench_defaults.py` saturate before staleness matters. Plain Keras trains the same initial
weights on all 1,500 images (``plain``). `tests/test_defaults.py` runs it at the bound; docs/algorithms.md
has the table behind the bound.

    python benchmarks/bench_staleness.py --workers 2 --windows 10,6 --seeds 0-9 --out results/staleness
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import numpy as np

from trainer_jobs.support.cli import add_verbose_arg, start_logging
from trainer_jobs.support.report import markdown_table, write_report

EPOCHS, BATCH_SIZE = 20, 32
COLUMNS = ["workers", "window", "staleness_batches", "runs", "accuracy_mean", "accuracy_min", "plain_mean",
           "gap_mean", "below_plain_by_0.005"]


@functools.cache  # every run of plain_keras and simulate reads it; the arrays are only read
def digits() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """sklearn's digits scaled to [0, 1], shuffled once (seed 0): (1,500 training, 297 test) (x, y)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(x))
    train, test = order[:1500], order[1500:]
    return (x[train], data.target[train]), (x[test], data.target[test])


def digits_cnn():
    """Two 3x3 convolutions over the 8x8 digits, Adam at Keras's default rate: near its optimum after 20
    epochs (plain Keras 0.97-0.99)."""
    import keras

    model = keras.Sequential([
        keras.Input((64,)), keras.layers.Reshape((8, 8, 1)),
        keras.layers.Conv2D(16, 3, activation="relu"), keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.Flatten(), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def plain_keras(seed: int, epochs: int = EPOCHS) -> float:
    """Plain ``model.fit`` on all training images from the seed's initial weights: test accuracy."""
    import keras

    (x, y), (xt, yt) = digits()
    keras.utils.set_random_seed(seed)
    model = digits_cnn()
    model.fit(x, y, batch_size=BATCH_SIZE, epochs=epochs, verbose=0)
    return float(model.evaluate(xt, yt, verbose=0, return_dict=True)["accuracy"])


def simulate(workers: int, window: int, seed: int, epochs: int = EPOCHS) -> float:
    """The default algorithm with `workers` workers in lockstep (module docstring): the center's test accuracy.

    Worker i holds rows i, i + N, ...; each epoch it visits them in a seeded order. In each round every
    worker trains `window` batches from its last reply, then they commit in turn; a worker whose epoch is
    over waits for the others."""
    import keras

    from trainer.algorithms import DOWNPOUR

    (x, y), (xt, yt) = digits()
    keras.utils.set_random_seed(seed)  # the first model: the same initial weights as plain_keras's
    models = [digits_cnn() for _ in range(workers)]
    center = [w.copy() for w in models[0].get_weights()]
    anchors = [list(center) for _ in range(workers)]
    for model in models:
        model.set_weights(center)
    algorithm = DOWNPOUR(window=window)
    rng = np.random.default_rng(seed)
    shards = [np.arange(i, len(x), workers) for i in range(workers)]
    for _ in range(epochs):
        batches = []
        for shard in shards:
            order = rng.permutation(shard)
            batches.append([order[k:k + BATCH_SIZE] for k in range(0, len(order), BATCH_SIZE)])
        done = [0] * workers
        while any(d < len(b) for d, b in zip(done, batches)):
            active = [i for i in range(workers) if done[i] < len(batches[i])]
            for i in active:
                for rows in batches[i][done[i]:done[i] + window]:
                    models[i].train_on_batch(x[rows], y[rows])
            for i in active:  # in turn: each base misses the windows the others committed this round
                done[i] += window
                payload = algorithm.worker_payload(models[i].get_weights(), anchors[i])
                center, reply = algorithm.server_commit(center, payload, len(active) - 1)
                models[i].set_weights(reply)
                anchors[i] = list(reply)
    models[0].set_weights(center)
    return float(models[0].evaluate(xt, yt, verbose=0, return_dict=True)["accuracy"])


def summary(workers: int, window: int, ours: list[float], plain: list[float]) -> dict:
    """One table row: a window's runs against plain Keras's on the same seeds."""
    return {"workers": workers, "window": window, "staleness_batches": (workers - 1) * window, "runs": len(ours),
            "accuracy_mean": float(np.mean(ours)), "accuracy_min": float(np.min(ours)),
            "plain_mean": float(np.mean(plain)), "gap_mean": float(np.mean(plain) - np.mean(ours)),
            "below_plain_by_0.005": sum(o < p - 0.005 for o, p in zip(ours, plain, strict=True)),
            "accuracies": ours, "plain": plain}


def parse_seeds(text: str) -> list[int]:
    """``"0-9"`` or ``"0,3,5"``."""
    if "-" in text:
        low, high = (int(v) for v in text.split("-", 1))
        return list(range(low, high + 1))
    return [int(v) for v in text.split(",") if v.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="2", help="worker counts (default 2)")
    parser.add_argument("--windows", default="10,6", help="windows to simulate at each worker count (default 10,6)")
    parser.add_argument("--seeds", default="0-9", help="seeds, '0-9' or '0,3,5' (default 0-9)")
    parser.add_argument("--out", default="results/staleness", help="results directory (default results/staleness)")
    add_verbose_arg(parser)
    args = parser.parse_args(argv)
    try:
        counts = [int(v) for v in args.workers.split(",")]
        windows = [int(v) for v in args.windows.split(",")]
        seeds = parse_seeds(args.seeds)
    except ValueError as exc:
        parser.error(f"--workers, --windows and --seeds take integers: {exc}")
    if min(counts + windows) < 1 or not seeds:
        parser.error("worker counts and windows must be >= 1, and at least one seed given")
    start_logging(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plain = [plain_keras(seed) for seed in seeds]
    rows = []
    for workers in counts:
        for window in windows:
            rows.append(summary(workers, window, [simulate(workers, window, seed) for seed in seeds], plain))
            print(markdown_table(rows[-1:], COLUMNS), flush=True)
    text = write_report(out, "staleness", "What staleness costs the default algorithm (lockstep simulation)",
                        f"the digits CNN, {EPOCHS} epochs, batch {BATCH_SIZE}, seeds {args.seeds}", rows, COLUMNS,
                        {"job": "bench_staleness", **vars(args)})
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
