"""Data-parallel training of Keras 3 models on Apache Spark DataFrames.

Public API (imported lazily, so ``python -m trainer.cluster`` stays light):
    Trainer, FittedModel, TrainingHistory     -- trainer.estimator
    SingleWorker, SyncAveraging, DOWNPOUR, ADAG, EASGD, AEASGD, DynSGD, get_algorithm
                                              -- trainer.algorithms
    LocalCluster                              -- trainer.cluster
    spark_session                             -- trainer.session
    DataValidationError                       -- trainer.data.validate
    ClusterCapacityError, TrainingFailedError -- trainer.launch
"""

from __future__ import annotations

import importlib
import os
import warnings

# Quiet by default: TensorFlow's C++ start-up banners, and PySpark's notice that
# it has not certified pandas 3 (the Arrow paths used here work with it).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)

_EXPORTS = {
    "trainer.algorithms": [
        "ADAG", "AEASGD", "DOWNPOUR", "EASGD", "Algorithm", "DynSGD", "SingleWorker", "SyncAveraging",
        "get_algorithm",
    ],
    "trainer.cluster": ["LocalCluster"],
    "trainer.data.validate": ["DataValidationError"],
    "trainer.estimator": ["FittedModel", "Trainer", "TrainingHistory"],
    "trainer.launch": ["ClusterCapacityError", "TrainingFailedError"],
    "trainer.session": ["spark_session"],
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'trainer' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)


def __dir__():
    return __all__
