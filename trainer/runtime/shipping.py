"""User code and models on their way to the executors.

* `ship_by_value` makes Spark serialize the user's builder functions and custom
  classes by value, so executors need not have the user's script on their path;
* `model_to_bytes` / `load_keras_bytes` move a compiled model as ``.keras`` bytes;
* `ModelSource` is how a task gets its model (bytes or a builder function);
* `cached_model` keeps one deserialized model per Python worker process and model.
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
import tempfile
import threading
from dataclasses import dataclass
from typing import Any, Callable


def ship_by_value(*objects: Any) -> None:
    """Make Spark serialize user code (builder functions, custom layers) by value.

    cloudpickle pickles functions and classes of importable modules by
    reference, which fails on executors that do not have the user's script or
    test module on their path. Modules outside site-packages and the standard
    library are shipped whole; a ``functools.partial`` ships its function's module.

    Raises TypeError, before any cluster work, for an object that cannot be
    serialized (a closure over a lock, an open file, a live session, ...).
    """
    from pyspark import cloudpickle

    stdlib = sysconfig.get_paths()["stdlib"]
    for given in objects:
        obj = given
        while isinstance(obj, functools.partial):
            obj = obj.func
        module = sys.modules.get(getattr(obj, "__module__", None) or "")
        path = getattr(module, "__file__", None) or ""
        if module is not None and module.__name__ != "__main__" and module.__name__.split(".")[0] != "trainer" \
                and path and "-packages" not in path and not path.startswith(stdlib):
            cloudpickle.register_pickle_by_value(module)
        try:
            cloudpickle.dumps(given)
        except Exception as exc:
            raise TypeError(
                f"{given!r} cannot be sent to the executors: {type(exc).__name__}: {exc}. Define the model "
                "function (and custom objects) at module level, or make it capture only picklable values "
                "(numbers, strings, functions), and build Keras objects inside it."
            ) from exc


def load_keras_bytes(data: bytes, custom_objects=None):
    """Load a model saved with ``model.save('x.keras')`` from its bytes."""
    import keras  # deferred: TensorFlow starts only when a model is needed

    with tempfile.TemporaryDirectory(prefix="trainer-model-") as tmp:
        path = os.path.join(tmp, "model.keras")
        with open(path, "wb") as fh:
            fh.write(data)
        return keras.saving.load_model(path, custom_objects=custom_objects, compile=True)


def model_to_bytes(model) -> bytes:
    """The bytes of ``model.save('x.keras')``."""
    with tempfile.TemporaryDirectory(prefix="trainer-model-") as tmp:
        path = os.path.join(tmp, "model.keras")
        model.save(path)
        with open(path, "rb") as fh:
            return fh.read()


@dataclass
class ModelSource:
    """How a task gets its model: a saved ``.keras`` file's bytes or a builder function."""

    keras_bytes: bytes | None = None
    builder: Callable[[], Any] | None = None
    custom_objects: dict[str, Any] | None = None

    def build(self):
        if self.builder is not None:
            return self.builder()
        return load_keras_bytes(self.keras_bytes, self.custom_objects)


_MODEL_CACHE: dict[str, Any] = {}
_CACHE_LOCK = threading.Lock()


def cached_model(key: str, data: bytes, custom_objects=None):
    """One deserialized model per Python worker process and `key` (the two most recent keys are kept)."""
    with _CACHE_LOCK:
        if key not in _MODEL_CACHE:
            while len(_MODEL_CACHE) >= 2:
                _MODEL_CACHE.pop(next(iter(_MODEL_CACHE)))
            _MODEL_CACHE[key] = load_keras_bytes(data, custom_objects)
        return _MODEL_CACHE[key]
