"""Minibatches for ``model.fit`` from a worker's numpy shard, on one thread.

Given numpy arrays, Keras's TensorFlow backend builds an input pipeline with
an autotuned parallel ``map`` and ``prefetch``: background threads that fill
the other cores while the training step runs. That pays off on an idle
machine and costs on a full one. With one single-core worker per core, those
threads compete with the other workers (and the parameter server) for the
same cores, and every batch becomes a hand-off between threads that waits
for the scheduler. Measured on the 2-vCPU development machine, two concurrent
single-threaded LSTM trainers fed by Keras's pipeline often got only 64-77 %
of a core each; fed by this one they kept 98-99 %.

`ShardFeed` holds the shard as tensors once (not once per ``fit`` call) and
gives ``fit`` a dataset that gathers each batch by index on the calling
thread: no parallel map, no prefetch, a private thread pool of one, autotune
off. The pipeline is the TensorFlow backend's room's (``trainer.backends.tensorflow``); a backend whose room
does not feed ``tf.data`` gets the numpy arrays unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainer.backends import current


class ShardFeed:
    """The ``fit`` keyword arguments for one shard; reusable across ``fit`` calls.

    Args:
        x: Numpy array of inputs, one row per sample.
        y: Numpy array of labels, same length as `x`.
        seed: Integer or None. Seeds the reshuffle of each pass.
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, seed: int | None = None) -> None:
        if len(x) != len(y):
            raise ValueError(f"x has {len(x)} rows and y has {len(y)}; they must match.")
        self.x, self.y, self.seed = x, y, seed
        self._backend = current()
        self._tensors = self._backend.host_tensors(x, y) if self._backend.feeds_tf_data else None
        self._shuffled: dict[int, Any] = {}  # batch size -> dataset; it reshuffles itself every pass

    def fit_kwargs(self, batch_size: int, order: np.ndarray | None = None) -> dict[str, Any]:
        """Inputs for ``model.fit`` in minibatches of `batch_size` rows (the last one may be
        smaller): a fresh shuffle each pass, or the rows in `order` when given."""
        if self._tensors is None:
            if order is None:
                return {"x": self.x, "y": self.y, "batch_size": batch_size, "shuffle": True}
            return {"x": self.x[order], "y": self.y[order], "batch_size": batch_size, "shuffle": False}
        if order is None and batch_size in self._shuffled:
            return {"x": self._shuffled[batch_size], "shuffle": False}
        dataset = self._backend.index_dataset(self._tensors, len(self.x), batch_size, order, self.seed)
        if order is None:
            self._shuffled[batch_size] = dataset
        # shuffle=False: the dataset shuffles itself; fit's default True only draws a warning.
        return {"x": dataset, "shuffle": False}
