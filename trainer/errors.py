"""The errors the user API raises, in one place (the transport's own are in ``trainer.transport.wire``).

Every message says what was expected, what was received and how to fix it.
"""

from __future__ import annotations


class DataValidationError(ValueError):
    """The DataFrame does not fit the model or the training set-up."""


class ClusterCapacityError(RuntimeError):
    """The cluster cannot run the requested number of workers at the same time.

    `slots` is the number of concurrent task slots last seen (None when unknown).
    """

    def __init__(self, message: str, slots: int | None = None) -> None:
        super().__init__(message)
        self.slots = slots


class TrainingFailedError(RuntimeError):
    """A worker task failed; the message carries the root cause from the executor."""


class TaskFailedError(RuntimeError):
    """A deterministic error in the user's model or code inside a Spark task (a custom class that
    cannot be found, a shape error in the model): raised at once with the executor's message,
    without Spark's task retries."""


class CheckpointError(ValueError):
    """A checkpoint is missing, unreadable, damaged, or does not match the run."""


class ClusterError(RuntimeError):
    """The local cluster could not be started (or a daemon died)."""


class JavaError(ClusterError):
    """No usable Java runtime (missing, or older than 17)."""


class UnsupportedVersionError(ImportError):
    """A library (or the Spark the session runs) is older than this package supports."""


class MasterUnreachableError(ConnectionError):
    """The Spark master URL names no reachable master."""


class OptionError(ValueError):
    """An option of a fit or a search has a value it cannot take (``trainer.options``: which, and the fix)."""


class SelectionError(ValueError):
    """A model-selection run was configured in a way it cannot work with."""


class ConnectUnsupportedError(NotImplementedError):
    """A Spark Connect session lacks something this operation needs (the message says what and why)."""
