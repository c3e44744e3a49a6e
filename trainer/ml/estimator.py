"""`KerasEstimator`: ``trainer.Trainer`` as a Spark ML ``Estimator``.

Example::

    from pyspark.ml import Pipeline
    from pyspark.ml.feature import StandardScaler, VectorAssembler
    from trainer.ml import KerasEstimator

    pipeline = Pipeline(stages=[
        VectorAssembler(inputCols=["x1", "x2", "x3"], outputCol="raw"),
        StandardScaler(inputCol="raw", outputCol="features"),
        KerasEstimator(model=build, numWorkers=2, epochs=4, batchSize=32,
                       labelCol="y", validationSplit=0.1, mlflow=True),
    ])
    fitted = pipeline.fit(df)                 # a PipelineModel whose last stage is a KerasModel
    fitted.save("pipeline"); PipelineModel.load("pipeline").transform(df)

One implementation: ``fit`` builds a `Trainer` from the Params and calls
``Trainer.fit`` (with ``validation=`` from `validationCol` or
`validationSplit`, and the `callbacks`); the result is a `KerasModel`.
"""

from __future__ import annotations

from typing import Any

from pyspark import keyword_only
from pyspark.ml import Estimator
from pyspark.sql import functions as F

from trainer.fit.trainer import Trainer
from trainer.ml.model import KerasModel
from trainer.ml.params import KerasEstimatorParams, algorithm_from_json, algorithm_to_json
from trainer.ml.persistence import StagePersistence, pickled, read_stage, unpickled, write_stage
from trainer.runtime.shipping import load_keras_bytes, pack_model


class KerasEstimator(Estimator, KerasEstimatorParams, StagePersistence):
    """Data-parallel training of a Keras model as a Spark ML stage; see the module docstring.

    Params (Spark ML camelCase): ``model`` (a compiled ``keras.Model`` or a
    function returning one), ``algorithm`` (``"auto"``, the default: chosen
    per fit, ``trainer.algorithms.choice``; ``"downpour"``, ``DynSGD(window=5)``,
    ...), ``numWorkers``, ``epochs``, ``batchSize``, ``featuresCol``,
    ``labelCol``, ``predictionCol``, ``validationCol`` (a boolean column
    marking validation rows) or ``validationSplit`` (a fraction), ``mlflow``,
    ``seed``, ``customObjects``, ``callbacks`` (Keras callbacks, run on the
    driver) and ``trainerOptions`` (any other ``Trainer`` argument).
    """

    @keyword_only
    def __init__(self, *, model: Any = None, algorithm: Any = "auto", numWorkers: int = 2, epochs: int = 1,
                 batchSize: int = 32, featuresCol: str = "features", labelCol: str = "label",
                 predictionCol: str = "prediction", validationCol: str | None = None, validationSplit: float = 0.0,
                 mlflow: bool = False, seed: int = 0, customObjects: dict | None = None,
                 callbacks: list | None = None, trainerOptions: dict | None = None) -> None:
        super().__init__()
        self.setParams(**self._input_kwargs)

    @keyword_only
    def setParams(self, *, model: Any = None, algorithm: Any = "auto", numWorkers: int = 2, epochs: int = 1,
                  batchSize: int = 32, featuresCol: str = "features", labelCol: str = "label",
                  predictionCol: str = "prediction", validationCol: str | None = None, validationSplit: float = 0.0,
                  mlflow: bool = False, seed: int = 0, customObjects: dict | None = None,
                  callbacks: list | None = None, trainerOptions: dict | None = None) -> "KerasEstimator":
        """Sets the Params given (keyword arguments only)."""
        kwargs = {k: v for k, v in self._input_kwargs.items() if v is not None}
        return self._set(**kwargs)

    def trainer(self) -> Trainer:
        """The `Trainer` these Params describe (its checks run here, before any cluster work)."""
        if not self.isDefined(self.model):
            raise ValueError("KerasEstimator needs `model`: a compiled keras.Model or a function returning one. "
                             "Fix: KerasEstimator(model=build, ...).")
        options = dict(self.getOrDefault(self.trainerOptions)) if self.isDefined(self.trainerOptions) else {}
        return Trainer(
            self.getModel(), algorithm=self.getAlgorithm(), num_workers=self.getNumWorkers(),
            batch_size=self.getBatchSize(), epochs=self.getEpochs(), features_col=self.getFeaturesCol(),
            label_col=self.getLabelCol(), seed=self.getSeed(), mlflow=self.getMlflow(),
            custom_objects=self.getOrDefault(self.customObjects) if self.isDefined(self.customObjects) else None,
            **options,
        )

    def _fit(self, dataset) -> KerasModel:
        trainer = self.trainer()
        train, validation = dataset, None
        if self.isDefined(self.validationCol):
            flag = F.col(f"`{self.getValidationCol()}`").cast("boolean")
            train, validation = dataset.filter(~flag), dataset.filter(flag)
        elif self.getValidationSplit() > 0:
            validation = self.getValidationSplit()
        callbacks = self.getOrDefault(self.callbacks) if self.isDefined(self.callbacks) else None
        fitted = trainer.fit(train, validation=validation, callbacks=list(callbacks or []))
        return self._copyValues(KerasModel(fitted))

    # -- persistence ------------------------------------------------------------------
    def _save_to(self, path: str, spark) -> None:
        import keras  # deferred: TensorFlow starts only when a model is needed

        params = {name: self.getOrDefault(name) for name in self.SIMPLE if self.isDefined(getattr(self, name))}
        params["algorithm"] = algorithm_to_json(self.getAlgorithm())
        blobs: dict[str, bytes] = {}
        if self.isDefined(self.model):
            model = self.getModel()
            objects = self.getOrDefault(self.customObjects) if self.isDefined(self.customObjects) else None
            if isinstance(model, keras.Model):
                package = pack_model(model, objects)
                blobs["model.keras"] = package.data
                objects = package.custom_objects
            else:
                blobs["builder"] = pickled(model)
            if objects:
                blobs["custom_objects"] = pickled(objects)
        if self.isDefined(self.trainerOptions):
            blobs["trainer_options"] = pickled(self.getOrDefault(self.trainerOptions))
        write_stage(self, path, spark, params, blobs)

    @classmethod
    def _load_from(cls, path: str, spark) -> "KerasEstimator":
        metadata, blobs = read_stage(path, spark)
        params = dict(metadata["paramMap"])
        params["algorithm"] = algorithm_from_json(params["algorithm"])
        estimator = cls(**params)
        estimator._resetUid(metadata["uid"])
        objects = unpickled(blobs["custom_objects"]) if "custom_objects" in blobs else None
        if objects:
            estimator.setCustomObjects(objects)
        if "model.keras" in blobs:
            estimator.setModel(load_keras_bytes(blobs["model.keras"], objects))
        elif "builder" in blobs:
            estimator.setModel(unpickled(blobs["builder"]))
        if "trainer_options" in blobs:
            estimator.setTrainerOptions(unpickled(blobs["trainer_options"]))
        return estimator
