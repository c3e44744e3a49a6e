"""`EpochEnds`: a driver-side hook called once at the end of every epoch that EVERY worker finished.

``Trainer(on_epoch_end=fn)`` wires it to the parameter server's EPOCH_DONE
events: when the last worker of an attempt reports an epoch, ``fn(epoch,
center, time)`` runs with the epoch (0-based), a copy of the center's arrays
(model weights first, then optimizer state for the algorithms that exchange it)
and the wall-clock time of that report. It runs on the server's thread,
serialized with the other server callbacks: keep it fast (copy, record,
return) and do any evaluation after ``fit``. With shared epochs, the center
may already hold a few commits of the next epoch from a worker that went on.

This is the minimal hook the time-to-target measurement of the jobs needs;
it neither stops training nor changes what the workers do.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from trainer.ps.epochs import completed_epochs

EpochEndHook = Callable[[int, list[np.ndarray], float], Any]


class EpochEnds:
    """Calls `hook` once per completed epoch; `bind` it to the server before the stage starts."""

    def __init__(self, hook: EpochEndHook) -> None:
        self.hook = hook
        self.server: Any = None
        self.reported = -1  # the last epoch handed to the hook

    def bind(self, server) -> None:
        """Start after the epochs the server already counts as done (a resumed fit)."""
        self.server = server
        self.reported = completed_epochs(server.epochs_done, server.num_workers) - 1

    def on_epoch_done(self, worker: int, epoch: int) -> None:
        """The server's ``on_epoch_done`` callback."""
        done = completed_epochs(self.server.epochs_done, self.server.num_workers)
        while self.reported + 1 < done:
            self.reported += 1
            self.hook(self.reported, self.server.center(), time.time())
