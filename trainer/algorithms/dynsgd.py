"""DynSGD (Jiang et al., 2017): staleness-aware asynchronous SGD.

Every ``window`` batches a worker commits ``delta = W - W0``. The server knows
how many center updates other workers made since this worker last received the
center (its staleness ``s``) and applies ``C += delta / (s + 1)``: stale work
counts less. The worker continues from the new center. Optimizer state stays
local to each worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from trainer.algorithms.delta import DeltaAlgorithm


@dataclass(frozen=True)
class DynSGD(DeltaAlgorithm):
    window: int | str | None = 5

    name: ClassVar[str] = "dynsgd"

    def server_scale(self, staleness: int) -> float:
        return _scale(staleness)


def _scale(staleness: int) -> float:
    if staleness < 0:
        raise ValueError(f"staleness must be >= 0. Received: staleness={staleness}")
    return 1.0 / (staleness + 1)
