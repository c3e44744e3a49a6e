"""What differs between Keras backends inside a task: the one registry of their names, queued steps, reading state.

`KERAS_BACKENDS` is the one list of the Keras backends the trainer runs on,
each a `KerasBackend` that says what differs: the module of its all-reduce
group (``trainer.runtime.collective``), whether a shard is fed to
``model.fit`` as a ``tf.data`` pipeline (TensorFlow) or as numpy batches, and
how its weights are read to the host. Code that differs by backend asks
`keras_backend` (or `current_backend`), never compares names itself.

TensorFlow on a CPU runs a step before ``fit`` hands the next batch over.
JAX, and torch on CUDA, dispatch asynchronously: ``fit`` returns from a
step while the device still runs it, and the first read of the weights
waits for every step still queued (150-950 ms per exchange measured under
JAX on a CPU). An exchange clock started before that read books training
as communication; `wait_for_steps` drains the queue first, so the clock
measures the exchange alone. It reads the optimizer's iteration counter,
which the last queued step writes: a device runs its steps in order, so the
value arrives when they are done. (Keras keeps JAX's state in a
``TrackedDict`` during ``fit``, which ``jax.block_until_ready`` takes for a
single leaf and returns at once; the counter needs no such care, and the
callback's ``self.model`` has already put the state back into the variables.)

`read_weights` copies the weights to the host. Under TensorFlow each
variable's ``numpy()`` is already a plain copy. Under JAX and torch, where
the weights may live on an accelerator, the variables of each dtype are
first joined into one flat array on their device and copied to the host
once (one transfer instead of one per variable), then cut into views.
The delta itself is computed on the host by the algorithm's pure numpy function
(``trainer.algorithms``): about 1 ms per 4 MB, next to windows of 50-200 ms
on a GPU (docs/decisions.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: The backend of a task whose driver set none (Keras's own default).
DEFAULT_BACKEND = "tensorflow"


@dataclass(frozen=True)
class KerasBackend:
    """What the trainer needs to know of one Keras backend."""

    name: str
    group_module: str  # trainer.runtime.collective.<group_module>: its all-reduce group
    feeds_tf_data: bool  # the shard reaches model.fit as a tf.data pipeline (else numpy batches or a PyDataset)
    copies_per_variable: bool  # each variable's numpy() is already a host copy (else one copy per dtype, flat)
    extra: str  # the package's pip extra that installs it


KERAS_BACKENDS: dict[str, KerasBackend] = {b.name: b for b in (
    KerasBackend("tensorflow", "tensorflow_group", feeds_tf_data=True, copies_per_variable=True, extra="tf"),
    KerasBackend("jax", "jax_group", feeds_tf_data=False, copies_per_variable=False, extra="jax"),
    KerasBackend("torch", "torch_group", feeds_tf_data=False, copies_per_variable=False, extra="torch"),
)}


def keras_backend(name: str) -> KerasBackend:
    """The registered backend `name`; ValueError naming the others."""
    try:
        return KERAS_BACKENDS[name]
    except KeyError:
        raise ValueError(f"Unknown Keras backend {name!r}. Expected one of: {', '.join(KERAS_BACKENDS)}. Fix: set "
                         "KERAS_BACKEND to one of them before Keras starts.") from None


def current_backend() -> KerasBackend:
    """The registered backend Keras runs on in this process."""
    import keras  # deferred: the backend starts only when a model is needed

    return keras_backend(keras.backend.backend())


def wait_for_steps(model) -> None:
    """Return once every training step queued on `model`'s device has run (see the module docstring)."""
    import keras  # deferred: the backend starts only when a model is needed

    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and getattr(optimizer, "built", False):
        keras.ops.convert_to_numpy(optimizer.iterations)


def read_weights(model) -> list[np.ndarray]:
    """``model.get_weights()`` as numpy arrays, in one device-to-host copy per dtype where that helps."""
    import keras  # deferred: the backend starts only when a model is needed

    variables = list(model.weights)
    if current_backend().copies_per_variable or len(variables) < 2:
        return [np.asarray(w) for w in model.get_weights()]
    out: list[np.ndarray | None] = [None] * len(variables)
    groups: dict[str, list[int]] = {}
    for i, v in enumerate(variables):
        groups.setdefault(np.dtype(v.dtype).name, []).append(i)
    for indices in groups.values():
        values = [variables[i].value for i in indices]
        if len(values) == 1:
            out[indices[0]] = np.array(keras.ops.convert_to_numpy(values[0]))
            continue
        flat = np.asarray(keras.ops.convert_to_numpy(
            keras.ops.concatenate([keras.ops.reshape(v, (-1,)) for v in values])))
        if not flat.flags.writeable:  # a read-only view of a CPU buffer: the algorithms may write into the arrays
            flat = flat.copy()
        start = 0
        for i in indices:
            shape = tuple(int(d) for d in variables[i].shape)
            size = int(np.prod(shape, dtype=np.int64))
            out[i] = flat[start:start + size].reshape(shape)
            start += size
    return out  # type: ignore[return-value]
