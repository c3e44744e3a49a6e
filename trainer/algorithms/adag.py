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

from trainer.algorithms.base import Algorithm, add, add_into, check_window, sub


@dataclass(frozen=True)
class ADAG(Algorithm):
    window: int = 12

    name: ClassVar[str] = "adag"

    def __post_init__(self) -> None:
        check_window(self.window, allow_epoch=False)

    def worker_payload(self, weights, anchor):
        return sub(weights, anchor, scale=1.0 / self.window)

    def worker_apply(self, weights, anchor, reply):
        return list(reply), list(reply)  # adopt the center as received: no copies (see base)

    def server_commit(self, center, payload, staleness):
        new_center = add(center, payload)
        return new_center, new_center

    def server_apply(self, center, payload, staleness, out):
        add_into(out, center, payload)
