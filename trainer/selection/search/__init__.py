"""The searches: what to try next (samplers) and whether a trial goes on (pruners), composed.

============================  ===========================  ==========================================
search                        sampler (what to try)        pruner (whether a trial goes on)
============================  ===========================  ==========================================
:class:`GridSearch`           grid                         none
:class:`RandomSearch`         random                       none
:class:`SuccessiveHalving`    a Grid or Random search      successive halving (synchronous)
:class:`Hyperband`            random                       Hyperband (successive-halving brackets)
:class:`TPESearch`            TPE                          none or ASHA (``pruner="asha"``)
:class:`ASHA`                 random or TPE                ASHA (asynchronous)
============================  ===========================  ==========================================

The files: ``space.py`` (parameters and spaces), ``protocol.py`` (what every search is: ``Metric``,
``Config``, ``Decision``, the ``Search`` interface with its optional abilities declared), ``samplers.py``,
``pruners.py`` (one rung ladder, ``Rungs``, for all of them) and ``model_based.py`` (the Optuna study that
composes a sampler and a pruner trial by trial). A new search answers the two questions in one file: a
``Search`` subclass, or a ``Sampler`` or ``Pruner`` object for the model-based one. Optuna is imported only when
a model-based search is made (see ``model_based.py``).
"""

from trainer.selection.search.protocol import (Config, Decision, Metric, Search, SearchError, check_rungs,
                                               search_names)
from trainer.selection.search.pruners import Hyperband, SuccessiveHalving
from trainer.selection.search.samplers import GridSearch, RandomSearch

__all__ = ["search_names", "SearchError", "Metric", "Config", "Decision", "Search", "GridSearch", "RandomSearch",
           "SuccessiveHalving", "Hyperband", "check_rungs"]
