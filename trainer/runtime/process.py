"""Set up a task's Python process before TensorFlow starts: threads, GPUs, backend, log levels, allocator.

TensorFlow and OpenMP read these variables when they start; a reused Python
worker that already loaded TensorFlow keeps the pools of its first task,
which had the same number of cores. GPUs: the task sees only the devices
Spark assigned it (``TaskContext.resources()["gpu"]``, requested with
``gpus_per_worker``, see ``trainer.spark.resources``) through
``CUDA_VISIBLE_DEVICES``; a Python worker that already started TensorFlow
keeps the devices of its first task (Spark assigns an executor's tasks the
same addresses again when it has only as many GPUs as task slots).
The C allocator keeps freed blocks of up to 32 MiB (``trainer.runtime.allocator``).
"""

from __future__ import annotations

import os

from trainer import verbosity
from trainer.runtime.allocator import keep_freed_memory


def configure_process(cpus: int, gpus: list[str] | None, keras_backend: str, env: dict[str, str]) -> None:
    """Thread counts, GPU visibility, backend, quiet logs and the allocator of this process (see the module
    docstring)."""
    keep_freed_memory()
    os.environ.update(env)
    verbosity.apply_quiet_env()
    os.environ["KERAS_BACKEND"] = keras_backend
    for var in ("TF_NUM_INTRAOP_THREADS", "OMP_NUM_THREADS"):
        os.environ[var] = str(cpus)
    os.environ["TF_NUM_INTEROP_THREADS"] = "1" if cpus <= 2 else "2"
    if gpus is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)


def task_resources(ctx) -> tuple[int, list[str] | None]:
    """(CPUs, GPU addresses or None) that Spark gave the task of `ctx` (a TaskContext)."""
    if ctx is None:
        return 1, None
    resources = ctx.resources()
    gpus = list(resources["gpu"].addresses) if "gpu" in resources else None
    return max(1, int(ctx.cpus())), gpus


def setup_barrier_task(ctx, keras_backend: str, env: dict[str, str]) -> dict:
    """`configure_process` for the barrier task of `ctx`; returns what it set, for the task's record:
    ``{"cpus", "gpus"`` (the addresses Spark assigned, or None) ``, "visible_devices"}``."""
    cpus, gpus = task_resources(ctx)
    configure_process(cpus, gpus, keras_backend, env)
    return {"cpus": cpus, "gpus": gpus, "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def setup_task(keras_backend: str, env: dict[str, str] | None = None) -> None:
    """`configure_process` with the resources of the current Spark task (any task, barrier or not)."""
    from pyspark import TaskContext

    cpus, gpus = task_resources(TaskContext.get())
    configure_process(cpus, gpus, keras_backend, env or {})
