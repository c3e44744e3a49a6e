"""Spark-side preparation on the shared test cluster (trainer.data.prep): pandas series with DST-proof time,
array columns, images via Arrow."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest

from trainer.data.prep import images_to_dataframe, scale_pixels, timeseries_to_dataframe, to_array_column

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

# ------------------------------------------------------------------ pandas series


def test_timeseries_to_dataframe_keeps_wall_clock_hours_in_any_session_zone(spark):
    # 2016-03-13 02:00 does not exist in New York; wall-clock NTZ keeps 24 distinct hours, one hour apart.
    pdf = pd.DataFrame({"time": pd.date_range("2016-03-13 00:00", periods=24, freq="h"), "load": np.arange(24.0)})
    previous = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        df = timeseries_to_dataframe(spark, pdf)
        assert df.schema.simpleString() == "struct<time:timestamp_ntz,load:double>"
        rows = sorted(df.collect(), key=lambda r: r.time)
        assert [r.time for r in rows] == list(pdf["time"].dt.to_pydatetime())
        assert [r.load for r in rows] == list(range(24))
    finally:
        spark.conf.set("spark.sql.session.timeZone", previous)
    aware = pdf.assign(time=pdf["time"].dt.tz_localize("UTC"))
    assert timeseries_to_dataframe(spark, aware, num_partitions=2).schema["time"].dataType.simpleString() == "timestamp"
    with pytest.raises(ValueError, match="must be datetime64"):
        timeseries_to_dataframe(spark, pdf.assign(time=pdf["load"]))


# ----------------------------------------------------------------- array columns


def test_to_array_column_scalars_vectors_arrays(spark):
    from pyspark.ml.feature import VectorAssembler
    from pyspark.ml.linalg import SparseVector

    df = spark.createDataFrame([(1.0, 2, [3.0, 4.0]), (5.0, 6, [7.0, 8.0])], "a double, b int, c array<double>")
    out = to_array_column(df, ["a", "b"], "ab")
    assert [r.ab for r in out.collect()] == [[1.0, 2.0], [5.0, 6.0]]
    vec = VectorAssembler(inputCols=["a", "b"], outputCol="v").transform(df)
    out = to_array_column(vec, ["v", "c", "a"], "all")
    assert out.schema["all"].dataType.simpleString() == "array<float>"
    assert [r.all for r in out.collect()] == [[1.0, 2.0, 3.0, 4.0, 1.0], [5.0, 6.0, 7.0, 8.0, 5.0]]
    sparse = spark.createDataFrame([(SparseVector(4, {1: 2.5}),)], ["s"])
    assert to_array_column(sparse, "s", "x").first().x == [0.0, 2.5, 0.0, 0.0]
    with pytest.raises(TypeError, match="expected a number"):
        to_array_column(spark.createDataFrame([("x",)], ["s"]), "s", "x")


# ------------------------------------------------------------------------- images


def test_images_to_dataframe_small_exact(spark):
    x = np.arange(10 * 2 * 3, dtype=np.uint8).reshape(10, 2, 3) * 4  # up to 236: not an int8
    y = np.arange(10)  # unique labels identify the rows
    expected = {int(label): image.reshape(-1).astype(float).tolist() for label, image in zip(y, x)}
    for parts in (1, 2, 3):
        df = images_to_dataframe(spark, x, y, num_partitions=parts)
        assert df.schema.simpleString() == "struct<features:array<float>,label:int>"
        assert df.rdd.getNumPartitions() == parts
        assert {r.label: r.features for r in df.collect()} == expected
    default = spark.sparkContext.defaultParallelism
    rows = images_to_dataframe(spark, x, y, num_partitions=default).collect()  # no shuffle: order kept
    assert [r.label for r in rows] == y.tolist()
    scaled = scale_pixels(images_to_dataframe(spark, x, y), "features", 0.5).collect()
    assert {r.label: r.features for r in scaled}[1] == (x[1].reshape(-1) * 0.5).tolist()
    floats = images_to_dataframe(spark, x / 255.0, y).collect()  # float input travels as float32
    assert floats[1].features == pytest.approx((x[1].reshape(-1) / 255.0).tolist(), rel=1e-6)
    # many small Arrow batches still end in the requested partitions
    previous = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "2")
    try:
        df = images_to_dataframe(spark, x, y, num_partitions=2)
        assert df.rdd.getNumPartitions() == 2
        assert sorted(r.label for r in df.collect()) == y.tolist()
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", previous)
    with pytest.raises(ValueError, match=r"y must have shape \(10,\)"):
        images_to_dataframe(spark, x, np.eye(10))
    with pytest.raises(ValueError, match="integer class labels"):
        images_to_dataframe(spark, x, y + 0.5)


def test_images_to_dataframe_full_mnist_is_fast(spark):
    from pyspark.sql import functions as F

    from trainer_jobs.support.datasets import load_mnist

    x_train, y_train, _, _ = load_mnist()
    start = time.perf_counter()
    df = scale_pixels(images_to_dataframe(spark, x_train, y_train))
    built = time.perf_counter() - start
    stats = df.select(
        F.count("*").alias("n"),
        F.sum("label").alias("labels"),
        F.sum(F.aggregate("features", F.lit(0.0), lambda acc, v: acc + v)).alias("pixels"),
        F.max(F.array_max("features")).alias("max"),
    ).first()
    total = time.perf_counter() - start
    assert stats.n == 60_000
    assert stats.labels == int(y_train.sum())
    assert stats.pixels == pytest.approx(1_567_298_545 / 255, rel=1e-6)
    assert stats.max == pytest.approx(1.0)
    assert df.rdd.getNumPartitions() == spark.sparkContext.defaultParallelism
    # Arrow batches, no per-row Python objects: 0.4-6 s here, against more than ten minutes for 47 million
    # Python floats row by row; the bounds leave room for a loaded machine.
    assert built < 120, f"building the DataFrame took {built:.1f} s"
    assert total < 600, f"build + one pass over 60k x 784 took {total:.1f} s"
