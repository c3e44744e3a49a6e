"""The task side of model selection: one long-lived Spark barrier task per worker.

`selection_task` runs inside a Python worker of an executor. It loads its data
ONCE -- its own shard (model hopper: the Arrow batches of partition ``i``,
training and validation rows told apart by a flag column) or a full copy
(task-parallel and sequential baselines: a Spark broadcast) -- connects to the
driver's hopper server (``trainer.selection.engine.hopper``) and then loops:

1. ask for work; the driver answers with a configuration id, the epoch (and,
   for a configuration a model-based search added during the run, its point
   and build settings), and the model state (weights and optimizer variables as raw arrays), or tells
   the task that it still holds that state (``keep``), or says stop;
2. take the configuration's Keras model from the task's cache (built once per
   task with ``model_fn(params)``, never rebuilt on later visits; configurations
   that differ only in a constant learning rate share one model object, see
   `compiled_signature`), load the state, and train ONE pass over the local
   training rows (``model.fit`` with ``epochs=1``, the configuration's batch
   size, rows shuffled by a numpy permutation seeded by the driver for this
   model, epoch and shard);
3. evaluate on the local validation rows;
4. send back the new state, the training and validation metrics and the row
   counts that the driver uses to weight the per-shard metrics.

Reproducibility: rows are put in a canonical order first (`canonical_order`),
so a unit's batches depend only on its seed, never on the order Spark
delivered the rows in. Keras is seeded once per task and before each model
build; random layers (dropout) then follow each task's own stream, which a
replayed schedule reproduces. Calling ``keras.utils.set_random_seed`` per unit
is avoided on purpose: it clears TensorFlow's caches (about 0.3 s per call).

A model's state travels as the arrays of ``trainer.runtime.state.model_state``:
``model.get_weights()`` (all weights, trainable or not) then
``model.optimizer.variables`` (iteration count, learning rate, slots).

Its place: a task runs inside a Spark task, so it lives in ``trainer.runtime``
beside the fits' tasks and shares their prologue (``trainer.runtime.task_prologue``),
and ``trainer.runtime`` may not import ``trainer.selection``. What it needs of
model selection is therefore passed in by the selection driver
(``trainer.selection.selector``) through its `TaskSpec`: ``connect``, a function
``(worker, attempt, io_timeout)`` that opens the client of the hopper protocol
(``functools.partial(HopperClient, host, port, credentials)``), and ``decode``,
which turns a model-based search's point into a configuration
(``functools.partial(space.decode, search.space)``). The hopper client is not
moved here: it is one protocol with the server (its messages, its errors) and
is built on ``trainer.transport``, which ``trainer.runtime`` does not import.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol, Sequence

import numpy as np
import pyarrow as pa
from trainer.data.columns import VALIDATION_FLAG
from trainer.backends import DEFAULT_NAME
from trainer.runtime.feeding.arrow import split_shard
from trainer.runtime.feeding.feed import ShardFeed
from trainer.runtime.inference import validation_logs
from trainer.runtime.process import holding_cores
from trainer.runtime.stage_result import result_batch
from trainer.runtime.state import load_state, model_state, optimizer_of
from trainer.runtime.task_prologue import fresh_keras, start_barrier_task

__all__ = ["ConfigBuild", "HopperConnection", "TaskSpec", "ModelCache", "compiled_signature", "canonical_order",
           "selection_task", "SPLIT_COL"]

#: The boolean column that marks validation rows in the model-hopper frame (shared with the trainer).
SPLIT_COL = VALIDATION_FLAG


@dataclass(frozen=True)
class ConfigBuild:
    """What a task needs to build one configuration's model."""

    params: dict[str, Any]
    batch_size: int
    input_shape: tuple[int, ...]
    build_seed: int


class HopperConnection(Protocol):
    """What a task asks of its connection to the driver (``trainer.selection.engine.hopper.HopperClient``)."""

    bytes_sent: int
    bytes_received: int

    def __enter__(self) -> HopperConnection: ...

    def __exit__(self, *exc: Any) -> Any: ...

    def hello(self, meta: dict[str, Any]) -> dict[str, Any]: ...

    def next_work(self) -> tuple[dict[str, Any], list[np.ndarray]]: ...

    def send_result(self, meta: dict[str, Any], arrays: Sequence[np.ndarray]) -> dict[str, Any]: ...


@dataclass
class TaskSpec:
    """Everything a selection task needs; travels in the Spark task closure."""

    model_fn: Callable[[dict[str, Any]], Any]
    configs: dict[str, ConfigBuild]
    # (worker, attempt, io_timeout) -> the connection to the driver's hopper server; it holds the server's
    # Credentials (secret, frame MAC, TLS fingerprint): never shown
    connect: Callable[[int, int, float], HopperConnection] = field(repr=False)
    attempt: int
    feature_size: int
    label_size: int | None
    full_copy: Any = None  # a Broadcast of (x, y, x_val, y_val) for the baselines, else None
    task_seed: int = 0
    eval_batch_size: int = 256
    io_timeout: float = 600.0
    keras_backend: str = DEFAULT_NAME
    env: dict[str, str] = field(default_factory=dict)
    # a model-based search's point -> the configuration's params, for configurations it adds during the run
    decode: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    # an elastic search's: its id (a process keeps its models per search) and the job (round) of this task
    search_id: str = ""
    round: int = 0


# ----------------------------------------------------------------------------- models
def compiled_signature(model) -> str | None:
    """What a model's traced training step depends on, beyond its state: the architecture
    (layer names left out), loss, metrics and the optimizer's settings except a constant
    learning rate, which lives in an optimizer variable and so travels with the state.

    Two configurations with the same signature can train on ONE Keras model object, each
    loading its own state first: the task traces the step once instead of once per
    configuration. None (never shared) when the model cannot describe itself.
    """
    try:
        architecture = _without_layer_names(model.get_config())
        compiled = model.get_compile_config()
    except Exception:  # custom layers without get_config, ...
        return None
    if not isinstance(compiled, dict) or not isinstance(compiled.get("optimizer"), dict):
        return None
    optimizer = dict(compiled["optimizer"])
    settings = dict(optimizer.get("config") or {})
    if isinstance(settings.get("learning_rate"), (int, float)):
        settings.pop("learning_rate")  # a variable: part of the state (schedules stay in the signature)
    settings.pop("name", None)
    optimizer["config"] = settings
    try:
        return json.dumps({"model": architecture, "compile": {**compiled, "optimizer": optimizer}}, sort_keys=True)
    except (TypeError, ValueError):
        return None


def _without_layer_names(config: Any) -> Any:
    """`config` with the auto-generated names of models and layers removed (dtype policies keep theirs)."""
    if isinstance(config, list):
        return [_without_layer_names(c) for c in config]
    if not isinstance(config, dict):
        return config
    out = {k: _without_layer_names(v) for k, v in config.items()}
    inner = out.get("config")
    if isinstance(inner, dict) and not str(out.get("class_name", "")).endswith("DTypePolicy"):
        inner.pop("name", None)
    if "layers" in out:  # a model's own config
        out.pop("name", None)
    return out


class ModelCache:
    """A task's Keras models by configuration, one model object per compiled signature.

    `load(cid, arrays)` puts configuration `cid`'s state into its model object; with
    ``arrays=None`` (the driver's ``keep``: the task holds the newest state) the state
    is the one this task produced last, restored from a local copy if another
    configuration used the shared object in between.
    """

    def __init__(self) -> None:
        self.models: dict[str, Any] = {}
        self._by_signature: dict[str, Any] = {}
        self._holder: dict[int, str] = {}  # id(model object) -> configuration whose state it holds
        self._users: dict[int, int] = {}  # id(model object) -> configurations using it
        self._saved: dict[str, list[np.ndarray]] = {}  # states of configurations on shared objects
        self.shared = 0

    def add(self, cid: str, model) -> Any:
        signature = compiled_signature(model)
        if signature is not None:
            model = self._by_signature.setdefault(signature, model)
        self.models[cid] = model
        self._users[id(model)] = self._users.get(id(model), 0) + 1
        self.shared += self._users[id(model)] > 1
        return model

    def load(self, cid: str, arrays: list[np.ndarray] | None) -> Any:
        model = self.models[cid]
        holder = self._holder.get(id(model))
        if holder not in (None, cid) and holder not in self._saved:
            self._saved[holder] = model_state(model)  # it may come back with `keep`
        if arrays is not None:
            load_state(model, arrays, what=f"config {cid}")
        elif holder != cid:
            load_state(model, self._saved[cid], what=f"config {cid}")
        self._holder[id(model)] = cid
        self._saved.pop(cid, None)
        return model

    def trained(self, cid: str, state: list[np.ndarray]) -> None:
        """Remember `cid`'s new state when its model object is shared."""
        if self._users[id(self.models[cid])] > 1:
            self._saved[cid] = state


# ------------------------------------------------------------------------------ data
def canonical_order(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows sorted by a 64-bit hash of their bytes (features, then label).

    Spark delivers a shard's rows in an order that may change between runs
    (shuffle reads, cache materialization) even when the shard holds the same
    rows. Training shuffles with a seed, so the order must not depend on
    Spark: with this, the same seed gives the same batches.
    """
    n = len(x)
    if n < 2:
        return x, y
    weights = np.random.default_rng(0x5EED).integers(1, 2**63, size=1 << 16, dtype=np.uint64) | np.uint64(1)
    keys = np.zeros(n, np.uint64)
    for part in (x, y):
        words = np.ascontiguousarray(part, dtype=np.float32).reshape(n, -1).view(np.uint32)
        w = np.resize(weights, words.shape[1])
        for start in range(0, n, 4096):  # chunks bound the temporary uint64 copy
            block = words[start:start + 4096].astype(np.uint64)
            keys[start:start + 4096] = keys[start:start + 4096] * np.uint64(1099511628211) + (block * w).sum(axis=1)
    order = np.argsort(keys, kind="stable")
    return x[order], y[order]


def _checksum(*arrays: np.ndarray) -> str:
    """Adler-32 of the arrays' bytes, in order: tells whether two runs saw the same rows in the same order."""
    value = 1
    for a in arrays:
        value = zlib.adler32(np.ascontiguousarray(a).view(np.uint8).reshape(-1), value)
    return f"{value:08x}"


def _logs(values: dict[str, Any], prefix: str = "") -> dict[str, float]:
    out = {}
    for k, v in values.items():
        v = v[-1] if isinstance(v, list) else v
        out[prefix + k] = float(np.asarray(v))
    return out


# ------------------------------------------------------------------------------ task
def selection_task(spec: TaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """One barrier task (the function given to ``mapInArrow(barrier=True)``); its cores are given back at its end."""
    return holding_cores(_selection_task(spec, batches))


def _selection_task(spec: TaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    start = start_barrier_task(spec.keras_backend, spec.env)
    worker = start.index
    data = load_shard(spec, batches)
    keras = fresh_keras(spec.task_seed + worker)  # random layers (dropout) draw from here
    record = unit_totals({"worker": worker, "attempt": spec.attempt, "task_start": start.time,
                          "executor_pid": os.getpid(), **data.info, **start.devices})
    with spec.connect(worker, spec.attempt, spec.io_timeout) as client:
        client.hello({"attempt": spec.attempt, "rows": data.info["rows"], "val_rows": data.info["val_rows"],
                      "data_bytes": data.info["data_bytes"], "pid": os.getpid()})
        serve_units(client, spec, keras, ModelCache(), {}, data, record)
        record.update(end=time.time(), bytes_sent=client.bytes_sent, bytes_received=client.bytes_received)
    yield result_batch(worker, record)


@dataclass
class ShardData:
    """A task's shard as flat arrays in canonical order, and what its record says of it."""

    x: np.ndarray
    y: np.ndarray
    xv: np.ndarray
    yv: np.ndarray
    info: dict[str, Any]


def load_shard(spec: TaskSpec, batches: Iterator[pa.RecordBatch]) -> ShardData:
    """The task's training and validation rows (the baselines: the broadcast full copy)."""
    if spec.full_copy is None:
        (x, y), (xv, yv) = split_shard(batches, (spec.feature_size,), spec.label_size)
        (x, y), (xv, yv) = canonical_order(x, y), canonical_order(xv, yv)
    else:
        for _ in batches:  # the baselines read their full copy (already in canonical order) from the broadcast
            pass
        x, y, xv, yv = spec.full_copy.value
    data_bytes = int(sum(a.nbytes for a in (x, y, xv, yv) if a is not None))
    return ShardData(x, y, xv, yv, {"rows": len(x), "val_rows": len(xv), "data_bytes": data_bytes,
                                    "data_checksum": _checksum(x, y, xv, yv), "data_ready": time.time()})


def unit_totals(record: dict[str, Any]) -> dict[str, Any]:
    """`record` with the counters `serve_units` adds to."""
    return {**record, "builds": {}, "units": 0, "train_s": 0.0, "val_s": 0.0}


def serve_units(client: HopperConnection, spec: TaskSpec, keras, cache: ModelCache, late: dict[str, ConfigBuild],
                data: ShardData, record: dict[str, Any]) -> None:
    """Train what the driver hands out on this shard until it says stop; `cache` and `late` (the configurations a
    model-based search added) may outlive the task (an elastic search keeps them per process)."""
    x, y, xv, yv = data.x, data.y, data.xv, data.yv
    feeds: dict[tuple[int, ...], ShardFeed] = {}
    while True:
        work, arrays = client.next_work()
        if work.get("op") != "train":
            break
        cid = work["model"]
        cfg = spec.configs.get(cid) or late.get(cid)
        if cfg is None:  # added by a model-based search during the run: the driver sent how to build it
            payload = work["config"]
            cfg = late[cid] = ConfigBuild(spec.decode(payload["point"]), int(payload["batch_size"]),
                                         tuple(payload["input_shape"]), int(payload["build_seed"]))
        if cid not in cache.models:
            started = time.time()
            keras.utils.set_random_seed(cfg.build_seed)
            built = spec.model_fn(dict(cfg.params))
            optimizer_of(built)
            cache.add(cid, built)
            record["builds"][cid] = time.time() - started
        model = cache.load(cid, None if work.get("keep") else list(arrays))
        del arrays  # the frame buffer can go
        # Shuffle with numpy: keras.utils.set_random_seed here would clear TensorFlow's caches every unit.
        order = np.random.default_rng(int(work["seed"])).permutation(len(x))
        started = time.time()
        shape = tuple(cfg.input_shape)
        if shape not in feeds:  # the shard as tensors once per input shape
            feeds[shape] = ShardFeed(x.reshape((len(x), *shape)), y)
        history = model.fit(**feeds[shape].fit_kwargs(cfg.batch_size, order), epochs=1, verbose=0)
        train_s = time.time() - started
        val_logs: dict[str, float] = {}
        if len(xv):
            val_logs = validation_logs(model, xv.reshape((len(xv), *cfg.input_shape)), yv,
                                       max(spec.eval_batch_size, cfg.batch_size))
        val_s = time.time() - started - train_s
        record["units"] += 1
        record["train_s"] += train_s
        record["val_s"] += val_s
        state = model_state(model)
        cache.trained(cid, state)
        client.send_result(
            {"model": cid, "epoch": work["epoch"], "seq": work["seq"], "train": _logs(history.history),
             "val": val_logs, "rows": len(x), "val_rows": len(xv), "train_s": train_s, "val_s": val_s,
             "steps": -(-len(x) // cfg.batch_size)},
            state,
        )
    record["shared_models"] = cache.shared
