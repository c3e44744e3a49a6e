"""Periodic averaging over the group (local SGD): the average, its cadence, and the callback that runs them.

Under ``AllReduce(period=H)`` / ``LocalSGD`` each process of the collective
loop trains with Keras's own step on its own rows. Every ``H`` steps, and at
every epoch end, `PeriodicAveraging` averages the replicas' float weights in
ONE all-reduce (the group's ``all_reduce_host``: TensorFlow's collective ops,
``torch.distributed`` or a JAX ``psum`` on the backend's own engine):

* `Averager` (numpy in, numpy out) sends each process's delta since the last
  average, not its weights: the deltas are small, so bfloat16 on the wire
  (``wire="bf16"``) rounds them, not the weights, and what bfloat16 dropped is
  added to the next delta (error feedback: the parameter server's compressed
  commits' own codec and step, ``trainer.algorithms.compression``). With an
  outer momentum (``LocalSGD``'s 0.5) the trainable weights move by a
  Nesterov step over the averaged deltas, the
  same in every process (the velocity is the averages', not any process's
  own); weights that are not trained (BatchNormalization's statistics) move
  by the averaged delta alone;
* ``period="auto"`` sizes ``H`` from measured times by the formula every
  cadence follows (``trainer.algorithms.cadence.choose_period``): the smallest
  period that keeps one average under 5 % of the time of the steps between
  two, at most ``max_period``.

The optimizer's variables stay each process's own (local SGD's usual choice:
Adam's moments follow the process's own gradients); process 0's are the ones
the driver checkpoints.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

import numpy as np

from trainer.algorithms.cadence import PROBE_SKIP, PROBE_STEPS, choose_period
from trainer.algorithms.compression import BFloat16, compress_with_feedback
from trainer.backends import current

if TYPE_CHECKING:
    from trainer.algorithms.cadence import PeriodCadence


class Averager:
    """The mean of the processes' flat float32 weights, from their deltas since the last average.

    Args:
        anchor: 1-D float32 array. The weights every process held after the last average (the same everywhere).
        processes: Integer. The processes averaging.
        wire: String. ``"fp32"`` or ``"bf16"`` (how the deltas travel).
        momentum: Float in [0, 1). The outer Nesterov momentum (0: the anchor moves by the averaged delta).
        trained: 1-D bool array like `anchor`, or None (all). The weights the momentum applies to.
    """

    def __init__(self, anchor: np.ndarray, processes: int, wire: str = "fp32", momentum: float = 0.0,
                 trained: np.ndarray | None = None) -> None:
        self.anchor = np.array(anchor, dtype=np.float32, copy=True)
        self.processes, self.wire, self.momentum = int(processes), wire, float(momentum)
        self.residual = np.zeros_like(self.anchor) if wire == "bf16" else None
        self.velocity = np.zeros_like(self.anchor) if self.momentum else None
        self.trained = None if trained is None or np.all(trained) else np.asarray(trained, bool)

    @property
    def bytes_per_average(self) -> int:
        """The bytes of one process's delta on the wire."""
        return self.anchor.size * (2 if self.wire == "bf16" else 4)

    def average(self, weights: np.ndarray, all_reduce_sum: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """The averaged weights (also the new anchor), given this process's `weights` and a sum over the group
        (`all_reduce_sum`: an array in, the element-wise sum of every process's array out, same dtype)."""
        delta = np.asarray(weights, dtype=np.float32) - self.anchor
        if self.residual is not None:
            import ml_dtypes  # deferred: a dependency of Keras, the dtype the backends sum bfloat16 in

            (bits,), (self.residual,) = compress_with_feedback(BFloat16(), [delta], [self.residual])
            sent = bits.view(ml_dtypes.bfloat16)
        else:
            sent = delta
        step = np.asarray(all_reduce_sum(sent), dtype=np.float32) / self.processes
        if self.velocity is not None:  # Nesterov: v = m v + d; the weights move by d + m v
            self.velocity *= self.momentum
            self.velocity += step
            outer = step + self.momentum * self.velocity
            step = outer if self.trained is None else np.where(self.trained, outer, step)
        self.anchor += step
        return self.anchor


class FlatWeights:
    """A model's float weights (trainable and not: BatchNormalization's statistics too) as one float32 vector."""

    def __init__(self, model) -> None:
        self.model = model
        self.floats = [i for i, v in enumerate(model.weights) if "float" in str(v.dtype)]
        self.variables = [model.weights[i] for i in self.floats]
        self.shapes = [tuple(v.shape) for v in self.variables]
        self.sizes = [int(np.prod(s)) for s in self.shapes]
        trained = {id(v) for v in model.trainable_weights}
        self.trained = np.repeat([id(v) in trained for v in self.variables], self.sizes).astype(bool)

    def read(self) -> np.ndarray:
        """The float weights in one float32 vector (one host copy per dtype: the backend room's `read_weights`)."""
        weights = current().read_weights(self.model)
        return np.concatenate([np.asarray(weights[i], dtype=np.float32).reshape(-1) for i in self.floats]) \
            if self.floats else np.zeros(0, np.float32)

    def write(self, flat: np.ndarray) -> None:
        start = 0
        for variable, shape, size in zip(self.variables, self.shapes, self.sizes):
            variable.assign(flat[start:start + size].reshape(shape).astype(variable.dtype))
            start += size


def periodic_averaging(group, cadence: PeriodCadence, record: dict):
    """The Keras callback that averages `group`'s replicas every `cadence.period` steps and at every epoch end,
    sizing an automatic period first (the module docstring); what it chose and measured goes into `record`."""
    import keras  # deferred: the loop's process starts its backend after joining the group

    class PeriodicAveraging(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.period = 1 if cadence.period == "auto" else int(cadence.period)
            self.probing = cadence.period == "auto"
            self.since, self.seen = 0, 0
            self.step_times: list[float] = []
            self.average_times: list[float] = []
            self.flat: FlatWeights | None = None
            self.averager: Averager | None = None
            self.last = time.perf_counter()
            record.update(averages=0, average_s=0.0, period=None if self.probing else self.period, wire=cadence.wire,
                          outer_momentum=cadence.outer_momentum)

        def on_train_begin(self, logs=None):
            if self.flat is None:  # the weights every process loaded from the center: the first anchor
                self.flat = FlatWeights(self.model)
                self.averager = Averager(self.flat.read(), group.num_processes, cadence.wire, cadence.outer_momentum,
                                         self.flat.trained)
                record["average_bytes"] = self.averager.bytes_per_average
            self.last = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.since += 1
            if self.since >= self.period:
                self._average()

        def on_epoch_end(self, epoch, logs=None):
            if self.since:
                self._average()

        def _average(self) -> None:
            current().wait_for_steps(self.model)  # queued steps (JAX) are the steps' time, not the average's
            done = time.perf_counter()
            self.flat.write(self.averager.average(self.flat.read(), group.all_reduce_host))
            end = time.perf_counter()
            record["averages"] += 1
            record["average_s"] += end - done
            if self.probing:
                self._probe((done - self.last) / self.since, end - done)
            self.since, self.last = 0, end

        def _probe(self, step_s: float, average_s: float) -> None:
            self.seen += 1
            if self.seen > PROBE_SKIP:
                self.step_times.append(step_s)
                self.average_times.append(average_s)
            if self.seen < PROBE_STEPS:
                return
            # Every process takes the same period: from the times of all of them.
            mine = np.array([np.median(self.step_times), np.median(self.average_times)], np.float64)
            times = group.allgather(mine)
            step_s, average_s = float(times[:, 0].max()), float(times[:, 1].max())
            self.period, self.probing = choose_period(step_s, average_s, cadence.max_period), False
            record.update(period=self.period, probe_step_ms=1000 * step_s, probe_average_ms=1000 * average_s)

    return PeriodicAveraging()
