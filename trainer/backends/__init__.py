"""The Keras backends, one module each, and the one place that switches on a backend's name.

Every module of this package but ``common`` is a backend's room
(``tensorflow.py``, ``jax.py``, ``torch.py``): a `KerasBackend` subclass that
holds everything that differs for it (its environment variables, how a shard
reaches ``model.fit``, how its weights are read, its version floor, the
module of its all-reduce group) and a ``BACKEND`` instance. The rest of the
package asks the room, never the name: `backend_for` (a name the driver
gives a task), `current` (the backend Keras runs in this process),
`configured_name` (the one it would start, without importing Keras). Adding
a backend is one module here and its group in ``trainer.runtime.collective``.

A process sets the variables of every backend (`thread_env`,
`executor_env`, `gpu_memory_env`): each library reads only its own, and
one process may load two (Keras's data utilities use TensorFlow, when it is
installed, under any backend).

Nothing here imports Keras or a backend at module level.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
from typing import Callable

from trainer.backends.common import KerasBackend

__all__ = ["KerasBackend", "BACKENDS", "NAMES", "DEFAULT_NAME", "backend_for", "current", "configured_name",
           "collective_names", "thread_env", "executor_env", "gpu_memory_env"]


def _rooms() -> dict[str, KerasBackend]:
    found = [importlib.import_module(f"{__name__}.{module.name}").BACKEND
             for module in pkgutil.iter_modules(__path__) if module.name != "common"]
    return {backend.name: backend for backend in sorted(found, key=lambda b: b.name)}


#: name -> its room's `KerasBackend`, by name.
BACKENDS: dict[str, KerasBackend] = _rooms()
NAMES: tuple[str, ...] = tuple(BACKENDS)
#: The backend Keras starts when neither KERAS_BACKEND nor its config file names one.
DEFAULT_NAME: str = next(b.name for b in BACKENDS.values() if b.keras_default)


def backend_for(name: str) -> KerasBackend:
    """The room of the backend `name`; ValueError naming the others."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"Unknown Keras backend {name!r}. Expected one of: {', '.join(NAMES)}. Fix: set "
                         "KERAS_BACKEND to one of them before Keras starts.") from None


def current() -> KerasBackend:
    """The room of the backend Keras runs on in this process."""
    import keras  # deferred: the backend starts only when a model is needed

    return backend_for(keras.backend.backend())


def configured_name() -> str:
    """The Keras backend this process's Keras starts, read as Keras reads it without importing Keras:
    ``KERAS_BACKEND``, else the ``backend`` of ``$KERAS_HOME/keras.json`` (``~/.keras/keras.json``), else
    Keras's default. The executors are given it, so they run the driver's backend."""
    if os.environ.get("KERAS_BACKEND"):
        return os.environ["KERAS_BACKEND"]
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    try:
        with open(os.path.join(home, "keras.json")) as f:
            backend = json.load(f).get("backend")
    except (OSError, ValueError, AttributeError):
        backend = None
    return backend if isinstance(backend, str) and backend else DEFAULT_NAME


def collective_names() -> tuple[str, ...]:
    """The backends with a collective path (an all-reduce group)."""
    return tuple(name for name, backend in BACKENDS.items() if backend.group_module)


def thread_env(cpus: int) -> dict[str, str]:
    """Every backend's thread-count variables for a task of `cpus` cores."""
    return _every(lambda backend: backend.thread_env(cpus))


def executor_env(cores: int) -> dict[str, str]:
    """Every backend's thread-count variables for an executor of `cores` task slots."""
    return _every(lambda backend: backend.executor_env(cores))


def gpu_memory_env() -> dict[str, str]:
    """Every backend's variables for GPU memory on demand."""
    return _every(lambda backend: backend.gpu_memory_env())


def _every(variables: Callable[[KerasBackend], dict[str, str]]) -> dict[str, str]:
    return {key: value for backend in BACKENDS.values() for key, value in variables(backend).items()}
