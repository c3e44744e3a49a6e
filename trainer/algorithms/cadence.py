"""How often workers exchange, for every kind of fit: one formula that sizes the parameter server's window and the
collective group's period, each bounded for accuracy.

**The formula.** An exchange costs about the same whatever a step costs, so a fixed count of steps between two
exchanges fits one machine and one model only: a window that hides a commit behind 5 CPU steps of 30 ms leaves it
at half of a worker's time behind 5 GPU steps of 1.7 ms (measured on an H100: 18 ms an exchange, 0.33 of plain
Keras). An automatic cadence measures the step and the exchange and takes the smallest count of steps that keeps
the exchange within `OVERHEAD` of the time (`steps_per_exchange`)::

    steps = ceil(exchange_s / (OVERHEAD * step_s))

**The parameter server's window** (`WindowCadence`, ``window="auto"``: DOWNPOUR's and DynSGD's): after every
exchange the worker measures the training time per batch since the previous one and what the exchange cost its
training thread, and sizes the next window by the formula, within ``[MIN_WINDOW, max_window]``. The bound on top is
for accuracy, not speed: with N workers each commit is based on a center that misses the other N - 1 workers'
last windows, and DOWNPOUR adds every commit whole, so two trajectories of `window` batches that started from the
same center are summed onto it. The time-sized window grows whenever steps slow down (a busy machine, a noisy
neighbour): on the full MNIST job at 2 workers it reached 20-27 batches, and four of twelve runs ended 0.7-3.6
points of test accuracy below plain Keras, while a window of 5 never did (docs/algorithms.md has the runs). At 4
workers a window of 5 cost 0.02 and at 8 workers 0.19, while a window of 1 held; and with the timing taken out
(`benchmarks/bench_staleness.py`: workers in lockstep, the digits CNN near its optimum), 10 batches of staleness
cost 0.4 points of test accuracy on average over 20 seeds at 2 workers, 5 cost 0.1; at 4 workers 9 cost 1.0 and 3
cost 0.2. So the staleness one commit carries, the batches the other workers trained since its center,
``(N - 1) * window``, stays within `STALENESS_BUDGET` batches at every N from two on::

    max_window = STALENESS_BUDGET // (N - 1)      (2 workers: 5, 3: 2, 4 and more: 1)

and within half an epoch of the shared data over ``N - 1`` (one worker: half an epoch, so that progress, early
stopping and the loss still come a few times per epoch). One worker has no staleness: its window is sized by time
alone, which is what lets a worker on a GPU train at plain Keras's speed. The step and exchange times are smoothed
(the mean of the last value and the new one); the first window, which holds the model's compilation, is not taken
as a step time.

**The collective group's period** (`PeriodCadence`, ``AllReduce(period="auto")``, `LocalSGD`): every process
averages every step for its first steps while the step and the average are timed, then every `choose_period`
steps, by the same formula, within ``[1, max_period]`` (`MAX_PERIOD`: local SGD kept its accuracy with up to 16 local
steps between averages, Lin et al., ICLR 2020). Every process takes the same period, from the slowest times.

Pure Python: the callers feed it times and counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Share of a worker's time the exchanges of an automatic cadence aim at (window and period alike).
OVERHEAD = 0.05

AUTO = "auto"
MIN_WINDOW = 4
#: From two workers on, ``(N - 1) * window`` stays within this many batches (see the module docstring).
STALENESS_BUDGET = 5
#: The window of an automatic cadence before anything is measured.
FIRST_WINDOW = MIN_WINDOW
#: The largest period a measured cadence (``period="auto"``) takes by default (the module docstring).
MAX_PERIOD = 16
#: Steps averaged every step at the start of a local SGD fit (a warm-up, as post-local SGD starts) while the step and
#: the average are timed; the first `PROBE_SKIP` of them (compilation, first transfers) are not timed.
PROBE_STEPS, PROBE_SKIP = 12, 3


def steps_per_exchange(exchange_s: float, step_s: float, overhead: float = OVERHEAD) -> int:
    """The smallest number of steps whose time makes one exchange at most `overhead` of it (at least 1)."""
    return max(1, math.ceil(exchange_s / (overhead * step_s)))


# --------------------------------------------------------------------------- the parameter server's window


def max_auto_window(epoch_batches: int | None, workers: int) -> int:
    """The largest automatic window for `workers` sharing epochs of `epoch_batches` batches (module docstring)."""
    others = max(0, int(workers) - 1)
    bound = 1 << 20 if not epoch_batches else max(1, int(epoch_batches) // (2 * max(1, others)))
    if others >= 1:
        bound = min(bound, max(1, STALENESS_BUDGET // others))
    return bound


class WindowCadence:
    """Counts a parameter-server worker's batches and says when its next exchange is due.

    Args:
        window: Integer (every `window` batches), None (once per epoch, never
            due between epoch ends) or ``"auto"`` (sized by time, see the module
            docstring).
        epoch_batches: Integer or None. Batches of one epoch over all workers
            (bounds an automatic window).
        workers: Integer. Workers training together.
        bound: Integer or None. The largest automatic window in place of the staleness bound (synchronous rounds
            carry no staleness: elastic local SGD's period, ``trainer.algorithms.elastic_local_sgd``).
        warmup: Integer. Exchanges after every step at the start of an automatic cadence (local SGD's warm-up,
            `PROBE_STEPS`), before the window is sized by time.
    """

    def __init__(self, window: int | str | None, epoch_batches: int | None = None, workers: int = 1,
                 bound: int | None = None, warmup: int = 0) -> None:
        self.auto = window == AUTO
        self.asynchronous = bound is None  # not rounds: a worker's exchanges wait for nobody
        self.max_window = max_auto_window(epoch_batches, workers) if bound is None else max(1, int(bound))
        self.warmup = int(warmup) if self.auto else 0
        self.window = 1 if self.warmup else min(FIRST_WINDOW, self.max_window) if self.auto else window
        self.step_s: float | None = None
        self.exchange_s: float | None = None
        self._windows_seen = 0

    def fit_at(self, exchanges: int) -> None:
        """The fit has made `exchanges` exchanges already (a worker that joins it): no warm-up the fit is past; an
        asynchronous automatic window exchanges first after one step, so that the joiner averages with the others
        once its first step (its compile with it) is done, not a window later."""
        if self.warmup and exchanges >= self.warmup:
            self.warmup = 0
            self.window = min(FIRST_WINDOW, self.max_window)
        if self.auto and self.asynchronous and exchanges > 0:
            self.window = 1

    def due(self, since: int) -> bool:
        """Whether an exchange is due after `since` batches since the last one."""
        return self.window is not None and since >= self.window

    def observe(self, batches: int, train_s: float, exchange_s: float) -> None:
        """One window measured: `batches` trained in `train_s` seconds, then an exchange that held the training
        thread `exchange_s` seconds. Sizes the next window of an automatic cadence."""
        if not self.auto or batches <= 0:
            return
        self._windows_seen += 1
        if self._windows_seen <= self.warmup:  # one step per exchange: the first ones, compilation included
            return
        if self._windows_seen > 1:  # the first window holds the compilation of the train step
            step = max(train_s, 0.0) / batches
            self.step_s = step if self.step_s is None else (self.step_s + step) / 2
        cost = max(exchange_s, 0.0)
        self.exchange_s = cost if self.exchange_s is None else (self.exchange_s + cost) / 2
        if self.step_s:
            wanted = steps_per_exchange(self.exchange_s, self.step_s)
            self.window = max(min(MIN_WINDOW, self.max_window), min(self.max_window, wanted))
        else:  # nothing timed yet: a joiner's one-step first window is over
            self.window = max(self.window, min(FIRST_WINDOW, self.max_window))

    def describe(self) -> str:
        if self.auto:
            return f"auto (now {self.window} batches, at most {self.max_window})"
        return "epoch" if self.window is None else f"{self.window} batches"


# --------------------------------------------------------------------------- the collective group's period


@dataclass(frozen=True)
class PeriodCadence:
    """How often the collective group exchanges and what travels: `AllReduce`'s fields of the same names, as the
    collective loop takes them (``CollectiveConfig`` and ``CollectiveJob`` carry one)."""

    period: int | str = 1
    max_period: int = MAX_PERIOD
    wire: str = "fp32"
    outer_momentum: float = 0.0

    @property
    def periodic(self) -> bool:
        """Whether the workers take local steps between averages (local SGD) rather than one global step."""
        return self.period != 1


def choose_period(step_s: float, average_s: float, max_period: int, overhead: float = OVERHEAD) -> int:
    """The smallest period whose average costs at most `overhead` of its steps' time, within [1, max_period]."""
    if not (step_s > 0 and math.isfinite(step_s)) or not math.isfinite(average_s):
        return int(max_period)
    return int(min(max_period, steps_per_exchange(average_s, step_s, overhead)))
