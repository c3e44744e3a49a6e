"""MLflow tracking of fits and searches: ``mlflow=True`` on `Trainer`, `KerasEstimator` and `ModelSelector`.

MLflow is an optional extra (``pip install '.[mlflow]'`` in a checkout, or the wheel with ``[mlflow]``),
imported only when tracking is asked for. A fit logs into the active run, or
into a new run under the current tracking URI (``MLFLOW_TRACKING_URI`` or
``mlflow.set_tracking_uri``):

* parameters: algorithm, workers, batch size, epochs, learning rate, window,
  rows, model (`RunLogger.log_params`);
* per-epoch metrics, ``step`` = epoch: training and validation loss and
  metrics, ``epoch_time_s``, ``updates``, ``bytes``, ``staleness``
  (`epoch_logger`, a Keras callback run by ``trainer.fit.epoch_callbacks`` on the driver);
* the final model as an MLflow Keras model with its signature, under the
  artifact path ``model`` (`RunLogger.log_model`).

A model selection logs a parent run (the search, the best configuration, the
leaderboard, the best model) and one child run per configuration with its
parameters and per-epoch metrics (`SearchLogger`).

Metrics are logged with ``MlflowClient`` and an explicit run id: callbacks
run on driver threads, and MLflow's active run belongs to the thread that
started it.
"""

from __future__ import annotations

import math
import tempfile
import time
from typing import Any

import numpy as np


def require_mlflow():
    """The mlflow module, or ImportError with the fix."""
    try:
        import mlflow  # deferred: an optional extra, imported only when tracking is asked for
    except ImportError as exc:
        raise ImportError(
            "mlflow=True needs MLflow, which is not installed. Fix: pip install '.[mlflow]' in the checkout "
            "(or the wheel with [mlflow], or pip install mlflow-skinny sqlalchemy alembic)."
        ) from exc
    return mlflow


def _numeric(values: dict[str, Any]) -> dict[str, float]:
    out = {}
    for key, value in values.items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if not math.isnan(number):
            out[key] = number
    return out


class RunLogger:
    """One MLflow run for a fit: the active run, or a new one (ended on exit when it started it).

    Use as a context manager on the driver's main thread; `log_metrics` may be
    called from any thread.
    """

    def __init__(self, run_name: str | None = None, *, nested: bool = False, parent_id: str | None = None,
                 tags: dict[str, str] | None = None) -> None:
        self.mlflow = require_mlflow()
        self.client = self.mlflow.MlflowClient()
        self.run_name, self.nested, self.parent_id, self.tags = run_name, nested, parent_id, dict(tags or {})
        self.run_id: str | None = None
        self._started = False

    def __enter__(self) -> "RunLogger":
        if self.parent_id is not None:  # a child run from any thread: no fluent active-run stack
            parent = self.client.get_run(self.parent_id)
            run = self.client.create_run(parent.info.experiment_id, run_name=self.run_name,
                                         tags={"mlflow.parentRunId": self.parent_id, **self.tags})
            self._started = True
        elif self.mlflow.active_run() is not None and not self.nested:
            run = self.mlflow.active_run()
        else:
            run = self.mlflow.start_run(run_name=self.run_name, nested=self.nested, tags=self.tags or None)
            self._started = True
        self.run_id = run.info.run_id
        return self

    def __exit__(self, kind, value, tb) -> None:
        if not self._started:
            return
        status = "FINISHED" if kind is None else "FAILED"
        if self.parent_id is not None:
            self.client.set_terminated(self.run_id, status=status)
        else:
            self.mlflow.end_run(status=status)

    def rename(self, run_name: str) -> None:
        """Name the run `run_name` when this logger started it (a fit names its run after the algorithm it
        chose); an active run of the caller's keeps its own name."""
        if self._started:
            self.client.set_tag(self.run_id, "mlflow.runName", run_name)
            self.run_name = run_name

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param  # deferred: an optional extra

        self.client.log_batch(self.run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()
                                                   if v is not None])

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        from mlflow.entities import Metric  # deferred: an optional extra

        now = int(time.time() * 1000)
        batch = [Metric(k, v, now, step or 0) for k, v in _numeric(metrics).items()]
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)

    def log_model(self, keras_model, input_shape: tuple[int, ...], custom_objects: dict | None = None) -> str:
        """Log `keras_model` as an MLflow Keras model with its signature; returns its model URI.

        Custom objects travel as the ``custom_objects.cloudpickle`` artifact of
        the run; load with ``mlflow.keras.load_model(uri, custom_objects=...)``.
        """
        import keras  # deferred: TensorFlow starts only when a model is needed
        from mlflow.models import infer_signature  # deferred: an optional extra

        example = np.zeros((1, *input_shape), np.float32)
        signature = infer_signature(example, np.asarray(keras_model.predict_on_batch(example)))
        requirements = [f"keras=={keras.__version__}", f"mlflow-skinny=={self.mlflow.__version__}"]
        # The run entered on this thread is MLflow's active run: log_model attaches the model to it.
        info = self.mlflow.keras.log_model(keras_model, name="model", signature=signature,
                                           pip_requirements=requirements)
        if custom_objects:
            from pyspark import cloudpickle  # deferred: only a model with custom objects needs it

            with tempfile.TemporaryDirectory() as tmp:
                path = f"{tmp}/custom_objects.cloudpickle"
                with open(path, "wb") as fh:
                    fh.write(cloudpickle.dumps(custom_objects))
                self.client.log_artifact(self.run_id, path, "custom_objects")
        return info.model_uri


def epoch_logger(logger: RunLogger):
    """A Keras callback logging each epoch's logs into `logger`'s run (step = epoch)."""
    import keras  # deferred: TensorFlow starts only when a fit does

    class MlflowEpochLogger(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            logger.log_metrics(dict(logs or {}), step=epoch)

    return MlflowEpochLogger()


def fit_params(trainer: Any, algorithm: Any, model, num_rows: int, validation_rows: int) -> dict[str, Any]:
    """The parameters of a `Trainer` fit worth comparing across runs (`algorithm`: the algorithm the fit runs)."""
    try:
        rate: Any = float(model.optimizer.learning_rate)
    except (AttributeError, TypeError, ValueError):
        rate = type(getattr(model.optimizer, "_learning_rate", None)).__name__
    return {
        "algorithm": algorithm.name, "algorithm_detail": algorithm.describe(),
        "window": algorithm.window, "num_workers": trainer.num_workers, "batch_size": trainer.batch_size,
        "epochs": trainer.epochs, "learning_rate": rate, "optimizer": type(model.optimizer).__name__,
        "model": model.name, "parameters": int(model.count_params()), "rows": num_rows,
        "validation_rows": validation_rows, "seed": trainer.seed, "share_epochs": trainer.share_epochs,
    }


class SearchLogger:
    """MLflow runs of a model selection: the parent run, and one child run per configuration."""

    def __init__(self, parent: RunLogger) -> None:
        self.parent = parent
        self.children: dict[str, RunLogger] = {}

    def child(self, config_id: str, params: dict[str, Any]) -> RunLogger:
        run = RunLogger(config_id, parent_id=self.parent.run_id, tags={"trainer.config_id": config_id}).__enter__()
        run.log_params({"config_id": config_id, **params})
        self.children[config_id] = run
        return run

    def epoch(self, config_id: str, epoch: int, logs: dict[str, Any]) -> None:
        if config_id in self.children:
            self.children[config_id].log_metrics(logs, step=epoch)

    def close(self, failed: bool = False) -> None:
        for run in self.children.values():
            run.__exit__(RuntimeError if failed else None, None, None)
