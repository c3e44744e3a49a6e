"""What every Keras backend's room declares, and what the backends share: `KerasBackend`.

A backend's module (``trainer.backends.<name>``) subclasses `KerasBackend`
with the same class shape, Keras's habit (``keras/src/backend/<name>/``):
its name and pip extra, whether Keras starts it when nothing names one, the
module of its all-reduce group, how a shard reaches ``model.fit``, the
environment variables it reads, the oldest version supported, and how its
weights are read to the host. The base class holds what two or more share;
what a backend lacks keeps its signature and fails loudly.

Waiting for queued steps: TensorFlow on a CPU runs a step before ``fit``
hands the next batch over. JAX, and torch on CUDA, dispatch asynchronously:
``fit`` returns from a step while the device still runs it, and the first
read of the weights waits for every step still queued (150-950 ms per
exchange measured under JAX on a CPU). An exchange clock started before that
read books training as communication; `KerasBackend.wait_for_steps` drains
the queue first, so the clock measures the exchange alone. It reads the
optimizer's iteration counter, which the last queued step writes: a device
runs its steps in order, so the value arrives when they are done. (Keras
keeps JAX's state in a ``TrackedDict`` during ``fit``, which
``jax.block_until_ready`` takes for a single leaf and returns at once; the
counter needs no such care, and the callback's ``self.model`` has already
put the state back into the variables.)

Reading the weights: under JAX and torch, where the weights may live on an
accelerator, `KerasBackend.read_weights` joins the variables of each dtype
into one flat array on their device and copies it to the host once (one
transfer instead of one per variable), then cuts it into views. TensorFlow's
variables are already plain host copies one by one (its room says so). The
delta itself is computed on the host by the algorithm's pure numpy function
(``trainer.algorithms``): about 1 ms per 4 MB, next to windows of 50-200 ms
on a GPU (docs/decisions.md).
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Iterator

import numpy as np


class KerasBackend:
    """What the trainer needs to know of one Keras backend; one subclass per backend, one instance each."""

    #: The name Keras gives it (``KERAS_BACKEND``).
    name: ClassVar[str]
    #: The package's pip extra that installs it.
    extra: ClassVar[str]
    #: Keras starts it when neither ``KERAS_BACKEND`` nor ``keras.json`` names one (exactly one backend says so).
    keras_default: ClassVar[bool] = False
    #: The module whose ``BackendGroup`` joins its processes in one all-reduce group; None: no collective path.
    group_module: ClassVar[str | None] = None
    #: The shard reaches ``model.fit`` as a ``tf.data`` pipeline (`host_tensors`, `index_dataset`,
    #: `stack_dataset`); else as numpy batches or a ``keras.utils.PyDataset``.
    feeds_tf_data: ClassVar[bool] = False
    #: (oldest version, what needs it), checked when ``trainer`` is imported (``trainer.versions``); None: unchecked.
    floor: ClassVar[tuple[str, str] | None] = None
    #: The pip distributions that provide its module, the first being the one ``pyproject.toml`` names.
    distributions: ClassVar[tuple[str, ...]]
    #: Processes that share a GPU can all-reduce every step (the group reduces on their CPUs); False where the
    #: engine's collectives between GPUs take one process per GPU.
    steps_on_a_shared_gpu: ClassVar[bool] = True

    def thread_env(self, cpus: int) -> dict[str, str]:
        """The thread-count variables a task of `cpus` cores sets for this backend's native pools."""
        return {}

    def executor_env(self, cores: int) -> dict[str, str]:
        """The thread-count variables every executor of `cores` task slots gets for this backend's pools."""
        return {}

    def gpu_memory_env(self) -> dict[str, str]:
        """The variables that make this backend take GPU memory only as it needs it (see ``trainer.process_env``)."""
        return {}

    def wait_for_steps(self, model) -> None:
        """Return once every training step queued on `model`'s device has run (see the module docstring)."""
        import keras  # deferred: the backend starts only when a model is needed

        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None and getattr(optimizer, "built", False):
            keras.ops.convert_to_numpy(optimizer.iterations)

    def read_weights(self, model) -> list[np.ndarray]:
        """``model.get_weights()`` as numpy arrays, in one device-to-host copy per dtype (the module docstring)."""
        import keras  # deferred: the backend starts only when a model is needed

        variables = list(model.weights)
        if len(variables) < 2:
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

    def host_tensors(self, x: np.ndarray, y: np.ndarray) -> Any:
        """The shard `x`, `y` held once on the host for `index_dataset` (``feeds_tf_data`` backends)."""
        raise NotImplementedError(self._numpy_fed("host_tensors"))

    def index_dataset(self, tensors: Any, rows: int, batch_size: int, order: np.ndarray | None,
                      seed: int | None) -> Any:
        """A dataset of minibatches gathered by index from `tensors` (`host_tensors`): a fresh shuffle of the
        `rows` each pass (seeded `seed`), or the rows in `order` (``feeds_tf_data`` backends)."""
        raise NotImplementedError(self._numpy_fed("index_dataset"))

    def stack_dataset(self, stacks: Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]],
                      input_shape: tuple[int, ...], label_size: int | None, batches: int) -> Any:
        """A dataset of the minibatches of the stacks `stacks()` yields (each a (minibatches, batch, ...) pair),
        `batches` of them a pass (``feeds_tf_data`` backends)."""
        raise NotImplementedError(self._numpy_fed("stack_dataset"))

    def _numpy_fed(self, method: str) -> str:
        return (f"{method} builds a tf.data pipeline; the {self.name} backend is fed numpy batches "
                f"(feeds_tf_data is False). Fix: ask `feeds_tf_data` before calling it.")
