"""The forecasting jobs' recipe on the shared test cluster (trainer_jobs.support.timeseries): exact window
values, min-max round trip, last-hours split, the elecdemand pipeline."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pytest

from trainer.data.prep import timeseries_to_dataframe
from trainer_jobs.support.timeseries import FittedMinMax, MinMax, make_windows, train_test_split_last

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

T0 = dt.datetime(2016, 2, 1, 0, 0)


def _series(n, drop=(), null_temp=()):
    """Hourly rows i = 0..n-1: load 10*i, temperature 100+i (None at null_temp)."""
    return pd.DataFrame(
        {
            "time": [T0 + dt.timedelta(hours=i) for i in range(n) if i not in drop],
            "load": [10.0 * i for i in range(n) if i not in drop],
            "temperature": [None if i in null_temp else 100.0 + i for i in range(n) if i not in drop],
        }
    ).astype({"temperature": "float64"})


def _hour(row):
    return int((row.time - T0).total_seconds() // 3600)


# ------------------------------------------------------------------------ windows


def test_make_windows_exact_values(spark):
    df = timeseries_to_dataframe(spark, _series(10))
    out = make_windows(df, "time", ["load", "temperature"], "load", n_in=3, n_out=1)
    assert out.schema.simpleString() == "struct<time:timestamp_ntz,features:array<float>,label:float>"
    rows = sorted(out.collect(), key=_hour)
    assert [_hour(r) for r in rows] == [3, 4, 5, 6, 7, 8, 9]
    first = rows[0]
    # time-major: (load, temperature) at t-3, t-2, t-1
    assert first.features == [0.0, 100.0, 10.0, 101.0, 20.0, 102.0]
    assert first.label == 30.0
    for r in rows:
        t = _hour(r)
        expected = np.array([[10.0 * k, 100.0 + k] for k in (t - 3, t - 2, t - 1)])
        np.testing.assert_array_equal(np.reshape(r.features, (3, 2)), expected)
        assert r.label == 10.0 * t
    assert out.rdd.getNumPartitions() == spark.sparkContext.defaultParallelism  # repartitioned after the global window


def test_make_windows_multi_step_label(spark):
    df = timeseries_to_dataframe(spark, _series(8))
    rows = sorted(make_windows(df, "time", ["load"], "load", n_in=2, n_out=3, num_partitions=1).collect(), key=_hour)
    assert [_hour(r) for r in rows] == [2, 3, 4, 5]  # last n_out - 1 rows dropped
    assert rows[0].features == [0.0, 10.0]
    assert rows[0].label == [20.0, 30.0, 40.0]
    assert rows[-1].label == [50.0, 60.0, 70.0]


def test_make_windows_drops_gaps_and_nulls(spark):
    df = timeseries_to_dataframe(spark, _series(10, drop={5}))
    rows = make_windows(df, "time", ["load", "temperature"], "load", n_in=3).collect()
    assert sorted(_hour(r) for r in rows) == [3, 4, 9]  # windows spanning the missing hour 5 are gone
    # without the time check, rows are just consecutive
    loose = make_windows(df, "time", ["load"], "load", n_in=3, step_seconds=None).collect()
    assert sorted(_hour(r) for r in loose) == [3, 4, 6, 7, 8, 9]
    df = timeseries_to_dataframe(spark, _series(10, null_temp={6}))
    rows = make_windows(df, "time", ["load", "temperature"], "load", n_in=3).collect()
    assert sorted(_hour(r) for r in rows) == [3, 4, 5, 6]  # windows with hour 6 among the inputs (7, 8, 9) dropped


def test_make_windows_dst_safe_in_any_session_zone(spark):
    # 2016-03-13 02:00 does not exist in New York; wall-clock NTZ keeps 24 distinct hours.
    pdf = pd.DataFrame(
        {"time": pd.date_range("2016-03-13 00:00", periods=24, freq="h"), "load": np.arange(24.0)}
    )
    previous = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        df = timeseries_to_dataframe(spark, pdf)
        assert df.count() == 24
        assert make_windows(df, "time", ["load"], "load", n_in=4).count() == 20
        train, test = train_test_split_last(df, "time", hours=5)
        assert sorted(r.load for r in test.collect()) == [19.0, 20.0, 21.0, 22.0, 23.0]
        assert train.count() == 19
    finally:
        spark.conf.set("spark.sql.session.timeZone", previous)


def test_make_windows_errors(spark):
    df = timeseries_to_dataframe(spark, _series(4))
    with pytest.raises(ValueError, match=r"column\(s\) \['nope'\] not found"):
        make_windows(df, "time", ["nope"], "load")
    with pytest.raises(ValueError, match="n_in and n_out"):
        make_windows(df, "time", ["load"], "load", n_in=0)


# -------------------------------------------------------------- split and scaling


def test_train_test_split_last_120_hours(spark):
    df = timeseries_to_dataframe(spark, _series(200))
    train, test = train_test_split_last(df, "time", hours=120)
    train_rows, test_rows = train.collect(), test.collect()
    assert len(test_rows) == 120 and len(train_rows) == 80
    assert max(_hour(r) for r in train_rows) == 79 < min(_hour(r) for r in test_rows) == 80
    # a timestamp (LTZ) column gives the same split
    ltz = df.withColumn("time", df["time"].cast("timestamp"))
    assert train_test_split_last(ltz, "time", hours=120)[1].count() == 120


def test_minmax_fit_transform_inverse_round_trip(spark):
    pdf = _series(50)
    pdf["flat"] = 7.0
    df = timeseries_to_dataframe(spark, pdf)
    fitted = MinMax(["load", "temperature", "flat"]).fit(df)
    assert fitted.mins == {"load": 0.0, "temperature": 100.0, "flat": 7.0}
    assert fitted.maxs == {"load": 490.0, "temperature": 149.0, "flat": 7.0}
    rows = sorted(fitted.transform(df).collect(), key=_hour)
    scaled = np.array([r.load for r in rows])
    assert scaled.min() == 0.0 and scaled.max() == 1.0
    np.testing.assert_allclose(scaled, pdf["load"] / 490.0)
    np.testing.assert_allclose(fitted.inverse(scaled, "load"), pdf["load"], atol=1e-9)
    temperature = fitted.scale(pdf["temperature"], "temperature")
    np.testing.assert_allclose(fitted.inverse(temperature, "temperature"), pdf["temperature"])
    assert {r.flat for r in rows} == {0.0}  # constant column -> lower bound
    assert fitted.inverse([0.0], "flat").tolist() == [7.0]
    # other feature range, and the dict round trip
    wide = MinMax("load", feature_range=(-1, 1)).fit(df)
    assert wide.scale([0.0, 245.0, 490.0]).tolist() == [-1.0, 0.0, 1.0]
    again = FittedMinMax.from_dict(wide.to_dict())
    assert again.inverse(np.array([[-1.0], [1.0]])).tolist() == [[0.0], [490.0]]
    with pytest.raises(ValueError, match="name the column"):
        fitted.inverse([0.5])
    with pytest.raises(ValueError, match="no non-null values"):
        MinMax(["load"]).fit(df.limit(0))


def test_elecdemand_forecast_pipeline(spark):
    from trainer_jobs.support.datasets import load_elecdemand

    pdf = load_elecdemand()
    series = timeseries_to_dataframe(spark, pdf)
    raw_train, _ = train_test_split_last(series, "time", hours=120)
    scaler = MinMax(["load", "temperature"]).fit(raw_train)  # statistics of training hours only
    windows = make_windows(scaler.transform(series), "time", ["load", "temperature"], "load", n_in=24)
    train, test = train_test_split_last(windows, "time", hours=120)
    assert windows.count() == 8_760 - 24
    test_rows = sorted(test.collect(), key=lambda r: r.time)
    assert len(test_rows) == 120 and train.count() == 8_760 - 24 - 120
    assert test_rows[-1].time == dt.datetime(2014, 12, 31, 23, 0)
    assert len(test_rows[0].features) == 48
    expected = pdf["load"].iloc[-120:].to_numpy()
    np.testing.assert_allclose(scaler.inverse([r.label for r in test_rows], "load"), expected, rtol=1e-6)
