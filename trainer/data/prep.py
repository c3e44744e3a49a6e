"""Spark-side data preparation: images and time series into training DataFrames.

Everything that touches the (potentially big) data runs in Spark -- Arrow for
the hand-over from numpy/pandas, column expressions, one aggregation for the
min/max statistics, window functions for lag features -- never a round trip
through pandas. The training DataFrames this module produces have the layout
the trainer consumes:

    features  array<float>   one flattened sample
    label     int | float | array<float>

Functions
    images_to_dataframe(spark, x, y, num_partitions)  numpy images -> DataFrame (Arrow)
    scale_pixels(df, col, factor)                      multiply an array column in Spark
    timeseries_to_dataframe(spark, pdf, time_col)      pandas series -> DataFrame (Arrow,
                                                       time as TIMESTAMP_NTZ: DST-proof)
    MinMax(cols).fit(df) -> FittedMinMax               min-max scaling that can be inverted
    make_windows(df, time_col, value_cols, target_col, n_in, n_out)
                                                       lag features with Window + lag/lead
    train_test_split_last(df, time_col, hours)         hold out the last hours
    to_array_column(df, cols, out)                     scalars / ML vectors / arrays -> array<float>

Forecasting recipe (what the energy benchmark does)::

    series = timeseries_to_dataframe(spark, load_elecdemand())
    raw_train, _ = train_test_split_last(series, "time", hours=120)
    scaler = MinMax(["load", "temperature"]).fit(raw_train)   # training hours only
    windows = make_windows(scaler.transform(series), "time",
                           ["load", "temperature"], "load", n_in=24)
    train, test = train_test_split_last(windows, "time", hours=120)
    ...                                                       # fit, predict test
    mape(scaler.inverse(y_test, "load"), scaler.inverse(y_pred, "load"))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd  # deferred: only this function needs it
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = [
    "images_to_dataframe",
    "scale_pixels",
    "timeseries_to_dataframe",
    "MinMax",
    "FittedMinMax",
    "make_windows",
    "train_test_split_last",
    "to_array_column",
    "epoch_seconds",
]


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


# -------------------------------------------------------------------- time series


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
    rows are not shuffled unless ``num_partitions`` is given (``make_windows``
    gathers the series into one partition anyway).
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


def epoch_seconds(df: "DataFrame", time_col: str) -> "Column":
    """A Column with the time column as seconds since 1970-01-01 (double).

    ``timestamp`` -> true instant; ``timestamp_ntz`` -> wall-clock arithmetic
    (date * 86400 + h/m/s, whole seconds, independent of the session time
    zone); ``date`` -> days * 86400; numeric columns are taken as seconds.
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    _require_columns(df, [time_col], "epoch_seconds")
    dtype = df.schema[time_col].dataType
    c = F.col(time_col)
    if isinstance(dtype, T.TimestampNTZType):
        return (
            F.unix_date(F.to_date(c)).cast("double") * 86400.0
            + F.hour(c) * 3600.0
            + F.minute(c) * 60.0
            + F.second(c).cast("double")
        )
    if isinstance(dtype, T.TimestampType):
        return F.unix_micros(c).cast("double") / 1e6
    if isinstance(dtype, T.DateType):
        return F.unix_date(c).cast("double") * 86400.0
    if isinstance(dtype, T.NumericType):
        return c.cast("double")
    raise TypeError(
        f"column {time_col!r} has type {dtype.simpleString()}; expected timestamp, timestamp_ntz, date "
        "or a numeric (epoch seconds) column."
    )


@dataclass
class FittedMinMax:
    """Per-column min/max learnt by ``MinMax.fit``: apply in Spark, invert in numpy.

    ``transform(df)`` rewrites each fitted column in place as
    ``lo + (x - min) * (hi - lo) / (max - min)`` (double); a constant column
    (max == min) maps to ``lo``. ``inverse(values, col)`` maps scaled values
    (e.g. model predictions) back to original units.
    """

    mins: dict[str, float]
    maxs: dict[str, float]
    feature_range: tuple[float, float] = (0.0, 1.0)
    cols: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.cols:
            self.cols = list(self.mins)
        self.feature_range = (float(self.feature_range[0]), float(self.feature_range[1]))

    def _col(self, col: str | None) -> str:
        if col is None:
            if len(self.cols) != 1:
                raise ValueError(f"FittedMinMax was fitted on {self.cols}; name the column to use (col=...).")
            return self.cols[0]
        if col not in self.mins:
            raise KeyError(f"FittedMinMax has no statistics for column {col!r}; fitted columns: {self.cols}.")
        return col

    def _ratio(self, col: str) -> float:
        span = self.maxs[col] - self.mins[col]
        lo, hi = self.feature_range
        return (hi - lo) / span if span else 0.0

    def transform(self, df: "DataFrame") -> "DataFrame":
        from pyspark.sql import functions as F

        _require_columns(df, self.cols, "FittedMinMax.transform")
        lo = self.feature_range[0]
        return df.withColumns(
            {
                c: F.lit(lo) + (F.col(c).cast("double") - F.lit(self.mins[c])) * F.lit(self._ratio(c))
                for c in self.cols
            }
        )

    def scale(self, values, col: str | None = None) -> np.ndarray:
        """Forward scaling in numpy (same formula as ``transform``)."""
        col = self._col(col)
        v = np.asarray(values, dtype=np.float64)
        return self.feature_range[0] + (v - self.mins[col]) * self._ratio(col)

    def inverse(self, values, col: str | None = None) -> np.ndarray:
        """Map scaled values back to the original units of ``col`` (any shape, float64)."""
        col = self._col(col)
        lo, hi = self.feature_range
        v = np.asarray(values, dtype=np.float64)
        return self.mins[col] + (v - lo) * (self.maxs[col] - self.mins[col]) / (hi - lo)

    def to_dict(self) -> dict:
        return {"mins": dict(self.mins), "maxs": dict(self.maxs), "feature_range": list(self.feature_range), "cols": list(self.cols)}

    @classmethod
    def from_dict(cls, data: dict) -> "FittedMinMax":
        return cls(
            mins={k: float(v) for k, v in data["mins"].items()},
            maxs={k: float(v) for k, v in data["maxs"].items()},
            feature_range=tuple(data.get("feature_range", (0.0, 1.0))),
            cols=list(data.get("cols", data["mins"])),
        )


@dataclass
class MinMax:
    """Min-max scaling of scalar numeric columns, fitted with ONE Spark aggregation.

    ``MinMax(["load", "temperature"]).fit(train_df)`` returns a
    ``FittedMinMax`` holding each column's min and max, so that model outputs
    can be inverted to original units for reporting (Spark ML's
    ``MinMaxScaler`` needs an assembled vector column and is awkward to invert;
    this keeps plain columns). Fit on the training rows only to avoid leaking
    test statistics; nulls are ignored.
    """

    cols: Sequence[str]
    feature_range: tuple[float, float] = (0.0, 1.0)

    def fit(self, df: "DataFrame") -> FittedMinMax:
        from pyspark.sql import functions as F

        cols = [self.cols] if isinstance(self.cols, str) else list(self.cols)
        if not cols:
            raise ValueError("MinMax: give at least one column to scale.")
        lo, hi = self.feature_range
        if not hi > lo:
            raise ValueError(f"MinMax: feature_range must be (lo, hi) with hi > lo, got {self.feature_range}.")
        _require_columns(df, cols, "MinMax.fit")
        aggs = []
        for c in cols:
            aggs += [F.min(F.col(c).cast("double")).alias(f"min_{c}"), F.max(F.col(c).cast("double")).alias(f"max_{c}")]
        row = df.agg(*aggs).first()
        empty = [c for c in cols if row[f"min_{c}"] is None]
        if empty:
            raise ValueError(f"MinMax.fit: column(s) {empty} have no non-null values (is the DataFrame empty?).")
        return FittedMinMax(
            mins={c: float(row[f"min_{c}"]) for c in cols},
            maxs={c: float(row[f"max_{c}"]) for c in cols},
            feature_range=(float(lo), float(hi)),
            cols=cols,
        )


def make_windows(
    df: "DataFrame",
    time_col: str,
    value_cols: Sequence[str],
    target_col: str,
    n_in: int = 24,
    n_out: int = 1,
    step_seconds: float | None = 3600,
    num_partitions: int | None = None,
) -> "DataFrame":
    """Sliding-window samples for sequence models, built with Window + lag/lead.

    For every time t (ordered by ``time_col``) the output row holds
        ``time_col``  t, the time of the (first) target
        ``features``  array<float> of length ``n_in * len(value_cols)``:
                      the values at t-n_in, ..., t-1, TIME-MAJOR, i.e.
                      ``[v1(t-n_in), v2(t-n_in), ..., v1(t-1), v2(t-1)]``,
                      so ``np.reshape(features, (n_in, len(value_cols)))``
                      gives the (timesteps, features) input of an LSTM/GRU
        ``label``     float ``target(t)`` when ``n_out == 1``, else
                      array<float> ``[target(t), ..., target(t+n_out-1)]``.
    The inputs end one step before the first target (the last ``n_in`` hours
    predict the next hour).

    Incomplete rows are dropped: the first ``n_in`` and last ``n_out - 1``
    rows, windows with a null value, and -- when ``step_seconds`` is given
    (default 3600, hourly) -- windows whose time span is not exactly
    ``(n_in + n_out - 1) * step_seconds``, i.e. windows crossing a gap or a
    duplicated time. ``step_seconds=None`` skips that check (then rows are
    simply consecutive in time order).

    The window has no ``partitionBy``: Spark moves ALL rows into one partition
    to order them (it logs "No Partition Defined for Window operation"). That
    is fine for a single series of a few thousand rows (8,760 hourly rows),
    not for big data; the result is repartitioned afterwards into
    ``num_partitions`` (default: the default parallelism) for training.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    value_cols = [value_cols] if isinstance(value_cols, str) else list(value_cols)
    if not value_cols:
        raise ValueError("make_windows: value_cols must name at least one column.")
    if int(n_in) < 1 or int(n_out) < 1:
        raise ValueError(f"make_windows: n_in and n_out must be >= 1, got n_in={n_in}, n_out={n_out}.")
    n_in, n_out = int(n_in), int(n_out)
    _require_columns(df, [time_col, target_col, *value_cols], "make_windows")

    w = Window.orderBy(F.col(time_col))
    lags = [F.lag(F.col(c).cast("float"), k).over(w) for k in range(n_in, 0, -1) for c in value_cols]
    target = F.col(target_col).cast("float")
    leads = [target if j == 0 else F.lead(target, j).over(w) for j in range(n_out)]
    cols = [F.col(time_col), F.array(*lags).alias("_features"), F.array(*leads).alias("_label")]
    ok = F.forall("_features", lambda v: v.isNotNull()) & F.forall("_label", lambda v: v.isNotNull())
    if step_seconds is not None:
        t = epoch_seconds(df, time_col)
        last = t if n_out == 1 else F.lead(t, n_out - 1).over(w)
        cols.append((last - F.lag(t, n_in).over(w)).alias("_span"))
        ok = ok & (F.col("_span") == F.lit(float((n_in + n_out - 1) * step_seconds)))
    label = F.col("_label")[0] if n_out == 1 else F.col("_label")
    out = df.select(*cols).where(ok).select(time_col, F.col("_features").alias("features"), label.alias("label"))
    parts = num_partitions or _default_parallelism(out.sparkSession)
    return out.repartition(int(parts))


def train_test_split_last(df: "DataFrame", time_col: str, hours: float = 120) -> tuple["DataFrame", "DataFrame"]:
    """Split a time-indexed DataFrame into ``(train, test)``: test = the last ``hours``.

    Test rows are those with ``time > max(time) - hours`` (for an hourly
    series exactly ``hours`` rows); everything earlier is training data. One
    aggregation finds the latest time; the comparison is done in epoch seconds
    (see ``epoch_seconds``), so daylight-saving changes cannot shift it.
    Numeric time columns are read as epoch seconds.
    """
    from pyspark.sql import functions as F

    if not hours > 0:
        raise ValueError(f"train_test_split_last: hours must be > 0, got {hours!r}.")
    t = epoch_seconds(df, time_col)
    latest = df.agg(F.max(t).alias("latest")).first()["latest"]
    if latest is None:
        raise ValueError(f"train_test_split_last: column {time_col!r} has no values (is the DataFrame empty?).")
    cutoff = F.lit(float(latest) - float(hours) * 3600.0)
    return df.where(t <= cutoff), df.where(t > cutoff)


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
