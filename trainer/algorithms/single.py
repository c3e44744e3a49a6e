"""SingleWorker: the one-worker baseline.

The only worker trains on all data and sends its full weights to the server at
the end of every epoch (or every ``window`` batches); the server simply keeps
them. Optimizer state never leaves the worker, exactly as in plain Keras.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from trainer.algorithms.base import AlgorithmConfigError, ParameterServerAlgorithm


@dataclass(frozen=True)
class SingleWorker(ParameterServerAlgorithm):
    window: int | None = None

    name: ClassVar[str] = "single"

    def check_workers(self, num_workers: int) -> None:
        if num_workers != 1:
            raise AlgorithmConfigError(
                f"SingleWorker trains on exactly one worker. Received: num_workers={num_workers}. "
                "Use DOWNPOUR, ADAG, EASGD, AEASGD, DynSGD or SyncAveraging for more workers."
            )

    def worker_payload(self, weights, anchor):
        return list(weights)  # model_state's fresh arrays: no copy (see base)

    def worker_apply(self, weights, anchor, reply):
        return list(reply), list(reply)

    def server_commit(self, center, payload, staleness):
        return list(payload), list(payload)
