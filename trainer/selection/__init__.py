"""Model selection: search spaces, searches and model hopper parallelism on Spark.

    choice, uniform, loguniform, quniform, randint, when, sample,
    grid                                                         -- trainer.selection.search.space
    Search (what every search is), Metric, Config                -- trainer.selection.search.protocol
    GridSearch, RandomSearch (samplers)                          -- trainer.selection.search.samplers
    SuccessiveHalving, Hyperband (pruners)                       -- trainer.selection.search.pruners
    TPESearch, ASHA (Optuna, the [search] extra)                 -- trainer.selection.search.model_based
    MopScheduler, simulate                                       -- trainer.selection.engine.placement
    TaskParallelScheduler                                        -- trainer.selection.engine.task_parallel
    STRATEGIES                                                   -- trainer.selection.engine.strategies
    ModelSelector                                                -- trainer.selection.selector
    SelectionResult, load_schedule                               -- trainer.selection.report.result
    SelectionCallback                                            -- trainer.selection.report.callbacks
    SelectionError, CheckpointError                              -- trainer.errors

The rooms: ``search/`` says what to try and whether a trial goes on (spaces, samplers, pruners, the
model-based search); ``engine/`` runs a search (placement of models on workers, pure: events in, assignments
out; the execution strategies; the driver-side run state; the hopper transport; checkpoints); ``report/`` keeps
what came out (result, plots, callbacks). ``selector`` plans a search and launches it; its task runs on
the executors (``trainer.runtime.search_worker``). Keras is imported only when a search runs, Optuna only when
a model-based search is made.
"""

from trainer.errors import CheckpointError, SelectionError
from trainer.selection.engine.placement import MopScheduler, simulate
from trainer.selection.engine.task_parallel import TaskParallelScheduler
from trainer.selection.report.callbacks import SelectionCallback
from trainer.selection.report.result import SelectionResult, load_schedule
from trainer.selection.search import (Config, GridSearch, Hyperband, Metric, RandomSearch, Search,
                                      SuccessiveHalving)
from trainer.selection.search.model_based import ASHA, TPESearch
from trainer.selection.search.space import choice, grid, loguniform, quniform, randint, sample, uniform, when
from trainer.selection.selector import STRATEGIES, ModelSelector

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
