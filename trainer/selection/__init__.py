"""Model selection: search spaces, searches and model hopper parallelism on Spark.

    choice, uniform, loguniform, quniform, randint, when, sample,
    grid                                                         -- trainer.selection.space
    Search (what every search is), Metric, Config, GridSearch,
    RandomSearch, SuccessiveHalving, Hyperband                   -- trainer.selection.search
    TPESearch, ASHA (Optuna, the [search] extra)                 -- trainer.selection.model_based
    MopScheduler, simulate                                       -- trainer.selection.scheduler
    TaskParallelScheduler                                        -- trainer.selection.baseline
    ModelSelector, STRATEGIES                                    -- trainer.selection.selector
    SelectionResult, load_schedule                               -- trainer.selection.result
    SelectionCallback                                            -- trainer.selection.callbacks
    SelectionError, CheckpointError                              -- trainer.errors

The rooms: ``space``/``search``/``model_based`` say what to try; ``scheduler``/``baseline`` decide
who trains what when (pure, events in, assignments out); ``selector`` plans a
search and launches it; ``driver`` is the driver-side state the ``hopper`` server
acts on; ``task`` runs on the executors; ``result``/``plots``/``checkpoint`` keep
what came out. Keras is imported only when a search runs, Optuna only when a
model-based search is made.
"""

from trainer.errors import CheckpointError, SelectionError
from trainer.selection.baseline import TaskParallelScheduler
from trainer.selection.callbacks import SelectionCallback
from trainer.selection.model_based import ASHA, TPESearch
from trainer.selection.result import SelectionResult, load_schedule
from trainer.selection.scheduler import MopScheduler, simulate
from trainer.selection.search import (Config, GridSearch, Hyperband, Metric, RandomSearch, Search,
                                      SuccessiveHalving)
from trainer.selection.selector import STRATEGIES, ModelSelector
from trainer.selection.space import choice, grid, loguniform, quniform, randint, sample, uniform, when

__all__ = [
    "ASHA",
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
    "Search",
    "SelectionResult",
    "SuccessiveHalving",
    "TPESearch",
    "TaskParallelScheduler",
    "choice",
    "grid",
    "load_schedule",
    "loguniform",
    "quniform",
    "randint",
    "sample",
    "simulate",
    "uniform",
    "when",
]
