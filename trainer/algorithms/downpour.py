"""DOWNPOUR (Dean et al., 2012): asynchronous accumulated-update SGD.

Every ``window`` batches a worker commits ``delta = W - W0`` (its progress since
its last exchange); the server adds it to the center (``C += delta``) and the
worker continues from the new center (``W = W0 = C``). Optimizer state stays
local to each worker (moments keep tracking the worker's own trajectory).
Commits add up, so N workers move the center about N times as far as one
worker at the same learning rate: start from 1/N of the single-worker rate.
Known weakness: diverges with many workers or long windows (>= 12 workers or
window >= 15 in dist-keras' measurements); prefer ADAG or DynSGD there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from trainer.algorithms.delta import DeltaRule


@dataclass(frozen=True)
class DOWNPOUR(DeltaRule):
    window: int | None = 5

    name: ClassVar[str] = "downpour"
