"""When a worker exchanges with the parameter server: every `window` batches, or sized by time.

A fixed window (``DOWNPOUR(window=5)``) fits one machine and one model: an
exchange costs about the same whatever the step costs, so a window that hides
it behind 5 CPU steps of 30 ms leaves it at half of a worker's time behind 5
GPU steps of 1.7 ms (measured on an H100: 18 ms an exchange, 0.33 of plain Keras).

``window="auto"`` (the default algorithm's) amortises the exchange over time
instead: after every exchange the worker measures the training time per
batch since the previous one and what the exchange cost its training thread,
and sizes the next window so that the exchange stays near `OVERHEAD` of the
time::

    window = ceil(exchange_s / (OVERHEAD * step_s))

within ``[MIN_WINDOW, max_window]``. The bound on top is for accuracy, not
speed: with N workers each commit is based on a center that misses the
other N - 1 workers' last windows, and DOWNPOUR adds every commit whole, so
two trajectories of `window` batches that started from the same center are
summed onto it. The time-sized window grows whenever steps slow down (a busy
machine, a noisy neighbour): on the full MNIST job at 2 workers it reached
20-27 batches, and four of twelve runs ended 0.7-3.6 points of test accuracy
below plain Keras, while a window of 5 never did (docs/algorithms.md has the
runs). At 4 workers a window of 5 cost 0.02 and at 8 workers 0.19, while a
window of 1 held; and with the timing taken out (`benchmarks/bench_staleness.py`:
workers in lockstep, the digits CNN near its optimum), 10 batches of
staleness cost 0.4 points of test accuracy on average over 20 seeds at 2
workers, 5 cost 0.1; at 4 workers 9 cost 1.0 and 3 cost 0.2. So the
staleness one commit carries, the batches the other workers trained since
its center, ``(N - 1) * window``, stays within
`STALENESS_BUDGET` batches at every N from two on::

    max_window = STALENESS_BUDGET // (N - 1)      (2 workers: 5, 3: 2, 4 and more: 1)

and within half an epoch of the shared data over ``N - 1`` (one worker:
half an epoch, so that progress, early stopping and the loss still come a
few times per epoch). One worker has no staleness: its window is sized by
time alone, which is what lets a worker on a GPU train at plain Keras's
speed.

The step and exchange times are smoothed (the mean of the last value and the
new one); the first window, which holds the model's compilation, is not
taken as a step time. Pure Python: the callback feeds it times and counts.
"""

from __future__ import annotations

import math

AUTO = "auto"
#: Share of a worker's time the exchanges of an automatic window aim at.
OVERHEAD = 0.05
MIN_WINDOW = 4
#: From two workers on, ``(N - 1) * window`` stays within this many batches (see the module docstring).
STALENESS_BUDGET = 5
#: The window of an automatic cadence before anything is measured.
FIRST_WINDOW = MIN_WINDOW


def max_auto_window(epoch_batches: int | None, workers: int) -> int:
    """The largest automatic window for `workers` sharing epochs of `epoch_batches` batches (module docstring)."""
    others = max(0, int(workers) - 1)
    bound = 1 << 20 if not epoch_batches else max(1, int(epoch_batches) // (2 * max(1, others)))
    if others >= 1:
        bound = min(bound, max(1, STALENESS_BUDGET // others))
    return bound


class Cadence:
    """Counts batches and says when the next exchange is due.

    Args:
        window: Integer (every `window` batches), None (once per epoch, never
            due between epoch ends) or ``"auto"`` (sized by time, see the module
            docstring).
        epoch_batches: Integer or None. Batches of one epoch over all workers
            (bounds an automatic window).
        workers: Integer. Workers training together.
    """

    def __init__(self, window: int | str | None, epoch_batches: int | None = None, workers: int = 1) -> None:
        self.auto = window == AUTO
        self.max_window = max_auto_window(epoch_batches, workers)
        self.window = min(FIRST_WINDOW, self.max_window) if self.auto else window
        self.step_s: float | None = None
        self.exchange_s: float | None = None
        self._windows_seen = 0

    def due(self, since: int) -> bool:
        """Whether an exchange is due after `since` batches since the last one."""
        return self.window is not None and since >= self.window

    def observe(self, batches: int, train_s: float, exchange_s: float) -> None:
        """One window measured: `batches` trained in `train_s` seconds, then an exchange that held the training
        thread `exchange_s` seconds. Sizes the next window of an automatic cadence."""
        if not self.auto or batches <= 0:
            return
        self._windows_seen += 1
        if self._windows_seen > 1:  # the first window holds the compilation of the train step
            step = max(train_s, 0.0) / batches
            self.step_s = step if self.step_s is None else (self.step_s + step) / 2
        cost = max(exchange_s, 0.0)
        self.exchange_s = cost if self.exchange_s is None else (self.exchange_s + cost) / 2
        if self.step_s:
            wanted = math.ceil(self.exchange_s / (OVERHEAD * self.step_s))
            self.window = max(min(MIN_WINDOW, self.max_window), min(self.max_window, wanted))

    def describe(self) -> str:
        if self.auto:
            return f"auto (now {self.window} batches, at most {self.max_window})"
        return "epoch" if self.window is None else f"{self.window} batches"
