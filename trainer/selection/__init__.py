"""Model selection: search spaces, searches and model hopper parallelism on Spark.

    choice, uniform, loguniform, quniform, sample, grid          -- trainer.selection.space
    Metric, Config, GridSearch, RandomSearch, SuccessiveHalving,
    Hyperband                                                    -- trainer.selection.search
    MopScheduler, simulate                                       -- trainer.selection.scheduler
    TaskParallelScheduler                                        -- trainer.selection.baseline
    ModelSelector, SelectionResult, SelectionCallback,
    SelectionError, STRATEGIES, load_schedule                    -- trainer.selection.runner
    CheckpointError                                              -- trainer.selection.checkpoint

Keras and PySpark are imported only when a search runs.
"""

from trainer.selection.baseline import TaskParallelScheduler
from trainer.selection.checkpoint import CheckpointError
from trainer.selection.runner import (
    STRATEGIES,
    ModelSelector,
    SelectionCallback,
    SelectionError,
    SelectionResult,
    load_schedule,
)
from trainer.selection.scheduler import MopScheduler, simulate
from trainer.selection.search import Config, GridSearch, Hyperband, Metric, RandomSearch, SuccessiveHalving
from trainer.selection.space import choice, grid, loguniform, quniform, sample, uniform

__all__ = [
    "STRATEGIES",
    "CheckpointError",
    "Config",
    "GridSearch",
    "Hyperband",
    "Metric",
    "ModelSelector",
    "MopScheduler",
    "RandomSearch",
    "SelectionCallback",
    "SelectionError",
    "SelectionResult",
    "SuccessiveHalving",
    "TaskParallelScheduler",
    "choice",
    "grid",
    "load_schedule",
    "loguniform",
    "quniform",
    "sample",
    "simulate",
    "uniform",
]
