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
off. Other Keras backends get the numpy arrays unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainer.runtime.backends import current_backend


class ShardFeed:
    """The ``fit`` keyword arguments for one shard; reusable across ``fit`` calls.

    Args:
        x: Numpy array of inputs, one row per sample.
        y: Numpy array of labels, same length as `x`.
        seed: Integer or None. Seeds the reshuffle of each pass.
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, seed: int | None = None) -> None:
        import keras  # deferred: TensorFlow starts only when a model is needed

        if len(x) != len(y):
            raise ValueError(f"x has {len(x)} rows and y has {len(y)}; they must match.")
        self.x, self.y, self.seed = x, y, seed
        self._tensors = None
        self._shuffled: dict[int, Any] = {}  # batch size -> dataset; it reshuffles itself every pass
        if current_backend().feeds_tf_data:
            import tensorflow as tf  # deferred, as keras

            with tf.device("/CPU:0"):  # tf.data runs on the host; on a GPU machine keep the shard there too
                self._tensors = (tf.constant(x), tf.constant(y))

    def fit_kwargs(self, batch_size: int, order: np.ndarray | None = None) -> dict[str, Any]:
        """Inputs for ``model.fit`` in minibatches of `batch_size` rows (the last one may be
        smaller): a fresh shuffle each pass, or the rows in `order` when given."""
        if self._tensors is None:
            if order is None:
                return {"x": self.x, "y": self.y, "batch_size": batch_size, "shuffle": True}
            return {"x": self.x[order], "y": self.y[order], "batch_size": batch_size, "shuffle": False}
        if order is None and batch_size in self._shuffled:
            return {"x": self._shuffled[batch_size], "shuffle": False}
        import tensorflow as tf  # deferred, as keras

        xt, yt = self._tensors
        if order is None:
            rows = len(self.x)
            indices = tf.data.Dataset.range(rows).shuffle(rows, seed=self.seed, reshuffle_each_iteration=True)
        else:
            indices = tf.data.Dataset.from_tensor_slices(np.asarray(order, dtype=np.int64))
        dataset = indices.batch(int(batch_size)).map(lambda i: (tf.gather(xt, i), tf.gather(yt, i)))
        options = tf.data.Options()
        options.threading.private_threadpool_size = 1
        options.threading.max_intra_op_parallelism = 1
        options.autotune.enabled = False
        dataset = dataset.with_options(options)
        if order is None:
            self._shuffled[batch_size] = dataset
        # shuffle=False: the dataset shuffles itself; fit's default True only draws a warning.
        return {"x": dataset, "shuffle": False}
