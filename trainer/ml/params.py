"""The typed Params of `KerasEstimator` and `KerasModel`, in Spark ML's camelCase."""

from __future__ import annotations

import dataclasses
from typing import Any

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasFeaturesCol, HasLabelCol, HasPredictionCol

from trainer.algorithms import ALGORITHMS, Algorithm, get_algorithm
from trainer.algorithms.choice import AUTO
from trainer.options import FitOptions


def algorithm_to_json(value: str | Algorithm) -> dict[str, Any]:
    """An algorithm (name or instance) as ``{"name": ..., "params": {...}}``; ``"auto"`` (chosen per fit) as
    ``{"name": "auto", "params": {}}``."""
    if _is_auto(value):
        return {"name": AUTO, "params": {}}
    algorithm = get_algorithm(value)
    return {"name": algorithm.name, "params": dataclasses.asdict(algorithm)}


def algorithm_from_json(value: Any) -> Algorithm | str:
    if isinstance(value, dict) and value.get("name") == AUTO or _is_auto(value):
        return AUTO
    if isinstance(value, dict):
        return ALGORITHMS[value["name"]](**value.get("params", {}))
    return get_algorithm(value)


def _is_auto(value: Any) -> bool:
    return isinstance(value, str) and value.lower() == AUTO


def _algorithm(value: Any) -> Any:
    """Type converter: a name, ``"auto"`` or an `Algorithm`, checked at once."""
    if not _is_auto(value):
        get_algorithm(value)
    return value


def _model(value: Any) -> Any:
    if not (callable(value) or hasattr(value, "get_weights")):
        raise TypeError(f"`model` must be a compiled keras.Model or a function returning one. Received: {type(value)}")
    return value


class KerasParams(HasFeaturesCol, HasLabelCol, HasPredictionCol):
    """Params shared by `KerasEstimator` and `KerasModel`: the columns (featuresCol is an array or
    ``Vector`` column, e.g. a ``VectorAssembler``'s or ``StandardScaler``'s output)."""


class KerasEstimatorParams(KerasParams):
    """The estimator's own Params (the ``trainer.Trainer`` arguments)."""

    model = Param(Params._dummy(), "model", "a compiled keras.Model or a function with no arguments returning one",
                  typeConverter=_model)
    algorithm = Param(Params._dummy(), "algorithm", f"algorithm: auto (chosen per fit), a trainer.algorithms "
                      f"instance or one of {', '.join(ALGORITHMS)}", typeConverter=_algorithm)
    numWorkers = Param(Params._dummy(), "numWorkers", "number of long-lived worker tasks",
                       typeConverter=TypeConverters.toInt)
    epochs = Param(Params._dummy(), "epochs", "passes over the data", typeConverter=TypeConverters.toInt)
    batchSize = Param(Params._dummy(), "batchSize", "minibatch size on each worker", typeConverter=TypeConverters.toInt)
    validationCol = Param(Params._dummy(), "validationCol", "boolean column: true marks validation rows "
                          "(validated distributed at every epoch end)", typeConverter=TypeConverters.toString)
    validationSplit = Param(Params._dummy(), "validationSplit", "fraction of the rows held out for validation "
                            "(0: none)", typeConverter=TypeConverters.toFloat)
    mlflow = Param(Params._dummy(), "mlflow", "log the fit to MLflow (active run or a new one)",
                   typeConverter=TypeConverters.toBoolean)
    seed = Param(Params._dummy(), "seed", "random seed", typeConverter=TypeConverters.toInt)
    customObjects = Param(Params._dummy(), "customObjects", "dict of custom Keras objects",
                          typeConverter=TypeConverters.identity)
    callbacks = Param(Params._dummy(), "callbacks", "Keras callbacks run on the driver at every epoch end "
                      "(not saved with the estimator)", typeConverter=TypeConverters.identity)
    trainerOptions = Param(Params._dummy(), "trainerOptions", "other trainer.Trainer keyword arguments "
                           "(e.g. {'verbose': False, 'checkpoint_dir': ...})", typeConverter=TypeConverters.identity)

    #: Params saved in the metadata JSON; the others are saved as blobs (bytes).
    SIMPLE = ("featuresCol", "labelCol", "predictionCol", "numWorkers", "epochs", "batchSize", "validationCol",
              "validationSplit", "mlflow", "seed")

    def __init__(self) -> None:
        super().__init__()
        default = FitOptions.default  # one source of the defaults: trainer.options
        self._setDefault(algorithm=default("algorithm"), numWorkers=default("num_workers"), epochs=default("epochs"),
                         batchSize=default("batch_size"), validationSplit=0.0, mlflow=default("mlflow"),
                         seed=default("seed"))


for _name in ("model", "algorithm", "numWorkers", "epochs", "batchSize", "validationCol", "validationSplit", "mlflow",
              "seed", "customObjects", "callbacks", "trainerOptions"):
    _upper = _name[0].upper() + _name[1:]

    def _getter(self, name=_name):
        return self.getOrDefault(getattr(self, name))

    def _setter(self, value, name=_name):
        return self._set(**{name: value})

    _getter.__doc__ = f"Gets the value of {_name} or its default."
    _setter.__doc__ = f"Sets the value of :py:attr:`{_name}`."
    setattr(KerasEstimatorParams, f"get{_upper}", _getter)
    setattr(KerasEstimatorParams, f"set{_upper}", _setter)
