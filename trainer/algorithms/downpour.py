"""DOWNPOUR (Dean et al., 2012): asynchronous accumulated-update SGD.

Every ``window`` batches a worker commits ``delta = W - W0`` (its progress since
its last exchange); the server adds it to the center (``C += delta``) and the
worker continues from the new center (``W = W0 = C``). Optimizer state stays
local to each worker (moments keep tracking the worker's own trajectory).

What ``algorithm="auto"`` (``Trainer``'s default) runs for one worker, for CPU workers on one host or on hosts not
known, and with the parameter server's own options (``trainer.algorithms.choice``), with ``window="auto"``: every
batch any worker trains moves the center once, as every batch moves plain
Keras's model once, so at the learning rate tuned for one Keras process N
workers learn about as much per epoch as that process (the table in
docs/algorithms.md: 1 to 8 workers against plain Keras). Dividing the
commits by N (averaging) or by the window (ADAG) learns N or `window` times
less per epoch at that rate. What grows with N is staleness: a commit is
based on a center that misses the others' last ``(N - 1) * window`` batches;
an automatic window (``trainer.algorithms.cadence``) is sized by time and keeps
it within ``STALENESS_BUDGET`` batches (5: 2 workers exchange every 5
batches at most, 4 and more every batch). A fixed long window with many
workers diverges (>= 12 workers or window >= 15 in dist-keras' measurements).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from trainer.algorithms.delta import DeltaAlgorithm


@dataclass(frozen=True)
class DOWNPOUR(DeltaAlgorithm):
    window: int | str | None = "auto"

    name: ClassVar[str] = "downpour"
