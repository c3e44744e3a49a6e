"""Elastic averaging SGD (Zhang, Choromanska & LeCun, 2015): EASGD and AEASGD.

Workers explore on their own and are pulled elastically towards a center
variable C, which is in turn pulled towards the workers. The exchange for a
worker with weights W and elastic coefficient ``alpha``:
``E = alpha * (W - C)``, the worker moves to ``W - E`` and the center to ``C + E``.

* ``EASGD`` is the synchronous variant: every ``window`` batches all workers
  exchange at once against the same center; ``C += sum_i alpha * (W_i - C)``.
  ``alpha = beta / num_workers`` (the paper's parameterisation, beta = 0.9), so
  the center never overshoots the workers whatever their number.
* ``AEASGD`` is the asynchronous variant used by dist-keras: each worker
  exchanges on its own schedule with ``alpha = rho * lr`` (defaults rho 5.0,
  lr 0.1, window 32; dist-keras found it needs windows >= 35 to shine).

In both, the server computes E and replies with the worker's new weights
``W - E``, so the worker side needs no hyper-parameter. Optimizer state stays
local to each worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from trainer.algorithms.base import AlgorithmConfigError, ParameterServerAlgorithm, add, sub


def _check_fraction(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
        raise AlgorithmConfigError(f"`{name}` must be in (0, 1]. Received: {name}={value!r}")


@dataclass(frozen=True)
class EASGD(ParameterServerAlgorithm):
    window: int | None = 32
    beta: float = 0.9

    name: ClassVar[str] = "easgd"
    synchronous: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_fraction("beta", self.beta)

    def worker_payload(self, weights, anchor):
        return list(weights)  # model_state's fresh arrays: no copy (see base)

    def worker_apply(self, weights, anchor, reply):
        return list(reply), list(reply)

    def server_round(self, center, payloads):
        alpha = self.beta / len(payloads)
        elastic = [sub(w, center, scale=alpha) for w in payloads]
        new_center = list(center)
        for e in elastic:
            new_center = add(new_center, e)
        replies = [add(w, e, scale=-1.0) for w, e in zip(payloads, elastic)]
        return new_center, replies

    def describe(self) -> str:
        return f"easgd(every {self.window} batches, beta={self.beta})"


@dataclass(frozen=True)
class AEASGD(ParameterServerAlgorithm):
    window: int | None = 32
    rho: float = 5.0
    lr: float = 0.1

    name: ClassVar[str] = "aeasgd"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_fraction("rho * lr", self.rho * self.lr)

    @property
    def alpha(self) -> float:
        return self.rho * self.lr

    def worker_payload(self, weights, anchor):
        return list(weights)  # model_state's fresh arrays: no copy (see base)

    def worker_apply(self, weights, anchor, reply):
        return list(reply), list(reply)

    def server_commit(self, center, payload, staleness):
        elastic = sub(payload, center, scale=self.alpha)
        return add(center, elastic), add(payload, elastic, scale=-1.0)

    def describe(self) -> str:
        return f"aeasgd(every {self.window} batches, rho={self.rho}, lr={self.lr})"
