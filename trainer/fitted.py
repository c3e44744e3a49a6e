"""What ``Trainer.fit`` returns: the trained model, its history, and inference on DataFrames.

`FittedModel.transform` and `evaluate` run on the executors: the model travels
once as ``.keras`` bytes with the custom objects it needs (shipped by value,
``trainer.runtime.shipping.pack_model``) and is loaded once per Python worker
(``trainer.runtime.shipping.cached_model``); an error there is raised at once
(``trainer.runtime.inference``). `TrainingHistory` records what happened
during ``fit`` (server updates, workers, epochs, events, timings).
"""

from __future__ import annotations

import json
import os
import pickle
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from pyspark import cloudpickle

from trainer.data.validate import DataSpec, feature_column, model_io, prepare_frame, resolve_input_shape
from trainer.data.validation import weighted_metrics
from trainer.errors import TaskFailedError
from trainer.runtime.inference import OUTCOME_DDL, evaluate_task, predict_function, probe_model, weighted_outcomes
from trainer.runtime.shipping import ModelPackage, pack_model

CUSTOM_OBJECTS_FILE = "custom_objects.cloudpickle"


@dataclass
class TrainingHistory:
    """What happened during `fit`.

    Attributes:
        updates: one dict per parameter-server update (time, worker, version,
            staleness, bytes_in, bytes_out, epoch, step, loss, kind).
        workers: one dict per worker task (rows, commits, comm_s, bytes_sent,
            bytes_received, timings, per-epoch logs); retried tasks appear once
            per attempt.
        epochs: per epoch: wall time over all workers, batches trained by
            all workers, the mean of the workers' Keras logs (loss, metrics)
            and, with validation data, the validation metrics of the center
            model (``val_loss``, ...; weighted by each worker's validation
            rows, ``val_rows`` in all).
        events: notable events (retries, server-side rejections).
        timings: wall_s, data_delivery_s, model_build_s, train_s, epoch_s.
    """

    algorithm: str
    num_workers: int
    updates: list[dict] = field(default_factory=list)
    workers: list[dict] = field(default_factory=list)
    epochs: list[dict] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def num_updates(self) -> int:
        return len(self.updates)

    @property
    def bytes_moved(self) -> int:
        return sum(u["bytes_in"] + u["bytes_out"] for u in self.updates)

    @property
    def loss(self) -> list[float]:
        """Mean training loss of the workers at the end of each epoch."""
        return [e.get("loss", float("nan")) for e in self.epochs]

    def to_frame(self):
        """Parameter-server updates as a pandas DataFrame."""
        import pandas as pd  # deferred: only this function needs it

        return pd.DataFrame(self.updates)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def build(cls, algorithm: str, num_workers: int, ps, workers: list[dict], job_start: float,
              job_end: float, events: list[dict]) -> "TrainingHistory":
        """The history of one fit: `algorithm` described, the server `ps` (its updates and events), the
        workers' records of every attempt, the stage's start and end times and the driver's events."""
        final = [w for w in workers if w["attempt"] == max(x["attempt"] for x in workers)]
        epochs = []
        for epoch in sorted({e["epoch"] for w in final for e in w["epochs"] if "end" in e}):
            parts = [e for w in final for e in w["epochs"] if e["epoch"] == epoch and "end" in e]
            entry = {"epoch": epoch, "time_s": max(p["end"] for p in parts) - min(p["start"] for p in parts),
                     "batches": sum(p.get("batches", 0) for p in parts)}
            entry.update(weighted_metrics([p["logs"] for p in parts]))
            epochs.append(entry)
        first = [w for w in workers if w["attempt"] == 0] or workers
        timings = {
            "wall_s": job_end - job_start,
            "data_delivery_s": max(w["data_ready"] for w in first) - job_start,
            "model_build_s": max(w["model_built"] - w["data_ready"] for w in first),
            "train_s": max(w["train_s"] for w in final),
            "epoch_s": float(np.mean([e["time_s"] for e in epochs])) if epochs else float("nan"),
        }
        return cls(
            algorithm=algorithm, num_workers=num_workers,
            updates=[asdict(u) for u in ps.updates], workers=sorted(workers, key=lambda w: (w["attempt"], w["worker"])),
            epochs=epochs, events=list(ps.events) + events, timings=timings,
        )


class FittedModel:
    """A trained model: the Keras model, its `TrainingHistory`, and distributed inference."""

    def __init__(self, keras_model, history: TrainingHistory, features_col, label_col, spec: DataSpec,
                 custom_objects=None) -> None:
        self.keras_model = keras_model
        self.history = history
        self.features_col = features_col
        self.label_col = label_col
        self.spec = spec
        self.custom_objects = custom_objects
        self._package: ModelPackage | None = None
        self._probed = False
        self._key = uuid.uuid4().hex

    def _shipped(self) -> ModelPackage:
        """The model's ``.keras`` bytes and every custom object they need, made once."""
        if self._package is None:
            self._package = pack_model(self.keras_model, self.custom_objects)
        return self._package

    def transform(self, df, output_col: str = "prediction", batch_size: int = 1024):
        """Return `df` with `output_col` added: the model's outputs for every row.

        Runs on the executors (``predict_batch_udf``; the model is loaded once per
        Python worker). Multi-unit outputs become array<float>, single-unit ones float.
        """
        import keras  # deferred: TensorFlow starts only when a model is needed
        from pyspark.ml.functions import predict_batch_udf
        from pyspark.sql import types as T

        input_shape, units, _ = model_io(self.keras_model)
        shape = list(resolve_input_shape(input_shape, self.spec.feature_size))
        package, backend = self._shipped(), keras.backend.backend()
        if not self._probed:  # a user error here surfaces now, not after Spark's task retries
            error = probe_model(df.sparkSession, package, self._key, backend, tuple(shape))
            if error is not None:
                raise TaskFailedError(f"The model cannot run on the executors: {error}")
            self._probed = True
        make_predict_fn = predict_function(package, self._key, backend, scalar=units == 1)
        return_type = T.FloatType() if units == 1 else T.ArrayType(T.FloatType())
        udf = predict_batch_udf(make_predict_fn, return_type=return_type, batch_size=batch_size,
                                input_tensor_shapes=[shape])
        return df.withColumn(output_col, udf(feature_column(df, self.features_col)))

    def evaluate(self, df, batch_size: int = 1024) -> dict[str, float]:
        """Loss and compiled metrics on `df`, computed on the executors.

        Each partition is evaluated with ``model.evaluate``; results are averaged
        weighted by row count, which is exact for loss, accuracy, MAE, MSE and any
        other per-sample mean, and approximate for metrics such as AUC.
        """
        import keras  # deferred: TensorFlow starts only when a model is needed

        frame, spec = prepare_frame(df, self.features_col, self.label_col, self.keras_model)
        task = evaluate_task(self._shipped(), self._key, keras.backend.backend(), spec.input_shape, spec.label_size,
                             batch_size)
        metrics, error = weighted_outcomes(frame.mapInArrow(task, OUTCOME_DDL).collect())
        if error is not None:
            raise TaskFailedError(f"evaluate failed on an executor: {error}")
        return metrics

    def save(self, path: str | os.PathLike) -> Path:
        """Write ``model.keras``, ``history.json`` and ``fitted.json`` into directory `path`, and the
        model's custom objects (by value, cloudpickle) into ``custom_objects.cloudpickle``."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        package = self._shipped()
        (out / "model.keras").write_bytes(package.data)
        if package.custom_objects:
            (out / CUSTOM_OBJECTS_FILE).write_bytes(cloudpickle.dumps(package.custom_objects))
        (out / "history.json").write_text(json.dumps(self.history.to_dict(), default=float))
        meta = {"features_col": self.features_col, "label_col": self.label_col, "spec": asdict(self.spec)}
        (out / "fitted.json").write_text(json.dumps(meta))
        return out

    @classmethod
    def load(cls, path: str | os.PathLike, custom_objects=None) -> "FittedModel":
        """Read a directory written by `save`. Its custom objects come back by value (so a model
        whose layers were defined in a notebook loads anywhere): unpickling runs their code, so
        load only directories you trust. `custom_objects` given here take precedence."""
        import keras  # deferred: TensorFlow starts only when a model is needed

        src = Path(path)
        meta = json.loads((src / "fitted.json").read_text())
        spec = meta["spec"]
        spec = DataSpec(spec["num_rows"], spec["feature_size"], tuple(spec["input_shape"]), spec["label_size"])
        if (src / CUSTOM_OBJECTS_FILE).is_file():
            custom_objects = {**pickle.loads((src / CUSTOM_OBJECTS_FILE).read_bytes()), **(custom_objects or {})}
        model = keras.saving.load_model(src / "model.keras", custom_objects=custom_objects)
        history = TrainingHistory(**json.loads((src / "history.json").read_text()))
        return cls(model, history, meta["features_col"], meta["label_col"], spec, custom_objects)
