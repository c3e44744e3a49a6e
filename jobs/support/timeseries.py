"""The forecasting jobs' recipe in Spark: min-max scaling that can be inverted, lag windows of one series,
the last hours held out (``forecast``, ``select_forecast``; a user's own data goes through ``trainer.data.prep``).

Everything runs in Spark -- one aggregation for the min/max statistics, window
functions for the lag features -- never a round trip through pandas::

    series = timeseries_to_dataframe(spark, load_elecdemand())   # trainer.data.prep
    raw_train, _ = train_test_split_last(series, "time", hours=120)
    scaler = MinMax(["load", "temperature"]).fit(raw_train)   # training hours only
    windows = make_windows(scaler.transform(series), "time",
                           ["load", "temperature"], "load", n_in=24)
    train, test = train_test_split_last(windows, "time", hours=120)
    ...                                                       # fit, predict test
    mape(scaler.inverse(y_test, "load"), scaler.inverse(y_pred, "load"))

A recipe for one small series, not a general tool: ``make_windows`` orders
every row in one partition (a window without ``partitionBy``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import Column, DataFrame

__all__ = ["FittedMinMax", "MinMax", "epoch_seconds", "make_windows", "train_test_split_last"]


def _require_columns(df: "DataFrame", cols: Iterable[str], what: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ValueError(f"{what}: column(s) {missing} not found; the DataFrame has columns {df.columns}.")


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
        return {"mins": dict(self.mins), "maxs": dict(self.maxs), "feature_range": list(self.feature_range),
                "cols": list(self.cols)}

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
    return out.repartition(int(num_partitions or _default_parallelism(out.sparkSession)))


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


def _default_parallelism(spark) -> int:
    try:
        return max(1, int(spark.sparkContext.defaultParallelism))
    except Exception:  # Spark Connect has no SparkContext
        return max(1, int(spark.conf.get("spark.default.parallelism", "2")))
