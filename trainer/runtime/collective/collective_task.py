"""The barrier task of an `AllReduce` fit: prepare the shard, form the group, run one collective process.

`train_collective_partition` is the function given to
``mapInArrow(barrier=True)`` when the algorithm is collective
(``trainer.algorithms.allreduce``); the parameter-server algorithms run
``trainer.runtime.ps_worker.worker_task`` instead. One task:

1. receives its shard (in memory or spilled, ``trainer.runtime.feeding.shard``) and
   its validation rows;
2. shares with the other tasks, in ONE ``BarrierTaskContext.allGather``, its
   rows, the identities of its GPUs (tasks that share one keep their
   collectives on the host: ``trainer.runtime.collective.group``) and a free
   port of its host: each task's host (``getTaskInfos()``, in partition
   order) and port make the group's addresses, task 0's the rendezvous (JAX's
   coordinator, torch's TCPStore, as Spark's TorchDistributor forms a torch
   group), every one of them a gRPC server under TensorFlow;
3. pads its shard with repeats of its own random rows to the largest
   shard's size (`equal_rows`), so that every process has the same batches:
   the shards Spark's round-robin repartition deals differ by a few rows at
   most, and `equal_rows` refuses shards too uneven for that;
4. writes the shard to ``x.npy``/``y.npy`` in a directory under the executor's
   local directory and starts ``python -m trainer.runtime.collective.loop``
   there, in a fresh interpreter (a backend's collective runtime joins a group
   only before the backend starts, once per process; a Spark Python worker is
   reused from task to task), with the task's cores and GPUs; the process
   ends on its own when this task is gone (a killed executor);
5. waits for it and yields its record, or fails with the process's own
   error (the tail of its stderr).

Neither pyspark nor a Keras backend is imported at module level.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa

from trainer.algorithms.allreduce import LR_SCALING
from trainer.algorithms.cadence import PeriodCadence
from trainer.runtime.collective.group import gpu_identities, shares_gpu
from trainer.runtime.collective.loop import JOB_FILE, RECORD_FILE, STDERR_FILE, CollectiveJob
from trainer.runtime.process import task_resources
from trainer.runtime.shipping import ModelSource, PickledSource
from trainer.runtime.feeding.spill import spill_directory
from trainer.runtime.stage_result import result_batch
from trainer.runtime.task_config import TaskConfig
from trainer.runtime.task_prologue import receive_rows

#: A shard may be padded by at most this fraction of its rows (plus one batch) to match the largest one.
MAX_PADDING = 0.10


@dataclass(kw_only=True)
class CollectiveConfig(TaskConfig):
    """Everything a collective task needs (`TaskConfig` and the server's one port, the rate's scaling)."""

    model: ModelSource | PickledSource  # PickledSource from a fit: its task never unpickles the builder
    ps_port: int
    lr_scaling: str = "linear"  # the algorithm's: the compiled rate times LR_SCALING[lr_scaling](workers)
    # the algorithm's: period 1 all-reduces every step's gradients, else averages
    cadence: PeriodCadence = PeriodCadence()


class CollectiveProcessError(RuntimeError):
    """The collective training process of a task failed; the message carries its own error."""


def equal_rows(sizes: list[int], batch_size: int) -> int:
    """The rows every process trains on per epoch: the largest shard's; raises ValueError when a shard is
    empty or would be padded by more than `MAX_PADDING` of its rows plus one batch."""
    smallest, largest = min(sizes), max(sizes)
    if smallest == 0 or largest - smallest > MAX_PADDING * smallest + batch_size:
        raise ValueError(
            f"The workers' shards have {sizes} rows: too uneven for equal global batches (all-reduce needs every "
            f"worker to train on as many rows per epoch; padding a shard adds at most {MAX_PADDING:.0%} of its rows "
            "plus one batch of its own rows again). Fix: more rows, fewer workers, or a DataFrame whose rows Spark "
            "can deal evenly (the trainer repartitions it round-robin)."
        )
    return largest


def reserve_port() -> socket.socket:
    """A free port of this host, held until the socket is closed: bound with ``SO_REUSEADDR`` and never
    listening, so that the engine's own listener (gloo's TCPStore, gRPC: both set ``SO_REUSEADDR``) can bind
    it, while no other bind, and no outgoing connection's ephemeral port, takes it in the seconds before
    (a port merely found free was once taken meanwhile: EADDRINUSE)."""
    held = socket.socket()
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    held.bind(("", 0))
    return held


def write_arrays(directory: Path, shard, validation: tuple[np.ndarray, np.ndarray]) -> None:
    """The (padded) shard as ``x.npy``/``y.npy`` (a spilled one a block at a time), the validation rows as
    ``vx.npy``/``vy.npy``."""
    if shard.kind == "memory":
        np.save(directory / "x.npy", shard.x)
        np.save(directory / "y.npy", shard.y)
    else:
        spill = shard.spill
        first_x, first_y = spill.read_block(0)
        x = np.lib.format.open_memmap(directory / "x.npy", "w+", first_x.dtype, (spill.rows, *first_x.shape[1:]))
        y = np.lib.format.open_memmap(directory / "y.npy", "w+", first_y.dtype, (spill.rows, *first_y.shape[1:]))
        for index, block in enumerate(spill.blocks):
            bx, by = spill.read_block(index)
            x[block.first_row:block.first_row + len(bx)], y[block.first_row:block.first_row + len(by)] = bx, by
        x.flush(), y.flush()
        del x, y
    np.save(directory / "vx.npy", validation[0])
    np.save(directory / "vy.npy", validation[1])


def start_process(directory: Path, job: CollectiveJob) -> subprocess.Popen:
    """Write `job` into `directory` and start its collective process there (stderr to ``DIR/stderr``)."""
    try:
        from pyspark import cloudpickle  # the model builder may be a function shipped by value
    except ImportError:  # the loop without Spark (make bench-gpu): a builder by reference
        import pickle as cloudpickle

    with open(directory / JOB_FILE, "wb") as fh:
        cloudpickle.dump(job, fh)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    with open(directory / STDERR_FILE, "wb") as err:
        return subprocess.Popen([sys.executable, "-m", "trainer.runtime.collective.loop", str(directory)],
                                stdin=subprocess.DEVNULL, stdout=err, stderr=subprocess.STDOUT, env=env,
                                cwd=directory)


def wait_process(process: subprocess.Popen, directory: Path, worker: int) -> dict:
    """The record of a finished process, or CollectiveProcessError with the tail of its output."""
    code = process.wait()
    record_path = directory / RECORD_FILE
    if code == 0 and record_path.exists():
        return json.loads(record_path.read_text())
    try:
        tail = (directory / STDERR_FILE).read_text(errors="replace")[-6000:]
    except OSError:
        tail = ""
    raise CollectiveProcessError(
        f"The collective training process of worker {worker} exited with code {code}. Its output ends with:\n{tail}"
    )


def train_collective_partition(config: CollectiveConfig,
                               batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Body of one barrier task of a collective fit (the module docstring)."""
    from pyspark import BarrierTaskContext  # the task's context: imported where a task runs

    task_start = time.time()
    ctx = BarrierTaskContext.get()
    worker = ctx.partitionId()
    cpus, gpus = task_resources(ctx)
    shard, validation, data_ready = receive_rows(config, batches)
    port = reserve_port()  # held until the process is done with the group
    mine = {"rows": shard.rows, "val_rows": len(validation[0]), "port": port.getsockname()[1],
            "gpus": gpu_identities(gpus)}
    shared = [json.loads(m) for m in ctx.allGather(json.dumps(mine))]
    sizes = [s["rows"] for s in shared]
    padded = equal_rows(sizes, config.batch_size)
    shard.pad_to(padded, seed=config.seed + worker)
    addresses = [f"{info.address.rsplit(':', 1)[0]}:{s['port']}" for info, s in zip(ctx.getTaskInfos(), shared)]
    directory = Path(tempfile.mkdtemp(prefix="trainer-collective-", dir=spill_directory()))
    try:
        write_arrays(directory, shard, validation)
        shard.close()
        record = {
            "worker": worker, "attempt": config.attempt, "rows": sizes[worker], "padded_rows": padded,
            "task_start": task_start, "data_ready": data_ready, "executor_pid": os.getpid(), "cpus": cpus,
            "gpus": gpus, "backend": config.keras_backend, "feed": shard.kind,
            "validation": sum(s["val_rows"] for s in shared) > 0,
        }
        job = CollectiveJob(
            model=config.model, ps_address=(config.ps_host, config.ps_port), secret=config.secret,
            addresses=addresses, process_id=worker, num_processes=len(shared),
            batch_size=config.batch_size, epochs=config.epochs, attempt=config.attempt, seed=config.seed,
            io_timeout=config.io_timeout, keras_backend=config.keras_backend, cpus=cpus, gpus=gpus,
            shared_gpu=shares_gpu([s["gpus"] for s in shared], worker),
            env=config.env, validation_batch_size=config.validation_batch_size, parent_pid=os.getpid(),
            lr_factor=float(LR_SCALING[config.lr_scaling](len(shared))), cadence=config.cadence,
            record=record,
        )
        process = start_process(directory, job)
        try:
            record = wait_process(process, directory, worker)
        finally:
            if process.poll() is None:  # this task is being cancelled: the process goes with it
                process.kill()
                process.wait()
    finally:
        port.close()
        shutil.rmtree(directory, ignore_errors=True)
    yield result_batch(worker, record)
