"""Saving and loading `KerasEstimator` and `KerasModel` the Spark ML way (MLWriter / MLReader).

A stage's directory holds Spark ML's ``metadata/`` (class, uid, the simple
Params as JSON, written by ``DefaultParamsWriter``) and ``data/``, a Parquet
table of named binary blobs written through Spark, so that any file system
Spark can write to works (local, HDFS, S3...): the model's ``.keras`` bytes,
its custom objects and builder functions (cloudpickle, by value), the
training history and data spec (JSON). Loading unpickles the custom objects
and builders: load only directories you trust, as with pickle.
"""

from __future__ import annotations

import json
import pickle
from dataclasses import asdict
from typing import Any

from pyspark import cloudpickle
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReadable, MLReader, MLWritable, MLWriter
from pyspark.sql import SparkSession

from trainer.data.checks import DataSpec
from trainer.fit.fitted import FittedModel, TrainingHistory
from trainer.runtime.shipping import load_keras_bytes, ship_by_value

DATA_DDL = "name string, payload binary"


def pickled(value: Any) -> bytes:
    """`value` (functions, classes, dicts of them) by value."""
    values = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else [value]
    ship_by_value(*[v for v in values if callable(v)])
    return cloudpickle.dumps(value)


def unpickled(data: bytes) -> Any:
    return pickle.loads(data)


def write_stage(instance, path: str, spark: SparkSession, params: dict[str, Any], blobs: dict[str, bytes]) -> None:
    DefaultParamsWriter.saveMetadata(instance, path, spark, paramMap=params)
    rows = [(name, bytearray(payload)) for name, payload in blobs.items()]
    spark.createDataFrame(rows, DATA_DDL).coalesce(1).write.parquet(f"{path}/data")


def read_stage(path: str, spark: SparkSession) -> tuple[dict[str, Any], dict[str, bytes]]:
    """(Spark ML metadata, blobs) of a stage written by `write_stage`."""
    metadata = DefaultParamsReader.loadMetadata(path, spark)
    blobs = {r["name"]: bytes(r["payload"]) for r in spark.read.parquet(f"{path}/data").collect()}
    return metadata, blobs


class StageWriter(MLWriter):
    """Writes a stage through its ``_save_to(path, spark)``."""

    def __init__(self, instance) -> None:
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        self.instance._save_to(path, self.sparkSession)


class StageReader(MLReader):
    """Reads a stage through its class's ``_load_from(path, spark)``."""

    def __init__(self, cls) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str):
        return self.cls._load_from(path, self.sparkSession)


class StagePersistence(MLWritable, MLReadable):
    """`write`/`read` of both stages: a subclass saves itself in ``_save_to(path, spark)`` and loads in
    the classmethod ``_load_from(path, spark)``."""

    def write(self) -> StageWriter:
        return StageWriter(self)

    @classmethod
    def read(cls) -> StageReader:
        return StageReader(cls)


def model_blobs(fitted) -> dict[str, bytes]:
    """A `FittedModel` as blobs: ``.keras`` bytes, custom objects, history, spec and columns."""
    package = fitted._shipped()
    meta = {"features_col": fitted.features_col, "label_col": fitted.label_col, "spec": asdict(fitted.spec)}
    blobs = {"model.keras": package.data, "fitted.json": json.dumps(meta).encode(),
             "history.json": json.dumps(fitted.history.to_dict(), default=float).encode()}
    if package.custom_objects:
        blobs["custom_objects"] = pickled(package.custom_objects)
    return blobs


def fitted_from_blobs(blobs: dict[str, bytes]):
    """The `FittedModel` of `model_blobs`."""
    objects = unpickled(blobs["custom_objects"]) if "custom_objects" in blobs else None
    model = load_keras_bytes(blobs["model.keras"], objects)
    meta = json.loads(blobs["fitted.json"])
    spec = meta["spec"]
    spec = DataSpec(spec["num_rows"], spec["feature_size"], tuple(spec["input_shape"]), spec["label_size"])
    history = TrainingHistory(**json.loads(blobs["history.json"]))
    return FittedModel(model, history, meta["features_col"], meta["label_col"], spec, objects)
