"""User code and models on their way to the executors.

* `ship_by_value` makes Spark serialize the user's builder functions and custom
  classes by value, so executors need not have the user's script on their path;
* `model_to_bytes` / `load_keras_bytes` move a compiled model as ``.keras`` bytes;
* `custom_objects_for` finds every custom class and function a model's
  ``.keras`` file names (layers, activations, losses, metrics, initializers...),
  wherever the user defined them (``__main__``, a notebook, their own modules),
  so that they travel by value with the bytes;
* `ModelSource` is how a task gets its model (bytes or a builder function);
* `cached_model` keeps one deserialized model per Python worker process and model.
"""

from __future__ import annotations

import functools
import io
import json
import os
import sys
import sysconfig
import tempfile
import threading
import zipfile
from dataclasses import dataclass
from typing import Any, Callable, Iterator


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


def _named_objects(config: Any) -> Iterator[str]:
    """The keys under which Keras will look up the custom objects a ``.keras`` config names.

    A class is looked up by its registered name (``"package>Name"`` when
    registered, else its class name); a function by its name (``config``).
    Keras's own objects (``module`` starting with ``keras``) are left out.
    """
    if isinstance(config, list):
        for item in config:
            yield from _named_objects(item)
    elif isinstance(config, dict):
        if "class_name" in config and "module" in config:
            module = config.get("module") or ""
            if not module.startswith("keras"):
                if config["class_name"] == "function" and isinstance(config.get("config"), str):
                    yield config["config"]
                else:
                    yield config.get("registered_name") or config["class_name"]
        for value in config.values():
            yield from _named_objects(value)


def _live_objects(model) -> Iterator[Any]:
    """Classes and functions the live model uses: its layers' types and callable attributes, its
    loss, metrics and optimizer as compiled."""
    layers = model._flatten_layers(include_self=True, recursive=True) if hasattr(model, "_flatten_layers") else [model]
    compiled = getattr(getattr(model, "_compile_config", None), "config", None) or {}
    roots = list(layers) + [compiled.get(k) for k in ("optimizer", "loss", "metrics", "weighted_metrics")]
    for i, root in enumerate(roots):
        values = [root] + (list(vars(root).values()) if i < len(layers) else [])
        while values:
            value = values.pop()
            if isinstance(value, (list, tuple)):
                values.extend(value)
            elif isinstance(value, dict):
                values.extend(value.values())
            elif isinstance(value, type) or (callable(value) and hasattr(value, "__name__")):
                yield value
            elif value is not None and not isinstance(value, (str, int, float, bool)):
                yield type(value)


def keras_config(data: bytes) -> dict:
    """The ``config.json`` of a ``.keras`` file's bytes."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return json.loads(archive.read("config.json"))


def custom_objects_for(model, data: bytes, given: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{name: class or function}`` for every custom object that the ``.keras`` bytes `data` of
    `model` name, so that the bytes load on a machine without the user's code (executors).

    Found, in order, in `given`, Keras's registry of serializable objects,
    the live model's layers, loss, metrics and optimizer, and ``__main__``.
    Names found nowhere are left out: loading then fails with Keras's message.
    """
    import keras  # deferred: TensorFlow starts only when a model is needed

    given = dict(given or {})
    registry = keras.saving.get_custom_objects()
    live: dict[str, Any] = {}
    for obj in _live_objects(model):
        module = getattr(obj, "__module__", "") or ""
        if module.split(".")[0] in ("keras", "tensorflow", "builtins", "numpy"):
            continue
        live.setdefault(keras.saving.get_registered_name(obj), obj)
        live.setdefault(getattr(obj, "__name__", ""), obj)
    main = sys.modules.get("__main__")
    found: dict[str, Any] = {}
    for name in _named_objects(keras_config(data)):
        short = name.split(">")[-1]
        for source in (given, registry, live):
            if name in source:
                found[name] = source[name]
                break
        else:
            obj = getattr(main, short, None)
            if isinstance(obj, type) or callable(obj):
                found[name] = obj
    return {**given, **found}


@dataclass
class ModelPackage:
    """A model on its way to the executors: its ``.keras`` bytes and the custom objects they need
    (shipped by value)."""

    data: bytes
    custom_objects: dict[str, Any]


def pack_model(model, given: dict[str, Any] | None = None) -> ModelPackage:
    """`model` as ``.keras`` bytes with every custom object it needs, checked to ship by value.

    Raises TypeError before any cluster work when a custom object cannot be
    serialized (see `ship_by_value`).
    """
    data = model_to_bytes(model)
    objects = custom_objects_for(model, data, given)
    ship_by_value(*objects.values())
    return ModelPackage(data, objects)


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


@dataclass(frozen=True)
class PickledSource:
    """A `ModelSource` pickled on the driver and unpickled only where the model is built: a task that hands it
    to a training process of its own (the all-reduce loop) passes bytes along and never imports Keras or its
    backend for it (unpickling a builder imports what the builder uses: eight such Python workers held
    0.4-0.9 GB each)."""

    data: bytes

    @classmethod
    def of(cls, source: ModelSource) -> "PickledSource":
        from pyspark import cloudpickle  # a builder defined in __main__ travels by value

        return cls(cloudpickle.dumps(source))

    def build(self):
        import pickle

        return pickle.loads(self.data).build()


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
