"""A compiled Keras model's state as a list of numpy arrays: the weights, then the optimizer's variables.

``model.get_weights()`` (all weights, trainable or not) is followed, when asked
for, by ``model.optimizer.variables`` (iteration count, learning rate, moment
slots). The parameter server exchanges the weights (and the optimizer state
for algorithms that average it); the model hopper moves the whole state.
"""

from __future__ import annotations

import numpy as np

from trainer.backends import current


def optimizer_of(model):
    """The model's optimizer, built for its trainable variables; a clear error for an uncompiled model."""
    opt = getattr(model, "optimizer", None)
    if opt is None:
        raise ValueError(
            "The model is not compiled (it has no optimizer). "
            "Fix: call model.compile(optimizer=..., loss=..., metrics=[...]) where the model is built."
        )
    if not opt.built:
        opt.build(model.trainable_variables)
    return opt


def model_state(model, with_optimizer: bool = True) -> list[np.ndarray]:
    """The weights followed (with `with_optimizer`) by the optimizer variables, as numpy arrays."""
    import keras  # deferred: TensorFlow starts only when a model is needed

    weights = current().read_weights(model)
    if with_optimizer:
        weights += [np.asarray(keras.ops.convert_to_numpy(v)) for v in optimizer_of(model).variables]
    return weights


def state_layout(model) -> list[tuple[str, tuple[int, ...]]]:
    """``(dtype name, shape)`` of every array of ``model_state(model)``, without copying."""
    variables = list(model.weights) + list(optimizer_of(model).variables)
    return [(np.dtype(v.dtype).name, tuple(int(d) for d in v.shape)) for v in variables]


def load_state(model, arrays: list[np.ndarray], *, with_optimizer: bool = True, strict: bool = True,
               what: str = "the model") -> None:
    """Load `model_state` arrays into `model`: the weights, then (with `with_optimizer`) the optimizer's.

    With ``strict=False`` the optimizer part may be missing (a center that holds
    only the weights so far); when present its size must always match.
    """
    n_weights = len(model.weights)
    model.set_weights(arrays[:n_weights])
    if not with_optimizer or (not strict and len(arrays) == n_weights):
        return
    variables = optimizer_of(model).variables  # built before a retried or resumed worker's first step
    if len(arrays) != n_weights + len(variables):
        raise ValueError(
            f"The state of {what} has {len(arrays)} arrays but the model built here has {n_weights} weights and "
            f"{len(variables)} optimizer variables. Fix: build the same model (and optimizer) for the same "
            "settings on every machine (no randomness in the architecture)."
        )
    for var, value in zip(variables, arrays[n_weights:]):
        var.assign(value)
