"""ADAG (Hermans, 2017): asynchronous distributed adaptive gradients.

Like DOWNPOUR, but the commit is the accumulated update normalised by the
window: ``delta = (W - W0) / window``; the server adds it (``C += delta``) and
the worker continues from the center. Normalising makes the algorithm far less
sensitive to the number of workers and to the window (stable from window 5 to
50 in the author's measurements; 10-15 recommended). Each worker's effective
step on the center is 1/window of its local progress, so ADAG is at its best
with an adaptive optimizer (Adam, Adagrad) and a moderately high learning rate.
Optimizer state stays local to each worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from trainer.algorithms.base import check_window
from trainer.algorithms.delta import DeltaAlgorithm


@dataclass(frozen=True)
class ADAG(DeltaAlgorithm):
    window: int = 12

    name: ClassVar[str] = "adag"
    auto_window: ClassVar[bool] = False  # its commits are divided by the window: a fixed number

    def __post_init__(self) -> None:
        check_window(self.window, allow_epoch=False)

    def worker_scale(self) -> float:
        return 1.0 / self.window
