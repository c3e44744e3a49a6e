"""`KerasModel`: what `KerasEstimator` fits, a Spark ML ``Model`` around a ``trainer.FittedModel``.

``transform`` adds `predictionCol` (float for one output unit, array<float>
otherwise), computed on the executors (``FittedModel.transform``);
``evaluate`` gives the loss and compiled metrics. It is MLWritable and
MLReadable, so a fitted ``PipelineModel`` saves and loads with it.
"""

from __future__ import annotations

from pyspark.ml import Model

from trainer.fit.fitted import FittedModel
from trainer.ml.params import KerasParams
from trainer.ml.persistence import StagePersistence, fitted_from_blobs, model_blobs, read_stage, write_stage


class KerasModel(Model, KerasParams, StagePersistence):
    """A trained Keras model as a Spark ML stage.

    Attributes:
        fitted: the ``trainer.FittedModel`` (``keras_model``, ``history``).
    """

    def __init__(self, fitted: FittedModel | None = None) -> None:
        super().__init__()
        self.fitted = fitted
        if fitted is not None:
            self._set(featuresCol=fitted.features_col if isinstance(fitted.features_col, str) else "features",
                      labelCol=fitted.label_col)

    @property
    def keras_model(self):
        return self.fitted.keras_model

    @property
    def history(self):
        return self.fitted.history

    def _fitted_for_columns(self) -> FittedModel:
        self.fitted.features_col = self.getFeaturesCol()
        self.fitted.label_col = self.getLabelCol()
        return self.fitted

    def _transform(self, dataset):
        return self._fitted_for_columns().transform(dataset, output_col=self.getPredictionCol())

    def evaluate(self, dataset, batch_size: int = 1024) -> dict[str, float]:
        """Loss and compiled metrics on `dataset` (``FittedModel.evaluate``)."""
        return self._fitted_for_columns().evaluate(dataset, batch_size=batch_size)

    # -- persistence ------------------------------------------------------------------
    def _save_to(self, path: str, spark) -> None:
        params = {name: self.getOrDefault(name) for name in ("featuresCol", "labelCol", "predictionCol")}
        write_stage(self, path, spark, params, model_blobs(self.fitted))

    @classmethod
    def _load_from(cls, path: str, spark) -> "KerasModel":
        metadata, blobs = read_stage(path, spark)
        model = cls(fitted_from_blobs(blobs))
        model._resetUid(metadata["uid"])
        model._set(**metadata["paramMap"])
        return model
