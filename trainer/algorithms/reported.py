"""`ReportedState`: the server-side algorithm of a collective fit's once-per-epoch endpoint.

In a collective fit (``AllReduce``, ``LocalSGD``) the tasks train and average
among themselves; the driver's server hears from task 0 alone, once per epoch,
for progress, checkpoints and the callbacks. Its center is simply the state
task 0 reported last, optimizer variables included: this algorithm says so, so that
the collective algorithms need not pose as parameter-server algorithms. Not an algorithm a
user names (it is not in ``ALGORITHMS``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Sequence

import numpy as np

from trainer.algorithms.base import Arrays, ParameterServerAlgorithm


@dataclass(frozen=True)
class ReportedState(ParameterServerAlgorithm):
    """The center becomes the state the one reporter sent; nothing goes back (it already holds it)."""

    name: ClassVar[str] = "reported state"
    exchanges_optimizer_state: ClassVar[bool] = True

    def server_commit(self, center: Sequence[np.ndarray], payload: Sequence[np.ndarray],
                      staleness: int) -> tuple[Arrays, Arrays]:
        return list(payload), []

    def describe(self) -> str:
        return "the state task 0 reports at each epoch end"
