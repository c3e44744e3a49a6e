"""Spark-side data preparation: a user's numpy images, pandas series and Spark ML columns into the layout
the trainer reads (public API: ``from trainer.data.prep import images_to_dataframe``).

Everything that touches the (potentially big) data runs in Spark -- Arrow for
the hand-over from numpy/pandas, column expressions -- never a round trip
through pandas. The training DataFrames have the layout the trainer consumes:

    features  array<float>   one flattened sample
    label     int | float | array<float>

Functions
    images_to_dataframe(spark, x, y, num_partitions)  numpy images -> DataFrame (Arrow)
    scale_pixels(df, col, factor)                      multiply an array column in Spark
    timeseries_to_dataframe(spark, pdf, time_col)      pandas series -> DataFrame (Arrow,
                                                       time as TIMESTAMP_NTZ: DST-proof)
    to_array_column(df, cols, out)                     scalars / ML vectors / arrays -> array<float>

The bundled forecasting jobs' recipe (min-max scaling that can be inverted,
lag windows of one small series, the last hours held out) is theirs:
``trainer_jobs.support.timeseries``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd  # deferred: only this function needs it
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["images_to_dataframe", "scale_pixels", "timeseries_to_dataframe", "to_array_column"]


def _default_parallelism(spark: "SparkSession") -> int:
    try:
        return max(1, int(spark.sparkContext.defaultParallelism))
    except Exception:  # Spark Connect has no SparkContext
        return max(1, int(spark.conf.get("spark.default.parallelism", "2")))


def _frame_from_arrow(spark: "SparkSession", table, schema=None) -> "DataFrame":
    """``spark.createDataFrame(table)`` for a ``pyarrow.Table``: pyspark 4 takes the table itself; pyspark
    3.5 only pandas, whose Arrow path (on by default in our sessions) still makes no per-row Python objects."""
    import pyspark

    if int(pyspark.__version__.split(".")[0]) >= 4:
        return spark.createDataFrame(table, schema=schema)
    from pyspark.sql.pandas.types import from_arrow_schema

    return spark.createDataFrame(table.to_pandas(), schema=schema or from_arrow_schema(table.schema))


def _require_columns(df: "DataFrame", cols: Iterable[str], what: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ValueError(f"{what}: column(s) {missing} not found; the DataFrame has columns {df.columns}.")


# ------------------------------------------------------------------------- images


def images_to_dataframe(
    spark: "SparkSession",
    x: np.ndarray,
    y: np.ndarray,
    num_partitions: int | None = None,
) -> "DataFrame":
    """Build a DataFrame ``features array<float>, label int`` from numpy arrays via Arrow.

    ``x`` has shape ``(n, ...)`` (e.g. ``(n, 28, 28)`` uint8); every sample is
    flattened in row-major (C) order and cast to float32 WITHOUT scaling (use
    ``scale_pixels`` in Spark, or scale in numpy first). ``y`` holds ``n``
    integer class labels.

    The arrays are handed to the JVM as Arrow record batches (a
    ``pyarrow.Table`` with a ``list`` column, no per-row Python objects);
    integer images in the int16 range travel as int16 (half the bytes of
    float32) and are cast to float in Spark. The result has exactly
    ``num_partitions`` partitions (default: the session's default
    parallelism). When Spark's own partitioning differs -- data above
    ``spark.sql.execution.arrow.localRelationThreshold`` (48 MiB) arrives as
    one partition per ~16 MiB batch -- the rows are dealt round-robin into
    ``num_partitions`` by a shuffle, so the row order is not kept; the shuffle
    output stays on the executors and later jobs reuse it. Call ``.cache()``
    if the DataFrame is read many times.

    Full MNIST (60,000 x 784) on the 2-core development machine, local[2],
    1 GiB driver, other jobs running: the call 0.4-1 s once the JVM is warm
    (about 6 s for the very first one), a ``count()`` 1-2 s more (shuffle
    included); 10k test images about the same.
    """
    import pyarrow as pa
    from pyspark.sql import functions as F

    x = np.asarray(x)
    y = np.asarray(y)
    if x.ndim < 2:
        raise ValueError(f"images_to_dataframe: x must have shape (n, ...) with one sample per row, got shape {x.shape}.")
    n = x.shape[0]
    if y.shape != (n,):
        raise ValueError(
            f"images_to_dataframe: y must have shape ({n},) to match x {x.shape}, got {y.shape}. "
            "Pass class indices, not one-hot rows."
        )
    if n == 0:
        raise ValueError("images_to_dataframe: x and y are empty.")
    if not np.issubdtype(y.dtype, np.integer):
        if not np.all(np.isfinite(y)) or not np.all(np.equal(np.mod(y, 1), 0)):
            raise ValueError(f"images_to_dataframe: y must hold integer class labels, got dtype {y.dtype} with non-integer values.")
    if num_partitions is not None and int(num_partitions) < 1:
        raise ValueError(f"images_to_dataframe: num_partitions must be >= 1 or None, got {num_partitions!r}.")
    parts = int(num_partitions) if num_partitions is not None else _default_parallelism(spark)
    parts = min(parts, n)

    flat = x.reshape(n, -1)
    width = flat.shape[1]
    # Ship the smallest exact type: 0..255 pixels as int16 (Arrow has no
    # unsigned type Spark reads), everything else as float32; Spark casts to
    # float after the shuffle, so only half the bytes cross driver -> executors.
    small_ints = np.issubdtype(flat.dtype, np.integer) and (
        flat.size == 0 or (int(flat.min()) >= np.iinfo(np.int16).min and int(flat.max()) <= np.iinfo(np.int16).max)
    )
    flat = np.ascontiguousarray(flat, dtype=np.int16 if small_ints else np.float32)
    labels = y.astype(np.int32)

    # Local data reaches the executors inside the tasks, one Arrow batch per
    # partition: keep batches small (<= maxRecordsPerBatch rows, ~16 MiB) so
    # no task gets huge, and shuffle into `parts` partitions afterwards.
    max_rows = int(spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch", "10000") or 0)
    rows_per_batch = max(1, (16 << 20) // max(1, width * flat.itemsize))
    if max_rows > 0:
        rows_per_batch = min(rows_per_batch, max_rows)
    offsets_all = np.arange(0, n * width + 1, width, dtype=np.int64)
    batches = []
    for start in range(0, n, rows_per_batch):
        stop = min(n, start + rows_per_batch)
        offsets = pa.array((offsets_all[start : stop + 1] - offsets_all[start]).astype(np.int32))
        feats = pa.ListArray.from_arrays(offsets, pa.array(flat[start:stop].reshape(-1)))
        batches.append(pa.RecordBatch.from_arrays([feats, pa.array(labels[start:stop])], names=["features", "label"]))
    df = _frame_from_arrow(spark, pa.Table.from_batches(batches))
    # Above spark.sql.execution.arrow.localRelationThreshold (48 MiB) every batch
    # is one partition; below it Spark makes a local relation sliced into the
    # default parallelism. Coalescing would put several batches in one task
    # (driver OOM for full MNIST with a 1 GiB driver), so shuffle instead.
    if df.rdd.getNumPartitions() != parts:
        df = df.repartition(parts)
    return df.withColumn("features", F.col("features").cast("array<float>"))


def scale_pixels(df: "DataFrame", col: str = "features", factor: float = 1.0 / 255.0) -> "DataFrame":
    """Multiply every element of the array column ``col`` by ``factor`` in Spark (float result)."""
    from pyspark.sql import functions as F

    _require_columns(df, [col], "scale_pixels")
    return df.withColumn(col, F.transform(F.col(col), lambda v: (v * F.lit(float(factor))).cast("float")))


# ------------------------------------------------------------- pandas series


def timeseries_to_dataframe(
    spark: "SparkSession",
    pdf: "pd.DataFrame",
    time_col: str = "time",
    num_partitions: int | None = None,
) -> "DataFrame":
    """Hand a (small) pandas time series to Spark via Arrow, time as ``TIMESTAMP_NTZ``.

    A naive pandas ``datetime64`` column becomes a wall-clock
    ``timestamp_ntz`` column, so the result does not depend on
    ``spark.sql.session.timeZone``: hours that do not exist or repeat in the
    session's zone (daylight-saving changes) stay distinct and one hour apart.
    Time-zone-aware columns keep their instants (``timestamp``). Other columns
    keep their Arrow-mapped types (float64 -> double, int64 -> bigint). The
    rows are not shuffled unless ``num_partitions`` is given.
    """
    import pandas as pd  # deferred: only this function needs it
    import pyarrow as pa
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import from_arrow_type

    if time_col not in pdf.columns:
        raise ValueError(f"timeseries_to_dataframe: no column {time_col!r}; found {list(pdf.columns)}.")
    if not pd.api.types.is_datetime64_any_dtype(pdf[time_col]):
        raise ValueError(f"timeseries_to_dataframe: column {time_col!r} must be datetime64, got {pdf[time_col].dtype}.")
    table = pa.Table.from_pandas(pdf, preserve_index=False)
    fields = []
    for name, arrow_field in zip(table.column_names, table.schema):
        if pa.types.is_timestamp(arrow_field.type):
            spark_type = T.TimestampType() if arrow_field.type.tz else T.TimestampNTZType()
            table = table.set_column(table.column_names.index(name), name, table.column(name).cast(pa.timestamp("us", arrow_field.type.tz)))
        else:
            spark_type = from_arrow_type(arrow_field.type)
        fields.append(T.StructField(name, spark_type, True))
    df = _frame_from_arrow(spark, table, schema=T.StructType(fields))
    return df.repartition(int(num_partitions)) if num_partitions else df


# ------------------------------------------------------------- Spark ML columns


def to_array_column(df: "DataFrame", cols: str | Sequence[str], out: str) -> "DataFrame":
    """Add ``out`` as array<float> from ``cols``, concatenated in the given order.

    Each column may be a scalar number (or boolean) -> one element, a Spark ML
    ``Vector`` (dense or sparse; ``pyspark.ml.functions.vector_to_array``) ->
    its elements, or a numeric array -> its elements.
    """
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    cols = [cols] if isinstance(cols, str) else list(cols)
    if not cols:
        raise ValueError("to_array_column: give at least one column.")
    _require_columns(df, cols, "to_array_column")
    parts = []
    for c in cols:
        dtype = df.schema[c].dataType
        if isinstance(dtype, VectorUDT):
            parts.append(vector_to_array(F.col(c), "float32"))
        elif isinstance(dtype, T.ArrayType) and isinstance(dtype.elementType, (T.NumericType, T.BooleanType)):
            parts.append(F.col(c).cast("array<float>"))
        elif isinstance(dtype, (T.NumericType, T.BooleanType)):
            parts.append(F.array(F.col(c).cast("float")))
        else:
            raise TypeError(
                f"to_array_column: column {c!r} has type {dtype.simpleString()}; expected a number, "
                "a numeric array or a Spark ML Vector."
            )
    return df.withColumn(out, parts[0] if len(parts) == 1 else F.concat(*parts))
