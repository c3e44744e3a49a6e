"""The collective training loop: one process per worker, N processes training as ONE Keras distribution.

``python -m trainer.runtime.collective_loop DIR`` runs one process of an
`AllReduce` fit (``trainer.algorithms.allreduce``). The barrier task
(``trainer.runtime.collective``) starts it in a fresh interpreter, because
JAX's distributed runtime can join a group only before its backend starts,
once per process, and a Spark Python worker is reused from task to task
(Spark's TorchDistributor starts its processes for the same reason). `DIR`
holds what the task prepared: ``job.pkl`` (a `CollectiveJob`), the shard as
``x.npy``/``y.npy`` and the validation rows as ``vx.npy``/``vy.npy``. The
process writes its record to ``record.json`` and its errors to ``stderr``.

One process, in order:

1. its cores, GPUs and backend (``trainer.runtime.process.configure_process``);
2. ``keras.distribution.initialize`` with the coordinator (process 0's
   host and a free port, shared by the tasks through Spark's barrier
   ``allGather``) and ``DataParallel`` over every process's devices, with
   ``auto_shard_dataset=False``: each process feeds its own rows, and Keras
   makes every step's global batch of the processes' local batches in process
   order (``jax.make_array_from_process_local_data``); the train step
   (``trainer.runtime.collective_step``) computes each process's gradients on
   its rows and averages them in one all-reduce (gloo between CPUs, NCCL
   between GPUs);
3. the model, built the same way in every process; process 0 says HELLO to
   the driver's parameter server (one client) and broadcasts the center and
   the epoch to start at to the others (``jax.experimental.multihost_utils``):
   a retried or resumed fit goes on from task 0's last epoch end;
4. per epoch, one ``model.fit`` pass over the shard in the order
   `epoch_order` (the same permutation of positions in every process, so that
   a test can rebuild each global batch), in minibatches of ``batch_size``;
5. at every epoch end: the training logs (already over the global batches),
   validation of each process's own validation rows on a copy of the model
   outside the distribution, gathered and weighted by rows; process 0 commits
   the state (weights and optimizer variables) and reports the epoch's logs;
   the reply's directives (the driver's callbacks: stop, a new learning rate)
   are broadcast and every process follows them before the next epoch, as
   plain Keras runs its callbacks between epochs.

Nothing goes to the driver per step.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import pickle
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainer.ps.shard_client import connect_ps
from trainer.runtime.inference import validation_logs
from trainer.runtime.collective_step import use_local_gradients
from trainer.runtime.process import configure_process
from trainer.runtime.state import load_state, optimizer_of

#: Files of a job directory.
JOB_FILE, RECORD_FILE, STDERR_FILE = "job.pkl", "record.json", "stderr"


@dataclass
class CollectiveJob:
    """What one process of the collective loop needs (pickled into ``DIR/job.pkl`` by the task)."""

    model: Any  # a trainer.runtime.shipping.ModelSource
    ps_address: tuple[str, int]  # the driver's parameter server: process 0 reports there
    secret: Any = field(repr=False)  # the server's Credentials
    coordinator: str  # "host:port" of process 0's JAX coordinator
    process_id: int
    num_processes: int
    batch_size: int
    epochs: int
    attempt: int = 0
    seed: int = 0
    io_timeout: float = 600.0
    keras_backend: str = "jax"
    cpus: int = 1
    gpus: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    validation_batch_size: int = 256
    parent_pid: int | None = None  # the task's process: this one ends when it is gone
    record: dict[str, Any] = field(default_factory=dict)  # the task's part of the record


def epoch_order(rows: int, seed: int, epoch: int) -> np.ndarray:
    """The order in which every process feeds the positions of its shard in `epoch`: one permutation of
    ``range(rows)`` drawn from ``numpy.random.default_rng([seed, epoch])``, the same in every process and
    every attempt."""
    return np.random.default_rng([int(seed), int(epoch)]).permutation(rows)


def local_state(model) -> list[np.ndarray]:
    """The weights then the optimizer's variables, read from this process's own replica: no collective, so
    process 0 may read them alone."""
    out = []
    for variable in list(model.weights) + list(model.optimizer.variables):
        value = variable.value
        local = value.addressable_data(0) if hasattr(value, "addressable_data") else value
        out.append(np.array(local, copy=True))
    return out


def _watch_parent(parent_pid: int | None) -> None:
    """End this process when the task that started it is gone (a killed executor, a cancelled stage): its
    peers are stopped by Spark, and a process left behind would wait in a collective forever."""
    if parent_pid is None:
        return

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(70)

    threading.Thread(target=watch, name="collective-parent-watch", daemon=True).start()


@contextlib.contextmanager
def _no_distribution():
    """Keras without a distribution inside the block (this process's local validation model)."""
    import keras

    current = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        yield
    finally:
        keras.distribution.set_distribution(current)


class _Shard:
    """The shard's minibatches in `epoch_order`, gathered from memory-mapped arrays one batch at a time."""

    def __init__(self, directory: Path, batch_size: int, seed: int) -> None:
        self.x = np.load(directory / "x.npy", mmap_mode="r")
        self.y = np.load(directory / "y.npy", mmap_mode="r")
        self.batch_size, self.seed = batch_size, seed

    @property
    def rows(self) -> int:
        return len(self.x)

    @property
    def steps(self) -> int:
        return math.ceil(self.rows / self.batch_size)

    def dataset(self, epoch: int):
        import keras

        order = epoch_order(self.rows, self.seed, epoch)
        shard, size = self, self.batch_size

        class EpochBatches(keras.utils.PyDataset):
            def __len__(self) -> int:
                return shard.steps

            def __getitem__(self, index: int):
                rows = order[index * size:(index + 1) * size]
                return np.asarray(shard.x[rows]), np.asarray(shard.y[rows])

        return EpochBatches()


class _Validation:
    """Each process validates its own validation rows on a local copy of the model; `gather` weights them."""

    def __init__(self, directory: Path, job: CollectiveJob, fallback: tuple[np.ndarray, np.ndarray]) -> None:
        vx, vy = np.load(directory / "vx.npy"), np.load(directory / "vy.npy")
        self.rows = len(vx)
        # A process without validation rows evaluates one training row at weight 0: every process must
        # gather the same metrics.
        self.x, self.y = (vx, vy) if self.rows else (np.asarray(fallback[0][:1]), np.asarray(fallback[1][:1]))
        self.batch_size = job.validation_batch_size
        with _no_distribution():
            self.model = job.model.build()

    def logs(self, model) -> tuple[dict[str, float], dict[str, float]]:
        """(this process's ``val_*`` logs with ``val_rows``, the logs over every process's rows)."""
        from jax.experimental import multihost_utils

        weights = local_state(model)[: len(model.weights)]
        with _no_distribution():
            self.model.set_weights(weights)
            own = validation_logs(self.model, self.x, self.y, self.batch_size)
        names = sorted(own)
        gathered = np.asarray(multihost_utils.process_allgather(
            np.array([self.rows] + [own[k] for k in names], np.float64)))
        rows = gathered[:, 0]
        total = float(rows.sum())
        combined = {k: float(np.dot(rows, gathered[:, i + 1]) / total) if total else math.nan
                    for i, k in enumerate(names)}
        return {**own, "val_rows": float(self.rows)}, {**combined, "val_rows": total}


def _broadcast(values):
    """Process 0's `values` (a pytree of arrays) in every process."""
    from jax.experimental import multihost_utils

    return multihost_utils.broadcast_one_to_all(values)


def run(directory: Path) -> dict[str, Any]:
    """One process of the collective loop (the module docstring); returns its record."""
    with open(directory / JOB_FILE, "rb") as fh:
        job: CollectiveJob = pickle.load(fh)
    _watch_parent(job.parent_pid)
    record = dict(job.record)
    record["pinned_cores"] = configure_process(job.cpus, job.gpus, job.keras_backend, job.env, index=job.process_id)
    record["visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    import keras

    keras.utils.set_random_seed(job.seed + 1000 * job.attempt)  # the same in every process: replicated state
    keras.distribution.initialize(job_addresses=job.coordinator, num_processes=job.num_processes,
                                  process_id=job.process_id)
    import jax

    distribution = keras.distribution.DataParallel(devices=keras.distribution.list_devices(),
                                                   auto_shard_dataset=False)
    record.update(devices=len(jax.devices()), local_devices=len(jax.local_devices()))
    keras.distribution.set_distribution(distribution)
    shard = _Shard(directory, job.batch_size, job.seed)
    model = job.model.build()
    optimizer_of(model)
    record["train_step"] = "local gradients" if use_local_gradients(model, distribution) else "the model's own"
    validation = _Validation(directory, job, (shard.x, shard.y)) if record.get("validation") else None
    record["model_built"] = time.time()
    client = None
    if job.process_id == 0:
        client = connect_ps([job.ps_address], job.secret, 0, job.attempt, job.io_timeout)
    try:
        start_epoch = _start(model, client, record)
        _train(model, shard, validation, client, job, record, start_epoch)
    finally:
        if client is not None:
            client.close()
    return record


def _start(model, client, record: dict) -> int:
    """Load the center (process 0's HELLO, broadcast to all) into `model`; return the epoch to start at."""
    template = local_state(model)
    if client is not None:
        center, meta = client.hello()
        head = np.array([len(center), int(meta.get("start_epoch", 0))], np.int32)
    else:
        center, head = [], np.zeros(2, np.int32)
    count, start_epoch = (int(v) for v in _broadcast(head))
    arrays = list(center) if client is not None else [np.zeros_like(a) for a in template[:count]]
    arrays = [np.asarray(a) for a in _broadcast(arrays)]
    load_state(model, arrays, with_optimizer=True, strict=False)
    record["start_epoch"] = start_epoch
    return start_epoch


def _committed_state():
    """A callback that commits every variable's array to its device(s) before the first step. Keras leaves
    the arrays it creates uncommitted and the state its steps return committed, so without it XLA compiles
    the train step a second time at the second epoch (measured: 10 s of the MNIST CNN's on this machine)."""
    import jax
    import keras

    class CommittedState(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            model = self.model
            for variable in list(model.variables) + list(model.optimizer.variables) + list(model.metrics_variables):
                value = variable.value
                if not getattr(value, "committed", True):
                    variable.assign(jax.device_put(value, value.sharding))

    return CommittedState()


def _train(model, shard: _Shard, validation: _Validation | None, client, job: CollectiveJob, record: dict,
           start_epoch: int) -> None:
    gradient = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in model.trainable_variables)
    record.update(epochs=[], commits=0, comm_s=0.0, steps=0, bytes_sent=0, bytes_received=0,
                  ring_bytes_per_step=2.0 * (job.num_processes - 1) / job.num_processes * gradient)
    committed = _committed_state()
    train_start, cpu_start = time.time(), time.process_time()
    for epoch in range(start_epoch, job.epochs):
        entry = {"epoch": epoch, "start": time.time(), "batches": shard.steps}
        record["epochs"].append(entry)
        history = model.fit(shard.dataset(epoch), epochs=epoch + 1, initial_epoch=epoch, shuffle=False, verbose=0,
                            callbacks=[committed])
        record["steps"] += shard.steps
        logs = {k: float(v[-1]) for k, v in history.history.items()}
        reported = dict(logs, rows=float(record["padded_rows"]) * job.num_processes)
        talk = time.perf_counter()
        if validation is not None:
            own, combined = validation.logs(model)
            logs.update(own)
            reported.update(combined)
        logs["rows"] = float(record["padded_rows"])
        entry.update(end=time.time(), logs=logs)
        stop, rate = _report(model, client, epoch, record["steps"], reported)
        record["comm_s"] += time.perf_counter() - talk
        record["commits"] += int(client is not None)
        if not math.isnan(rate) and float(model.optimizer.learning_rate) != rate:
            model.optimizer.learning_rate = rate
        if stop:
            record["stopped_at_epoch"] = epoch
            break
    train_s = time.time() - train_start
    record.update(train_s=train_s, end=time.time(), cores_used=(time.process_time() - cpu_start) / max(train_s, 1e-9))
    if client is not None:
        record.update(bytes_sent=client.bytes_sent, bytes_received=client.bytes_received)


def _report(model, client, epoch: int, step: int, logs: dict[str, float]) -> tuple[bool, float]:
    """Process 0 commits the state and reports the epoch; every process gets the driver's directives:
    (stop, learning rate or NaN)."""
    directives = np.array([0.0, math.nan], np.float32)
    if client is not None:
        meta = {"worker": 0, "epoch": epoch, "step": step, "loss": logs.get("loss", math.nan)}
        client.commit(local_state(model), meta)
        reply = client.epoch_done(epoch, logs)
        rate = reply.get("learning_rate")
        directives = np.array([1.0 if reply.get("stop") else 0.0, math.nan if rate is None else rate], np.float32)
    stop, rate = (float(v) for v in np.asarray(_broadcast(directives)))
    return stop > 0, rate


def main(argv: list[str] | None = None) -> int:
    directory = Path((argv if argv is not None else sys.argv[1:])[0])
    record = run(directory)
    tmp = directory / (RECORD_FILE + ".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, directory / RECORD_FILE)
    import jax

    jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
