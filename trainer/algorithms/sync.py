"""Synchronous model averaging (DL4J parameter averaging, Elephas synchronous mode).

Every ``every`` batches (or at the end of every epoch) all workers send their
weights; once the last one has arrived the server averages them and every
worker continues from the average, which becomes the center.

Optimizer state: by default it stays local to each worker (as in Elephas).
With ``average_optimizer_state=True`` the workers also send their optimizer
variables (Adam moments, iteration counter, ...) after the weights, and the
server averages those too, so all workers continue from identical state (as
DL4J's optional updater-state averaging). Averaging costs one extra copy of the
weights per optimizer slot on the wire; it matters most with few, long windows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from trainer.algorithms.base import AlgorithmConfigError, ParameterServerAlgorithm, check_window, copy_arrays


@dataclass(frozen=True)
class SyncAveraging(ParameterServerAlgorithm):
    every: int | Literal["epoch"] = "epoch"
    average_optimizer_state: bool = False

    name: ClassVar[str] = "sync"
    synchronous: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.every != "epoch":
            check_window(self.every, allow_epoch=False)
        if not isinstance(self.average_optimizer_state, bool):
            raise AlgorithmConfigError(
                "`average_optimizer_state` must be True or False. "
                f"Received: average_optimizer_state={self.average_optimizer_state!r}"
            )

    @property
    def window(self) -> int | None:  # type: ignore[override]
        return None if self.every == "epoch" else self.every

    @property
    def exchanges_optimizer_state(self) -> bool:  # type: ignore[override]
        return self.average_optimizer_state

    def worker_payload(self, weights, anchor):
        return list(weights)  # model_state's fresh arrays: no copy (see base)

    def worker_apply(self, weights, anchor, reply):
        return list(reply), list(reply)

    def server_round(self, center, payloads):
        if not payloads:
            raise ValueError("server_round needs at least one payload")
        mean = [
            np.mean(np.stack(group), axis=0).astype(group[0].dtype, copy=False)
            for group in zip(*payloads, strict=True)
        ]
        return mean, [copy_arrays(mean) for _ in payloads]

    def describe(self) -> str:
        state = ", optimizer state averaged" if self.average_optimizer_state else ""
        return f"sync(every {self.every}{'' if self.every == 'epoch' else ' batches'}{state})"
