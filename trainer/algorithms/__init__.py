"""Distributed algorithms: pure numpy functions, one module per algorithm.

Pick one by instance (``ADAG(window=12)``) or by name through
:func:`get_algorithm` (``get_algorithm("adag", window=12)``).
"""

from __future__ import annotations

import dataclasses

from trainer.algorithms.adag import ADAG
from trainer.algorithms.allreduce import AllReduce
from trainer.algorithms.base import (
    COLLECTIVE, PARAMETER_SERVER, Algorithm, AlgorithmConfigError, CollectiveAlgorithm, ParameterServerAlgorithm,
)
from trainer.algorithms.choice import AlgorithmChoice, FitFacts, choose_algorithm
from trainer.algorithms.compressed import Compressed, with_compression
from trainer.algorithms.compression import BFloat16, Codec, Float16, TopK, parse_compression
from trainer.algorithms.downpour import DOWNPOUR
from trainer.algorithms.dynsgd import DynSGD
from trainer.algorithms.easgd import AEASGD, EASGD
from trainer.algorithms.local_sgd import LocalSGD
from trainer.algorithms.reported import ReportedState
from trainer.algorithms.single import SingleWorker
from trainer.algorithms.sync import SyncAveraging

ALGORITHMS: dict[str, type[Algorithm]] = {
    cls.name: cls for cls in (SingleWorker, SyncAveraging, DOWNPOUR, ADAG, EASGD, AEASGD, DynSGD, AllReduce, LocalSGD)
}


def get_algorithm(name: str | Algorithm, **kwargs) -> Algorithm:
    """Return an algorithm instance from its name (case-insensitive) or pass one through."""
    if isinstance(name, Algorithm):
        if kwargs:
            raise AlgorithmConfigError("Hyper-parameters can only be given with an algorithm name.")
        return name
    key = str(name).lower()
    if key not in ALGORITHMS:
        raise AlgorithmConfigError(
            f"Unknown algorithm {name!r}. Expected one of: {', '.join(ALGORITHMS)}."
        )
    fields = [f.name for f in dataclasses.fields(ALGORITHMS[key])]
    unknown = [k for k in kwargs if k not in fields]
    if unknown:  # e.g. a window for allreduce, which exchanges every step
        raise AlgorithmConfigError(
            f"{key} takes {'the hyper-parameters ' + ', '.join(fields) if fields else 'no hyper-parameters'}. "
            f"Received: {', '.join(f'{k}={kwargs[k]!r}' for k in unknown)}. Fix: leave out {', '.join(unknown)}."
        )
    return ALGORITHMS[key](**kwargs)


__all__ = [
    "ADAG", "AEASGD", "ALGORITHMS", "Algorithm", "AlgorithmChoice", "AlgorithmConfigError", "AllReduce", "BFloat16",
    "COLLECTIVE", "Codec", "CollectiveAlgorithm", "Compressed", "DOWNPOUR", "DynSGD", "EASGD", "FitFacts", "Float16",
    "LocalSGD", "PARAMETER_SERVER", "ParameterServerAlgorithm", "ReportedState", "SingleWorker", "SyncAveraging",
    "TopK", "choose_algorithm", "get_algorithm", "parse_compression", "with_compression",
]
