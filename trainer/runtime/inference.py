"""Inference inside Spark tasks: ``FittedModel``'s evaluate, predict and probe functions, and the
validation pass of the training and model-selection tasks (`validation_logs`).

`transform` and `evaluate` run in normal (not barrier) stages, which Spark
retries (``spark.task.maxFailures``, 4 by default): a deterministic user error
-- a custom class the executor cannot find, a shape error in the model --
would fail four times, each after loading the model again, before the user
saw it. So the functions here catch the error inside the task and hand it
back as data (`TaskOutcome`), and the driver raises it at once with the
executor's message: `evaluate` does so for every partition; `transform`,
whose predictions are computed lazily by ``predict_batch_udf``, first runs
`probe_model` (one task loads the model and predicts one row of zeros).
"""

from __future__ import annotations

import json
import traceback
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa

from trainer.runtime.feeding.arrow import arrow_to_numpy
from trainer.runtime.process import holding_cores, setup_task
from trainer.runtime.shipping import ModelPackage, cached_model

OUTCOME_DDL = "count long, metrics string, error string"
_OUTCOME_SCHEMA = pa.schema([("count", pa.int64()), ("metrics", pa.string()), ("error", pa.string())])


def validation_logs(model, x: np.ndarray, y: np.ndarray, batch_size: int) -> dict[str, float]:
    """``{"val_loss": ..., "val_<metric>": ...}`` of `model` on (x, y)."""
    result = model.evaluate(x, y, batch_size=batch_size, verbose=0, return_dict=True)
    return {f"val_{k}": float(np.asarray(v)) for k, v in result.items()}


def describe_error(exc: BaseException, frames: int = 3) -> str:
    """``Type: message`` and the innermost `frames` frames of its traceback (where in the user's code)."""
    tail = traceback.format_tb(exc.__traceback__)[-frames:]
    return f"{type(exc).__name__}: {exc}\n" + "".join(tail).rstrip()


def _outcome(count: int = 0, metrics: dict | None = None, error: str | None = None) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {"count": [count], "metrics": [json.dumps(metrics or {})], "error": [error]}, schema=_OUTCOME_SCHEMA
    )


def evaluate_task(package: ModelPackage, key: str, backend: str, input_shape: tuple[int, ...],
                  label_size: int | None, batch_size: int) -> Callable[[Iterator[pa.RecordBatch]], Iterator]:
    """The ``mapInArrow`` function of `evaluate`: one row per partition, (rows, metrics) or the error."""

    def evaluate_partition(batches):
        try:
            x, y = arrow_to_numpy(batches, input_shape, label_size)
            if len(x) == 0:
                return
            setup_task(backend)
            model = cached_model(key, package.data, package.custom_objects)
            metrics = model.evaluate(x, y, batch_size=batch_size, verbose=0, return_dict=True)
        except Exception as exc:  # deterministic: handed to the driver instead of Spark's retries
            yield _outcome(error=describe_error(exc))
            return
        yield _outcome(len(x), {k: float(v) for k, v in metrics.items()})

    return lambda batches: holding_cores(evaluate_partition(batches))


def weighted_outcomes(rows: list) -> tuple[dict[str, float], str | None]:
    """(metrics averaged over partitions weighted by rows, the first executor error or None)."""
    errors = [r["error"] for r in rows if r["error"]]
    if errors:
        return {}, errors[0]
    parts = [(r["count"], json.loads(r["metrics"])) for r in rows]
    total = sum(n for n, _ in parts)
    if not total:
        return {}, None
    return {k: sum(n * m[k] for n, m in parts) / total for k in parts[0][1]}, None


def probe_model(spark, package: ModelPackage, key: str, backend: str, input_shape: tuple[int, ...]) -> str | None:
    """Load the model on one executor and predict one row of zeros; the executor's error or None."""

    def probe(batches):
        for _ in batches:
            pass
        try:
            setup_task(backend)
            model = cached_model(key, package.data, package.custom_objects)
            model.predict_on_batch(np.zeros((1, *input_shape), np.float32))
        except Exception as exc:  # deterministic: handed to the driver instead of Spark's retries
            yield _outcome(error=describe_error(exc))
            return
        yield _outcome(1)

    rows = spark.range(1, numPartitions=1).mapInArrow(lambda b: holding_cores(probe(b)), OUTCOME_DDL).collect()
    return next((r["error"] for r in rows if r["error"]), None)


def predict_function(package: ModelPackage, key: str, backend: str, scalar: bool) -> Callable[[], Any]:
    """The ``make_predict_fn`` of ``predict_batch_udf``: loads the model once per Python worker, which keeps its
    cores' claim as long as it keeps the model (no task end is seen here)."""

    def make_predict_fn():
        setup_task(backend)
        model = cached_model(key, package.data, package.custom_objects)

        def predict(x: np.ndarray) -> np.ndarray:
            out = np.asarray(model.predict_on_batch(x.astype(np.float32, copy=False)))
            return out.reshape(len(x)) if scalar else out.reshape(len(x), -1)

        return predict

    return make_predict_fn
