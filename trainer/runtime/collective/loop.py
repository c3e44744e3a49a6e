"""The collective training loop: one process per worker, N processes training as ONE group.

``python -m trainer.runtime.collective.loop DIR`` runs one process of an
`AllReduce` fit (``trainer.algorithms.allreduce``). The barrier task
(``trainer.runtime.collective.collective_task``) starts it in a fresh interpreter,
because a backend's collective runtime can join a group only before the
backend starts, once per process, and a Spark Python worker is reused from
task to task (Spark's TorchDistributor starts its processes for the same
reason). `DIR` holds what the task prepared: ``job.pkl`` (a `CollectiveJob`),
the shard as ``x.npy``/``y.npy`` and the validation rows as ``vx.npy``/
``vy.npy``. The process writes its record to ``record.json`` and its errors
to ``stderr``.

One process, in order:

1. its cores, GPUs and backend (``trainer.runtime.process.configure_process``);
2. joins the group of the N processes on its Keras backend's own collective
   engine (``trainer.runtime.collective.group``: JAX's distributed runtime,
   TensorFlow's collective ops or ``torch.distributed``), with the addresses
   the tasks shared through Spark's barrier ``allGather`` (a process alone
   joins none: ``Alone``);
3. the model, built the same way in every process and given the
   local-gradients step (each process's gradients on its own rows, averaged
   in ONE all-reduce a step: plain Keras on the global batch of the
   processes' batches in process order), or, with a period other than 1,
   Keras's own step and the periodic average of the replicas
   (``trainer.runtime.collective.averaging``); its learning rate scaled for the
   global batch (`ScaledRate`); process 0 says HELLO to the driver's
   parameter server (one client) and broadcasts the center and the epoch to
   start at to the others: a retried or resumed fit goes on from task 0's
   last epoch end;
4. per epoch, one ``model.fit`` pass over the shard in the order
   `epoch_order` (the same permutation of positions in every process, so that
   a test can rebuild each global batch), in minibatches of ``batch_size``;
5. at every epoch end: the training logs (over the global batches; with
   periodic averaging, each process's own, averaged over the processes),
   validation of each process's own validation rows on a copy of the model
   outside the group, gathered and weighted by rows; process 0 commits the
   state (weights and optimizer variables) and reports the epoch's logs; the
   reply's directives (the driver's callbacks: stop, a new learning rate) are
   broadcast and every process follows them before the next epoch, as plain
   Keras runs its callbacks between epochs.

Nothing goes to the driver per step.
"""

from __future__ import annotations

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

from trainer.algorithms.cadence import PeriodCadence
from trainer.backends import DEFAULT_NAME, current
from trainer.ps.shard_client import connect_ps
from trainer.runtime.collective.averaging import periodic_averaging
from trainer.runtime.collective.group import Group, join_group
from trainer.runtime.collective.rates import ScaledRate
from trainer.runtime.cores import sharing
from trainer.runtime.feeding.feed import ShardFeed
from trainer.runtime.inference import validation_logs
from trainer.runtime.process import configure_process
from trainer.runtime.state import load_state, optimizer_of

#: Files of a job directory.
JOB_FILE, RECORD_FILE, STDERR_FILE = "job.pkl", "record.json", "stderr"


@dataclass
class CollectiveJob:
    """What one process of the collective loop needs (pickled into ``DIR/job.pkl`` by the task)."""

    model: Any  # a trainer.runtime.shipping.ModelSource or PickledSource (anything with build())
    ps_address: tuple[str, int]  # the driver's parameter server: process 0 reports there
    secret: Any = field(repr=False)  # the server's Credentials
    addresses: list[str]  # every process's "host:port" in process order; process 0's is the rendezvous
    process_id: int
    num_processes: int
    batch_size: int
    epochs: int
    attempt: int = 0
    seed: int = 0
    io_timeout: float = 600.0
    keras_backend: str = DEFAULT_NAME
    cpus: int = 1
    gpus: list[str] | None = None
    shared_gpu: bool = False  # another process of the group trains on one of these GPUs (group.shares_gpu)
    env: dict[str, str] = field(default_factory=dict)
    validation_batch_size: int = 256
    lr_factor: float = 1.0  # the compiled learning rate times this, for the global batch (the algorithm's lr_scaling)
    # period 1: the gradients all-reduced every step; else local steps, averaged
    cadence: PeriodCadence = PeriodCadence()
    parent_pid: int | None = None  # the task's process: this one ends when it is gone
    record: dict[str, Any] = field(default_factory=dict)  # the task's part of the record


def epoch_order(rows: int, seed: int, epoch: int) -> np.ndarray:
    """The order in which every process feeds the positions of its shard in `epoch`: one permutation of
    ``range(rows)`` drawn from ``numpy.random.default_rng([seed, epoch])``, the same in every process and
    every attempt."""
    return np.random.default_rng([int(seed), int(epoch)]).permutation(rows)


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


class _Shard:
    """The shard's minibatches in `epoch_order`. Under TensorFlow a ``tf.data`` pipeline gathers them from
    the shard held as tensors (``ShardFeed``: a Python dataset goes through ``from_generator``, a millisecond
    a step); under JAX and torch a ``PyDataset`` gathers each from the memory-mapped arrays (no copy of the
    shard per epoch)."""

    def __init__(self, directory: Path, batch_size: int, seed: int) -> None:
        self.x = np.load(directory / "x.npy", mmap_mode="r")
        self.y = np.load(directory / "y.npy", mmap_mode="r")
        self.batch_size, self.seed = batch_size, seed
        self._feed: ShardFeed | None = None

    @property
    def rows(self) -> int:
        return len(self.x)

    @property
    def steps(self) -> int:
        return math.ceil(self.rows / self.batch_size)

    def fit_kwargs(self, epoch: int) -> dict[str, Any]:
        """``model.fit``'s inputs for `epoch`."""
        import keras

        order = epoch_order(self.rows, self.seed, epoch)
        if current().feeds_tf_data:
            if self._feed is None:
                self._feed = ShardFeed(np.asarray(self.x), np.asarray(self.y))
            return self._feed.fit_kwargs(self.batch_size, order)
        shard, size = self, self.batch_size

        class EpochBatches(keras.utils.PyDataset):
            def __len__(self) -> int:
                return shard.steps

            def __getitem__(self, index: int):
                rows = order[index * size:(index + 1) * size]
                return np.asarray(shard.x[rows]), np.asarray(shard.y[rows])

        return {"x": EpochBatches(), "shuffle": False}


class _Validation:
    """Each process validates its own validation rows on a local copy of the model; `logs` weights them."""

    def __init__(self, directory: Path, job: CollectiveJob, group: Group,
                 fallback: tuple[np.ndarray, np.ndarray]) -> None:
        vx, vy = np.load(directory / "vx.npy"), np.load(directory / "vy.npy")
        self.rows, self.group = len(vx), group
        # A process without validation rows evaluates one training row at weight 0: every process must
        # gather the same metrics.
        self.x, self.y = (vx, vy) if self.rows else (np.asarray(fallback[0][:1]), np.asarray(fallback[1][:1]))
        self.batch_size = job.validation_batch_size
        with group.outside():
            self.model = job.model.build()

    def logs(self, model) -> tuple[dict[str, float], dict[str, float]]:
        """(this process's ``val_*`` logs with ``val_rows``, the logs over every process's rows)."""
        weights = self.group.local_state(model)[: len(model.weights)]
        with self.group.outside():
            self.model.set_weights(weights)
            own = validation_logs(self.model, self.x, self.y, self.batch_size)
        names = sorted(own)
        gathered = self.group.allgather(np.array([self.rows] + [own[k] for k in names], np.float64))
        rows = gathered[:, 0]
        total = float(rows.sum())
        combined = {k: float(np.dot(rows, gathered[:, i + 1]) / total) if total else math.nan
                    for i, k in enumerate(names)}
        return {**own, "val_rows": float(self.rows)}, {**combined, "val_rows": total}


def run(directory: Path) -> tuple[dict[str, Any], Group]:
    """One process of the collective loop (the module docstring); returns its record and its group (to leave
    once the record is written)."""
    with open(directory / JOB_FILE, "rb") as fh:
        job: CollectiveJob = pickle.load(fh)
    _watch_parent(job.parent_pid)
    record = dict(job.record)
    record["pinned_cores"] = configure_process(job.cpus, job.gpus, job.keras_backend, job.env, index=job.process_id)
    record["cores_shared"] = sharing()
    record["visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    record["shared_gpu"] = job.shared_gpu
    import keras

    keras.utils.set_random_seed(job.seed + 1000 * job.attempt)  # the same in every process: replicated state
    group = join_group(job)
    record.update(group.describe())
    periodic = job.cadence.periodic and group.num_processes > 1
    if periodic:
        group.train_alone()
    shard = _Shard(directory, job.batch_size, job.seed)
    model = job.model.build()
    optimizer_of(model)
    rate = ScaledRate(model, job.lr_factor)
    record["learning_rate_factor"] = job.lr_factor
    # One process has nothing to all-reduce: Keras's own step is the whole step.
    local = not periodic and group.num_processes > 1 and group.use_local_gradients(model)
    record["train_step"] = ("the model's own, replicas averaged periodically" if periodic
                            else "local gradients" if local else "the model's own")
    averaging = periodic_averaging(group, job.cadence, record) if periodic else None
    validation = _Validation(directory, job, group, (shard.x, shard.y)) if record.get("validation") else None
    record["model_built"] = time.time()
    client = None
    if job.process_id == 0:
        client = connect_ps([job.ps_address], job.secret, 0, job.attempt, job.io_timeout)
    try:
        start_epoch = _start(model, client, record, group)
        rate.apply()  # the center carries the user's rate
        _train(model, shard, validation, client, job, record, start_epoch, group, rate, averaging)
    finally:
        if client is not None:
            client.close()
    return record, group


def _start(model, client, record: dict, group: Group) -> int:
    """Load the center (process 0's HELLO, broadcast to all) into `model`; return the epoch to start at."""
    template = group.local_state(model)
    if client is not None:
        center, meta = client.hello()
        head = np.array([len(center), int(meta.get("start_epoch", 0))], np.int32)
    else:
        center, head = [], np.zeros(2, np.int32)
    count, start_epoch = (int(v) for v in group.broadcast([head])[0])
    arrays = list(center) if client is not None else [np.zeros_like(a) for a in template[:count]]
    arrays = group.broadcast([np.asarray(a) for a in arrays])
    load_state(model, arrays, with_optimizer=True, strict=False)
    record["start_epoch"] = start_epoch
    return start_epoch


def _train(model, shard: _Shard, validation: _Validation | None, client, job: CollectiveJob, record: dict,
           start_epoch: int, group: Group, rate: ScaledRate, averaging=None) -> None:
    gradient = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in model.trainable_variables)
    ring_share = 2.0 * (job.num_processes - 1) / job.num_processes  # of what one all-reduce sums, per process
    record.update(epochs=[], commits=0, comm_s=0.0, steps=0, bytes_sent=0, bytes_received=0,
                  ring_bytes_per_step=ring_share * gradient)
    callbacks = group.fit_callbacks() + ([averaging] if averaging is not None else [])
    train_start, cpu_start = time.time(), time.process_time()
    fit_s, collective_before = 0.0, group.collective_seconds() or 0.0
    for epoch in range(start_epoch, job.epochs):
        entry = {"epoch": epoch, "start": time.time(), "batches": shard.steps}
        record["epochs"].append(entry)
        fit_start = time.perf_counter()
        history = model.fit(**shard.fit_kwargs(epoch), epochs=epoch + 1, initial_epoch=epoch, verbose=0,
                            callbacks=callbacks)
        entry["fit_s"] = time.perf_counter() - fit_start
        fit_s += entry["fit_s"]
        if (collective := group.collective_seconds()) is not None:
            entry["collective_s"], collective_before = collective - collective_before, collective
        record["steps"] += shard.steps
        logs = {k: float(v[-1]) for k, v in history.history.items()}
        if averaging is not None:  # each process's own steps: the logs of all of them, averaged
            logs = _mean_logs(logs, group)
        reported = dict(logs, rows=float(record["padded_rows"]) * job.num_processes)
        talk = time.perf_counter()
        if validation is not None:
            own, combined = validation.logs(model)
            logs.update(own)
            reported.update(combined)
        logs["rows"] = float(record["padded_rows"])
        entry.update(end=time.time(), logs=logs)
        stop, directed = _report(model, client, epoch, record["steps"], reported, group, rate)
        record["comm_s"] += time.perf_counter() - talk
        record["commits"] += int(client is not None)
        if not math.isnan(directed):
            rate.follow(directed)  # the driver's callbacks set the user's rate: scaled as the compiled one
        if stop:
            record["stopped_at_epoch"] = epoch
            break
    train_s = time.time() - train_start
    record.update(train_s=train_s, fit_s=fit_s, end=time.time(),
                  cores_used=(time.process_time() - cpu_start) / max(train_s, 1e-9))
    if averaging is not None and record.get("averages"):  # local SGD: one average every few steps, amortized
        record["ring_bytes_per_step"] = ring_share * record["average_bytes"] * record["averages"] / max(
            record["steps"], 1)
    record["allreduce_ms"] = group.allreduce_ms(gradient // 4) if group.num_processes > 1 else None
    if client is not None:
        record.update(bytes_sent=client.bytes_sent, bytes_received=client.bytes_received)


def _mean_logs(logs: dict[str, float], group: Group) -> dict[str, float]:
    """`logs` averaged over the processes (each trained its equal share of the batches)."""
    names = sorted(logs)
    gathered = group.allgather(np.array([logs[k] for k in names], np.float64))
    return {k: float(gathered[:, i].mean()) for i, k in enumerate(names)}


def _report(model, client, epoch: int, step: int, logs: dict[str, float], group: Group,
            rate: ScaledRate) -> tuple[bool, float]:
    """Process 0 commits the state (the user's learning rate in it) and reports the epoch; every process gets
    the driver's directives: (stop, learning rate or NaN)."""
    directives = np.array([0.0, math.nan], np.float32)
    if client is not None:
        meta = {"worker": 0, "epoch": epoch, "step": step, "loss": logs.get("loss", math.nan)}
        client.commit(rate.unscaled(group.local_state(model)), meta)
        reply = client.epoch_done(epoch, logs)
        new_rate = reply.get("learning_rate")
        directives = np.array([1.0 if reply.get("stop") else 0.0, math.nan if new_rate is None else new_rate],
                              np.float32)
    stop, new_rate = (float(v) for v in group.broadcast([directives])[0])
    return stop > 0, new_rate


def main(argv: list[str] | None = None) -> int:
    directory = Path((argv if argv is not None else sys.argv[1:])[0])
    record, group = run(directory)
    tmp = directory / (RECORD_FILE + ".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, directory / RECORD_FILE)
    group.leave()
    return 0


if __name__ == "__main__":
    sys.exit(main())
