"""`DeltaAlgorithm`: the shared shape of DOWNPOUR, ADAG and DynSGD.

A worker commits its progress since its last exchange, ``delta = scale_w *
(W - W0)``; the server adds it, ``C += scale_s(staleness) * delta``, and replies
with the new center, which the worker adopts as its weights and its anchor
(no copies: see the contract in ``trainer.algorithms.base``). The three algorithms
differ only in the two scales.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from trainer.algorithms.base import Algorithm, Arrays, ParameterServerAlgorithm, add, add_into, sub


@dataclass(frozen=True)
class DeltaAlgorithm(ParameterServerAlgorithm):
    """Base of the delta algorithms; subclasses set `worker_scale` and `server_scale`."""

    auto_window: ClassVar[bool] = True

    def worker_scale(self) -> float:
        """What the worker multiplies its progress by before committing it."""
        return 1.0

    def server_scale(self, staleness: int) -> float:
        """What the server multiplies a commit by before adding it to the center."""
        return 1.0

    def worker_payload(self, weights, anchor):
        return sub(weights, anchor, scale=self.worker_scale())

    def worker_apply(self, weights, anchor, reply):
        return list(reply), list(reply)  # adopt the center as received

    def server_commit(self, center, payload, staleness):
        new_center = add(center, payload, scale=self.server_scale(staleness))
        return new_center, new_center

    def server_apply(self, center, payload, staleness, out):
        add_into(out, center, payload, scale=self.server_scale(staleness))


def overlappable(algorithm: Algorithm) -> bool:
    """Whether a worker may commit in the background and fold the reply a window later (`fold_late`):
    a delta algorithm with a window, possibly compressed."""
    inner = getattr(algorithm, "inner", algorithm)  # trainer.algorithms.compressed wraps a delta algorithm
    return isinstance(inner, DeltaAlgorithm) and algorithm.window is not None


def fold_late(reply, weights, anchor, out=None) -> Arrays:
    """A delta algorithm's reply (the center) that arrives one window late, folded into the worker's weights.

    The worker committed ``weights - anchor`` meanwhile without waiting, so
    its new weights are the center plus that progress, which the center has
    not seen yet: ``reply + (weights - anchor)``. Written into the arrays of
    `out` (it may be `weights` itself, the worker's own copy: no 4 MB
    temporaries per exchange); new arrays where `out` is None or read-only.
    """
    if out is None:
        out = [None] * len(weights)
    out = [o if o is not None and o.flags.writeable else np.empty_like(w) for o, w in zip(out, weights, strict=True)]
    for o, w, a in zip(out, weights, anchor, strict=True):
        np.subtract(w, a, out=o)
    add_into(out, reply, out)  # the shared in-place add (its dtype algorithms too)
    return out
