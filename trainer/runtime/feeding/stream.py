"""Minibatches for ``model.fit`` streamed from a worker's spill file, through a bounded shuffle buffer.

The out-of-core counterpart of `trainer.runtime.feeding.feed.ShardFeed`, with the same
``fit_kwargs`` interface. Every pass (every ``fit`` call, or every new
iterator of its dataset) reads the spill file (`trainer.runtime.feeding.spill`) once:

1. the order of the file's blocks (about 1 MB each) is shuffled;
2. blocks in that order fill a buffer of about `BUFFER_BYTES`, which is
   shuffled as a whole (in place) and cut into minibatches; the rows that do not fill a
   last minibatch move on into the next buffer;
3. the last buffer of the pass gives the rest (the last minibatch may be
   smaller, as with the in-memory feed).

So every row comes exactly once per pass, the number of minibatches per pass
is ``ceil(rows / batch_size)`` on both paths (synchronous algorithms need every
worker at every round), and the memory used is a few buffers, whatever the
shard's size. Pass ``k`` of a feed seeded ``s`` draws its order from
``numpy.random.default_rng([s, k])``: the same seed gives the same passes.
The order is not the in-memory feed's (that one is drawn by TensorFlow).

With TensorFlow the buffers enter a ``tf.data`` pipeline with the in-memory
feed's single-thread settings (no parallel map, no prefetch, a private
thread pool of one, autotune off); each buffer is one element, cut into
minibatches by ``tf.data`` (the TensorFlow backend's room,
``trainer.backends.tensorflow``). A backend whose room does not feed
``tf.data`` gets a Python generator of minibatches.
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import numpy as np

from trainer.backends import current
from trainer.runtime.feeding.spill import Spill

BUFFER_BYTES = 16 << 20  # the shuffle buffer: about 16 MB of samples


class StreamFeed:
    """The ``fit`` keyword arguments for a spilled shard; reusable across ``fit`` calls.

    Args:
        spill: a `Spill` whose rows are written and flushed.
        seed: Integer or None. Seeds the order of every pass.
        buffer_bytes: Integer. About this many bytes of samples are shuffled together.
    """

    def __init__(self, spill: Spill, seed: int | None = None, buffer_bytes: int = BUFFER_BYTES) -> None:
        if spill.rows != sum(b.rows for b in spill.blocks):
            raise ValueError(f"The spill holds {spill.rows} rows but only "
                             f"{sum(b.rows for b in spill.blocks)} are written; call flush() first.")
        self.spill, self.seed = spill, seed
        row_bytes = 4 * (spill.width + (spill.label_size or 1))
        self.buffer_rows = max(1, int(buffer_bytes) // row_bytes)
        self.passes = 0  # passes started so far
        self._datasets: dict[int, Any] = {}  # batch size -> dataset; every iterator starts a new pass

    @property
    def rows(self) -> int:
        return self.spill.rows

    def batches_per_pass(self, batch_size: int) -> int:
        return math.ceil(self.rows / batch_size)

    def windows(self, batch_size: int, pass_index: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The shuffled buffers of one pass as (x, y) numpy views; every buffer but the last holds a
        multiple of `batch_size` rows. A buffer is not touched again once the next one is asked for.
        Without `pass_index`, the next pass."""
        if pass_index is None:
            pass_index, self.passes = self.passes, self.passes + 1
        rng = np.random.default_rng(None if self.seed is None else [int(self.seed), int(pass_index)])
        spill, width = self.spill, self.spill.width
        target = max(batch_size, self.buffer_rows // batch_size * batch_size)
        capacity = target + max(b.rows for b in spill.blocks) + batch_size if spill.blocks else 0
        # x and y side by side in one float32 array, so that one in-place shuffle moves both.
        columns = width + (spill.label_size or 1)
        buffer, held = np.empty((capacity, columns), np.float32), 0
        for block in rng.permutation(len(spill.blocks)):
            x, y = spill.read_block(int(block))
            buffer[held:held + len(x), :width] = x.reshape(len(x), width)
            buffer[held:held + len(x), width:] = y.reshape(len(x), -1)
            held += len(x)
            if held < target:
                continue
            rng.shuffle(buffer[:held])
            whole = held // batch_size * batch_size
            carry = buffer[whole:held].copy()
            full, buffer = buffer[:whole], None
            yield self._split(full)
            del full  # the consumer has the previous buffer; hold at most one more
            buffer = np.empty((capacity, columns), np.float32)
            held = len(carry)
            buffer[:held] = carry
        if held:
            rng.shuffle(buffer[:held])
            yield self._split(buffer[:held])

    def _split(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        spill = self.spill
        x = rows[:, :spill.width].reshape((len(rows), *spill.input_shape))
        y = rows[:, spill.width:]
        return x, (y[:, 0] if spill.label_size is None else y)

    def batches(self, batch_size: int, pass_index: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The minibatches of one pass as numpy arrays."""
        for x, y in self.windows(batch_size, pass_index):
            for start in range(0, len(x), batch_size):
                yield x[start:start + batch_size].copy(), y[start:start + batch_size].copy()

    def _stacks(self, batch_size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The buffers of the next pass as (minibatches, batch_size, ...) arrays; a last, smaller
        minibatch as a stack of one."""
        for x, y in self.windows(batch_size):
            whole = len(x) // batch_size * batch_size
            if whole:
                yield (np.ascontiguousarray(x[:whole]).reshape(-1, batch_size, *x.shape[1:]),
                       np.ascontiguousarray(y[:whole]).reshape(-1, batch_size, *y.shape[1:]))
            if whole < len(x):
                yield np.ascontiguousarray(x[whole:])[None], np.ascontiguousarray(y[whole:])[None]

    def fit_kwargs(self, batch_size: int) -> dict[str, Any]:
        """Inputs for ``model.fit`` in minibatches of `batch_size` rows: a new pass each time."""
        backend = current()
        if not backend.feeds_tf_data:
            return {"x": self.batches(batch_size)}
        if batch_size not in self._datasets:
            size = int(batch_size)
            self._datasets[batch_size] = backend.stack_dataset(
                lambda: self._stacks(size), self.spill.input_shape, self.spill.label_size, self.batches_per_pass(size))
        # shuffle=False: the dataset shuffles itself; fit's default True only draws a warning.
        return {"x": self._datasets[batch_size], "shuffle": False}
