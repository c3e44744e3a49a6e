"""Set up a task's Python process before its Keras backend starts: cores, GPUs, memory, backend, logs.

What differs between backends is asked of their rooms (``trainer.backends``):

* **Cores.** TensorFlow and OpenMP (torch) read thread-count variables
  (``trainer.backends.thread_env``, every backend's, set in every task);
  XLA (JAX) ignores them, so every task is also pinned to as many cores as
  Spark gave it (`trainer.runtime.cores`). A reused Python worker that
  already started its backend keeps the thread pools of its first task,
  which had the same number of cores.
* **GPUs.** The task sees only the devices Spark assigned it
  (``TaskContext.resources()["gpu"]``, requested with ``gpus_per_worker``,
  see ``trainer.spark.resources``) through ``CUDA_VISIBLE_DEVICES``; a
  Python worker that already started its backend keeps the devices of its
  first task (Spark assigns an executor's tasks the same addresses again
  when it has only as many GPUs as task slots).
* **Logs and GPU memory** (``trainer.process_env``): quiet unless asked,
  and tasks that share a GPU take only what they use. Set before the
  backend starts; a value the user set wins.

The C allocator keeps freed blocks of up to 32 MiB (``trainer.runtime.allocator``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Iterator, TypeVar

from trainer.backends import thread_env
from trainer.process_env import prepare_process
from trainer.runtime.allocator import keep_freed_memory
from trainer.runtime.cores import choose_cores, release_cores, sharing

T = TypeVar("T")


def configure_process(cpus: int, gpus: list[str] | None, keras_backend: str, env: dict[str, str],
                      index: int = 0) -> list[int] | None:
    """Cores, thread counts, GPU visibility and memory, backend, quiet logs and the allocator of this process
    (see the module docstring); returns the cores it is pinned to (None: affinity off). `index` (the task's
    partition) spreads tasks over the cores when there are more tasks than cores."""
    keep_freed_memory()
    os.environ.update(env)
    prepare_process()
    os.environ["KERAS_BACKEND"] = keras_backend
    os.environ.update(thread_env(cpus))
    if gpus is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    return choose_cores(cpus, index)


def task_resources(ctx) -> tuple[int, list[str] | None]:
    """(CPUs, GPU addresses or None) that Spark gave the task of `ctx` (a TaskContext)."""
    if ctx is None:
        return 1, None
    resources = ctx.resources()
    gpus = list(resources["gpu"].addresses) if "gpu" in resources else None
    return max(1, int(ctx.cpus())), gpus


def setup_barrier_task(ctx, keras_backend: str, env: dict[str, str]) -> dict:
    """`configure_process` for the barrier task of `ctx`; returns what it set, for the task's record:
    ``{"cpus", "gpus"`` (the addresses Spark assigned, or None) ``, "visible_devices", "pinned_cores",
    "cores_shared"`` (every core was claimed: it time-shares) ``, "backend"}``."""
    cpus, gpus = task_resources(ctx)
    pinned = configure_process(cpus, gpus, keras_backend, env, index=ctx.partitionId())
    return {"cpus": cpus, "gpus": gpus, "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "pinned_cores": pinned, "cores_shared": sharing(), "backend": keras_backend}


@dataclass(frozen=True)
class TaskStart:
    """What every training task knows once it started: when, its Spark context, its partition, its settings."""

    time: float
    ctx: Any
    index: int
    devices: dict


def start_task(context: Any, keras_backend: str, env: dict[str, str]) -> TaskStart:
    """The prologue of every training task: the time, the task's context (`context` is pyspark's
    ``TaskContext`` or ``BarrierTaskContext``), its partition and `setup_barrier_task`'s settings."""
    started = time.time()
    ctx = context.get()
    return TaskStart(started, ctx, ctx.partitionId(), setup_barrier_task(ctx, keras_backend, env))


def setup_task(keras_backend: str, env: dict[str, str] | None = None) -> None:
    """`configure_process` with the resources of the current Spark task (any task, barrier or not)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    cpus, gpus = task_resources(ctx)
    configure_process(cpus, gpus, keras_backend, env or {}, index=ctx.partitionId() if ctx is not None else 0)


def executor_id() -> str | None:
    """The Spark executor this Python worker runs under: the ``--executor-id`` of the nearest ancestor process
    that has one (the executor's JVM, on every cluster manager); None where /proc cannot tell (not Linux)."""
    pid = os.getppid()
    for _ in range(8):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
            if b"--executor-id" in args:
                return args[args.index(b"--executor-id") + 1].decode()
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None
        if pid <= 1:
            return None
    return None


def holding_cores(task: Iterator[T]) -> Iterator[T]:
    """Run the task body `task` (a generator) and give back the cores it claimed when it ends, however it ends:
    the Python worker Spark keeps for a later task then holds none (see `trainer.runtime.cores`)."""
    try:
        yield from task
    finally:
        release_cores()
