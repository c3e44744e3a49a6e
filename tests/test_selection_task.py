"""The task side of model selection without Spark: compiled signatures and the shared-model cache."""

from __future__ import annotations

import keras
import numpy as np

from trainer.runtime.state import model_state
from trainer.runtime.search_worker.search_task import ModelCache, compiled_signature


def build(units: int = 8, lr: float = 0.01, optimizer: str = "adam", dropout: float = 0.0, loss: str = "mse"):
    layers = [keras.Input((4,)), keras.layers.Dense(units, activation="relu")]
    if dropout:
        layers.append(keras.layers.Dropout(dropout))
    model = keras.Sequential([*layers, keras.layers.Dense(1)])
    opt = keras.optimizers.Adam(lr) if optimizer == "adam" else keras.optimizers.SGD(lr)
    model.compile(optimizer=opt, loss=loss, metrics=["mae"])
    model.optimizer.build(model.trainable_variables)
    return model


def test_signature_ignores_layer_names_and_a_constant_learning_rate():
    base = compiled_signature(build())
    assert base is not None
    assert compiled_signature(build(lr=0.001)) == base  # other auto-generated layer names, other lr
    for other in (build(units=16), build(optimizer="sgd"), build(dropout=0.5), build(loss="mae")):
        assert compiled_signature(other) != base
    schedule = keras.optimizers.schedules.ExponentialDecay(0.01, 100, 0.9)
    scheduled = build()
    scheduled.compile(optimizer=keras.optimizers.Adam(schedule), loss="mse", metrics=["mae"])
    assert compiled_signature(scheduled) != base  # a schedule is traced into the step


def _state(model, value: float) -> list[np.ndarray]:
    return [np.full_like(a, value) for a in model_state(model)]


def test_cache_shares_one_model_and_keeps_each_configurations_state():
    cache = ModelCache()
    a = cache.add("a", build(lr=0.01))
    b = cache.add("b", build(lr=0.001))
    c = cache.add("c", build(units=16))
    assert a is b and c is not a and cache.shared == 1
    loaded = cache.load("a", _state(a, 1.0))
    cache.trained("a", _state(a, 2.0))  # what training produced (saved: the object is shared)
    cache.load("b", _state(b, 5.0))
    assert float(np.asarray(model_state(loaded)[0]).flat[0]) == 5.0
    cache.load("a", None)  # `keep`: the task's own newest state of "a" comes back
    assert all(np.all(np.asarray(x) == 2.0) for x in model_state(loaded))
    cache.load("c", _state(c, 7.0))
    cache.load("c", None)  # not shared: the object still holds it
    assert all(np.all(np.asarray(x) == 7.0) for x in model_state(c))
