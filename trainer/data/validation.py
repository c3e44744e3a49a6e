"""Validation data, one path for `Trainer.fit` and `ModelSelector.fit`.

* `split_validation` takes ``validation=`` as a DataFrame, a fraction of the
  training rows to hold out (``randomSplit`` with the run's seed) or None;
* `validation_frame` checks the validation rows like the training rows and
  puts them in the same two-column layout;
* `tag_validation` unions training and validation rows with a flag column
  (`VALIDATION_FLAG`), so that ONE barrier stage deals both into every
  worker's shard: each task validates on its own share of the validation
  rows, on the executors (``trainer.runtime.feeding.arrow.split_shard`` takes the
  shard apart again);
* `weighted_mean` / `weighted_metrics` turn per-worker (per-shard) logs into
  one value per metric: training metrics weighted by training rows,
  validation metrics by validation rows -- exact for per-sample means (loss,
  accuracy, MAE), approximate for metrics such as AUC.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from trainer.data.columns import VALIDATION_FLAG
from trainer.data.checks import DataSpec, prepare_frame
from trainer.errors import DataValidationError


def split_validation(df: DataFrame, validation: Any, seed: int) -> tuple[DataFrame, DataFrame | None]:
    """(training rows, validation DataFrame or None) from ``fit``'s `validation` argument."""
    if isinstance(validation, (int, float)) and not isinstance(validation, bool):
        if not 0 < validation < 1:
            raise DataValidationError(
                f"validation as a fraction must be in (0, 1). Received validation={validation!r}. "
                "Fix: e.g. validation=0.2, or pass a DataFrame."
            )
        train, held_out = df.randomSplit([1.0 - validation, float(validation)], seed=seed)
        return train, held_out
    if validation is not None and not hasattr(validation, "sparkSession"):
        raise DataValidationError(
            f"validation must be a Spark DataFrame, a fraction in (0, 1) or None. Received {type(validation).__name__}."
        )
    return df, validation


def validation_frame(validation: DataFrame | None, features_col, label_col: str, model, spec: DataSpec, *,
                     check_values: bool = True) -> tuple[DataFrame | None, int]:
    """(validation rows in the two-column layout, checked like the training rows, their count); (None, 0)."""
    if validation is None:
        return None, 0
    vframe, vspec = prepare_frame(validation, features_col, label_col, model, check_values=check_values)
    if (vspec.feature_size, vspec.label_size) != (spec.feature_size, spec.label_size):
        raise DataValidationError(
            f"The validation rows have {vspec.feature_size} features and label size {vspec.label_size}; "
            f"the training rows have {spec.feature_size} and {spec.label_size}. Fix: prepare both the same way."
        )
    return vframe, vspec.num_rows


def tag_validation(frame: DataFrame, vframe: DataFrame | None) -> DataFrame:
    """`frame` (training rows) and `vframe` (validation rows) in one frame with `VALIDATION_FLAG`."""
    tagged = frame.withColumn(VALIDATION_FLAG, F.lit(False))
    if vframe is not None:
        tagged = tagged.unionByName(vframe.withColumn(VALIDATION_FLAG, F.lit(True)))
    return tagged


#: Below this many rows per worker, a stage's frame is dealt from one partition (`dealt_evenly`).
SMALL_FRAME_ROWS_PER_WORKER = 1000


def _identity(batches):
    yield from batches


def dealt_evenly(frame: DataFrame, rows: int, workers: int) -> DataFrame:
    """`frame` (of `rows` rows) as a barrier stage of `workers` tasks should read it.

    Round-robin from a single partition deals rows evenly; from many tiny
    partitions it can leave a worker without any row. So a small frame is
    read from one partition; the identity map keeps the optimizer from
    collapsing ``coalesce(1)`` into the stage's repartition.
    """
    if rows >= SMALL_FRAME_ROWS_PER_WORKER * workers:
        return frame
    return frame.coalesce(1).mapInArrow(_identity, frame.schema)


def weighted_mean(values: Sequence[dict[str, float]], weights: Sequence[float]) -> dict[str, float]:
    """Per key, the mean of `values` weighted by `weights` over the dicts that have the key
    (NaN where they all weigh 0); {} when every weight is 0."""
    if not any(w for v, w in zip(values, weights) if v):
        return {}
    names: list[str] = []
    for v in values:
        names += [k for k in v if k not in names]
    out = {}
    for k in names:
        num = sum(w * float(v[k]) for v, w in zip(values, weights) if k in v)
        den = sum(w for v, w in zip(values, weights) if k in v)
        out[k] = float(num / den) if den else math.nan
    return out


def weighted_metrics(parts: Sequence[dict[str, float]]) -> dict[str, float]:
    """One dict of logs from per-worker `parts`: ``val_*`` weighted by ``val_rows``, the other
    metrics by ``rows`` when the parts say (else equally); the counts are summed."""
    counts = {k: float(sum(p.get(k, 0) for p in parts)) for k in ("rows", "val_rows") if any(k in p for p in parts)}
    train = [{k: v for k, v in p.items() if not k.startswith("val_") and k not in ("rows", "val_rows")}
             for p in parts]
    val = [{k: v for k, v in p.items() if k.startswith("val_") and k != "val_rows"} for p in parts]
    out = weighted_mean(train, [p.get("rows", 1) for p in parts])
    out.update(weighted_mean(val, [p.get("val_rows", 0) for p in parts]))
    return {**out, **counts}
