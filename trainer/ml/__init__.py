"""The Spark ML face of the trainer: `KerasEstimator` (a ``pyspark.ml.Estimator`` wrapping
``trainer.Trainer``) and `KerasModel` (the ``pyspark.ml.Model`` it returns), both readable and
writable, so that they sit in a ``Pipeline`` and round-trip with ``PipelineModel.save``/``load``.

    KerasEstimator, KerasModel   -- trainer.ml.estimator, trainer.ml.model
    KerasParams                  -- trainer.ml.params (the Params both share)
"""

from trainer.ml.estimator import KerasEstimator
from trainer.ml.model import KerasModel
from trainer.ml.params import KerasParams

__all__ = ["KerasEstimator", "KerasModel", "KerasParams"]
