"""Learning rates for N data-parallel workers: scale the rate with N, warm up, then decay.

Why scale. With a fixed budget of epochs, N workers that share each epoch
take 1/N of the optimizer steps one worker takes, and an algorithm that
averages their progress (synchronous averaging, or DynSGD, which divides a
commit by its staleness + 1, about N) moves the center like ONE worker taking
those few steps on an N-times larger batch. Large-batch practice raises the
rate to match: linearly for SGD (Goyal et al., 2017), by the square root of
the batch ratio for Adam-like optimizers (Malladi et al., 2022). Linear is the
default here: on the forecasting LSTM and GRU (Adam, 4 epochs) it recovered
more of the one-worker MAPE than the square root did, see
``jobs/forecast.py``. A raised rate
from the first step makes stale, early commits overshoot, hence a linear
warm-up from the one-worker rate (Goyal et al.). The cosine decay that follows
ends every run on small steps, so the final weights, the ones evaluated, sit
still instead of wandering at a constant rate.

``decay_floor`` keeps the rate above 0 after the planned steps: under shared
epochs a fast worker can take more steps than its share, and those steps
should still count.
"""

from __future__ import annotations

import math
from typing import Callable

SCALING: dict[str, Callable[[int], float]] = {
    "none": lambda workers: 1.0,
    "sqrt": lambda workers: math.sqrt(workers),
    "linear": lambda workers: float(workers),
}


def scaled_rate(base: float, workers: int, scaling: str = "linear") -> float:
    """The peak learning rate for `workers` workers: `base` (the one-worker rate) times SCALING[scaling](workers)."""
    if scaling not in SCALING:
        raise ValueError(f"learning-rate scaling must be one of {', '.join(SCALING)}; received {scaling!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer; received {workers!r}")
    if not 0 < base < math.inf:
        raise ValueError(f"the base learning rate must be a positive number; received {base!r}")
    return base * SCALING[scaling](workers)


def warmup_cosine(base: float, workers: int, steps: int, *, scaling: str = "linear", warmup: float = 0.1,
                  decay_floor: float = 0.1):
    """A Keras schedule for one worker's optimizer over its `steps` planned steps.

    Linear warm-up from `base` to ``scaled_rate(base, workers, scaling)`` over the
    first `warmup` fraction of the steps, then cosine decay to `decay_floor` times
    that peak at `steps`, where it stays.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer; received {steps!r}")
    if not 0 <= warmup < 1:
        raise ValueError(f"warmup must be a fraction in [0, 1); received {warmup!r}")
    if not 0 <= decay_floor <= 1:
        raise ValueError(f"decay_floor must be a fraction in [0, 1]; received {decay_floor!r}")
    import keras  # deferred: TensorFlow starts only when a model is needed

    peak = scaled_rate(base, workers, scaling)
    warmup_steps = int(round(warmup * steps))
    return keras.optimizers.schedules.CosineDecay(
        base, decay_steps=max(1, steps - warmup_steps), alpha=decay_floor,
        warmup_target=peak, warmup_steps=warmup_steps,
    )


def planned_steps(rows: int, workers: int, batch_size: int, epochs: int = 1) -> int:
    """Optimizer steps ONE of `workers` workers plans over `epochs` on `rows` rows: every
    shard is padded to ``ceil(rows / workers)`` rows and split into minibatches of `batch_size`."""
    return epochs * math.ceil(math.ceil(rows / workers) / batch_size)


def worker_learning_rate(base: float, workers: int, *, scaling: str = "linear", steps: int | None = None):
    """What to give one worker's optimizer: the constant ``scaled_rate`` when `steps` is None,
    else ``warmup_cosine`` over those steps."""
    if steps is None:
        return scaled_rate(base, workers, scaling)
    return warmup_cosine(base, workers, steps, scaling=scaling)
