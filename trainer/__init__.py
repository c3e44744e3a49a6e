"""Data-parallel training of Keras 3 models on Apache Spark DataFrames.

Public API (imported lazily, so ``python -m trainer`` and the executors stay light):
    Trainer                                   -- trainer.fit.trainer
    FittedModel, TrainingHistory              -- trainer.fit.fitted
    SingleWorker, SyncAveraging, DOWNPOUR, ADAG, EASGD, AEASGD, DynSGD, AllReduce, LocalSGD, Algorithm,
    get_algorithm, AlgorithmConfigError
                                              -- trainer.algorithms
    LocalCluster                              -- trainer.spark.local_cluster
    spark_session                             -- trainer.spark.session
    DataValidationError, ClusterCapacityError, TrainingFailedError, TaskFailedError, CheckpointError,
    ClusterError, JavaError, MasterUnreachableError, OptionError, UnsupportedVersionError, SelectionError,
    ConnectUnsupportedError
                                              -- trainer.errors

``docs/architecture.md`` shows the rooms of the package and the path of a fit.
"""

from __future__ import annotations

import importlib

from trainer import versions

# Below a supported version, fail here, naming the version needed, rather than deep inside a Spark job.
# Importing `trainer` changes nothing else in the user's process: the log levels and GPU memory settings are
# set where a session (trainer.spark.session.spark_session), a command or a task starts.
versions.check_installed()

_EXPORTS = {
    "trainer.algorithms": [
        "ADAG", "AEASGD", "AllReduce", "DOWNPOUR", "EASGD", "Algorithm", "AlgorithmConfigError", "DynSGD", "LocalSGD",
        "SingleWorker", "SyncAveraging", "get_algorithm",
    ],
    "trainer.errors": [
        "CheckpointError", "ClusterCapacityError", "ClusterError", "ConnectUnsupportedError", "DataValidationError",
        "JavaError", "MasterUnreachableError", "OptionError", "SelectionError", "TaskFailedError",
        "TrainingFailedError", "UnsupportedVersionError",
    ],
    "trainer.fit.trainer": ["Trainer"],
    "trainer.fit.fitted": ["FittedModel", "TrainingHistory"],
    "trainer.spark.local_cluster": ["LocalCluster"],
    "trainer.spark.session": ["spark_session"],
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'trainer' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)


def __dir__():
    return __all__
