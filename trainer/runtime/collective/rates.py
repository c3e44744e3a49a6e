"""The learning rate of a collective process: the compiled rate scaled for the global batch, the user's rate kept.

An all-reduce fit trains on a global batch of N local batches, so an epoch
takes 1/N of one process's steps; the algorithm's ``lr_scaling``
(``trainer.algorithms.allreduce``) scales the compiled rate by its factor for N.
`ScaledRate` does it without changing the optimizer's variables (the state
process 0 reports and checkpoints carry): a float rate is Keras's
``learning_rate`` variable, which holds the scaled value while the process
trains and the user's value in every state it reports (`unscaled`); a
schedule is wrapped in `ScaledSchedule`, which has no variables. A rate the
driver's callbacks set (ReduceLROnPlateau) is the user's too: `follow` scales
it the same way.
"""

from __future__ import annotations

import numpy as np


def scaled_schedule(schedule, factor: float):
    """`schedule` (a Keras LearningRateSchedule) with every rate multiplied by `factor`."""
    import keras

    class ScaledSchedule(keras.optimizers.schedules.LearningRateSchedule):
        def __call__(self, step):
            return schedule(step) * factor

        def get_config(self):
            return {"factor": factor, "schedule": keras.optimizers.schedules.serialize(schedule)}

    return ScaledSchedule()


class ScaledRate:
    """The optimizer of a collective process at `factor` times the rate it was compiled with."""

    def __init__(self, model, factor: float) -> None:
        import keras

        self.optimizer, self.factor = model.optimizer, float(factor)
        rate = getattr(self.optimizer, "_learning_rate", None)
        self.schedule = isinstance(rate, keras.optimizers.schedules.LearningRateSchedule)
        self.variable = rate if isinstance(rate, keras.Variable) else None  # else a schedule, or a callable kept
        self.base = None if self.variable is None else float(keras.ops.convert_to_numpy(rate))
        state = list(model.weights) + list(self.optimizer.variables)
        self.index = next((i for i, v in enumerate(state) if v is self.variable), None)
        if self.factor != 1.0 and self.schedule:
            self.optimizer._learning_rate = scaled_schedule(rate, self.factor)

    def apply(self) -> None:
        """Set the scaled rate (after the center, which carries the user's rate, was loaded)."""
        if self.variable is not None and self.factor != 1.0:
            self.variable.assign(self.base * self.factor)

    def follow(self, rate: float) -> None:
        """A rate the driver's callbacks set, in the user's terms: scaled and applied."""
        if self.variable is None:
            return  # a schedule: the driver's callbacks refuse to set one (trainer.fit.epoch_callbacks)
        self.base = float(rate)
        self.apply()

    def unscaled(self, state: list[np.ndarray]) -> list[np.ndarray]:
        """`state` (weights then optimizer variables) with the user's rate in place of the scaled one."""
        if self.index is None or self.factor == 1.0:
            return state
        out = list(state)
        out[self.index] = np.asarray(self.base, dtype=np.asarray(state[self.index]).dtype)
        return out
