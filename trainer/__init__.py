"""Data-parallel training of Keras 3 models on Apache Spark DataFrames.

Public API:
    Trainer, FittedModel, TrainingHistory   -- trainer.estimator
    SingleWorker, SyncAveraging, DOWNPOUR, ADAG, EASGD, AEASGD, DynSGD, get_algorithm
                                            -- trainer.algorithms
    LocalCluster                            -- trainer.cluster
    spark_session                           -- trainer.session
    DataValidationError                     -- trainer.data.validate
    ClusterCapacityError, TrainingFailedError -- trainer.launch
"""

from .algorithms import ADAG, AEASGD, DOWNPOUR, EASGD, Algorithm, DynSGD, SingleWorker, SyncAveraging, get_algorithm
from .cluster import LocalCluster
from .data.validate import DataValidationError
from .estimator import FittedModel, Trainer, TrainingHistory
from .launch import ClusterCapacityError, TrainingFailedError
from .session import spark_session

__all__ = [
    "ADAG", "AEASGD", "Algorithm", "ClusterCapacityError", "DOWNPOUR", "DataValidationError", "DynSGD",
    "EASGD", "FittedModel", "LocalCluster", "SingleWorker", "SyncAveraging", "Trainer",
    "TrainingFailedError", "TrainingHistory", "get_algorithm", "spark_session",
]
