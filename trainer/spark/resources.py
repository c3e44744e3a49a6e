"""GPUs per task: the barrier stage's ResourceProfile, the checks before a fit, fake GPUs for LocalCluster.

``Trainer(..., gpus_per_worker=k)`` and ``ModelSelector(..., gpus_per_worker=k)``
ask Spark for ``k`` GPUs per barrier task with a stage-level *task* resource
profile (`stage_profile`, passed to ``mapInArrow(..., profile=...)``). Barrier
stages cannot run with dynamic allocation, so the profile holds task requests
only (Spark's ``TaskResourceProfile``): the tasks run on the executors the
session already has, and those executors must hold GPUs
(``spark.executor.resource.gpu.amount``), which they get from workers that
announce them (``spark.worker.resource.gpu.amount`` and a discovery script).
`check_gpus_offered` fails before any cluster work when the session's
settings cannot give a task ``k`` GPUs, and says which settings to add.

Inside the task, ``TaskContext.resources()["gpu"].addresses`` are the devices
Spark assigned; ``trainer.runtime.process`` turns them into
``CUDA_VISIBLE_DEVICES`` before TensorFlow starts.

`worker_resource_opts` writes the discovery scripts of
``LocalCluster(worker_resources={"gpu": k})``: they announce addresses
without any device behind them, which is how the scheduling path is tested
on machines without GPUs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from trainer.errors import ClusterCapacityError
from trainer.spark.connect import is_connect

GPU = "gpu"

__all__ = ["GPU", "check_gpus_per_worker", "check_gpus_offered", "in_one_process", "stage_profile",
           "check_worker_resources", "worker_resource_opts"]


def check_gpus_per_worker(value: Any) -> int:
    """`gpus_per_worker` as an int >= 0 (0: the stage keeps the session's default task resources)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"`gpus_per_worker` must be an integer >= 0 (GPUs each worker task gets). "
            f"Received: gpus_per_worker={value!r}. Fix: e.g. gpus_per_worker=1, or 0 for none."
        )
    return value


def _conf(spark, key: str, default: str | None = None) -> str | None:
    # spark.conf works on classic and Spark Connect sessions alike; it sees the
    # SparkConf the session started with (executor, task and master settings).
    value = spark.conf.get(key, default)
    return default if value in (None, "") else value


def in_one_process(spark) -> bool:
    """Whether the session's master is ``local`` or ``local[N]``: one executor, the driver's own JVM."""
    master = _conf(spark, "spark.master", "") or ""
    return master == "local" or master.startswith("local[")


def stage_profile(spark, gpus_per_worker: int):
    """A ResourceProfile asking ``gpus_per_worker`` GPUs (and the session's task CPUs) per task; None for 0.

    Raises ClusterCapacityError first when the session cannot offer them (`check_gpus_offered`).
    """
    if not gpus_per_worker:
        return None
    check_gpus_offered(spark, gpus_per_worker)
    import inspect

    from pyspark.resource import ResourceProfileBuilder, TaskResourceRequests
    from pyspark.sql import DataFrame

    if "profile" not in inspect.signature(DataFrame.mapInArrow).parameters:
        import pyspark

        raise ClusterCapacityError(
            f"gpus_per_worker={gpus_per_worker} needs pyspark >= 4.0 (a barrier stage with a ResourceProfile, "
            f"`mapInArrow(..., profile=...)`); found pyspark {pyspark.__version__}. Fix: upgrade pyspark, or "
            "pass gpus_per_worker=0 and give every task a GPU with spark.task.resource.gpu.amount.",
            slots=0,
        )

    cpus = int(float(_conf(spark, "spark.task.cpus", "1")))
    requests = TaskResourceRequests().cpus(cpus).resource(GPU, float(gpus_per_worker))
    profile = ResourceProfileBuilder().require(requests).build
    if is_connect(spark):
        # A Connect client registers the profile on the server when its id is first read, with the session
        # active in the reading thread: read it here, not in the thread that later runs the stage.
        profile.id  # noqa: B018
    return profile


def check_gpus_offered(spark, gpus_per_worker: int) -> None:
    """Raise ClusterCapacityError, with the settings to add, when no executor can give a task that many GPUs."""
    if not gpus_per_worker:
        return
    if in_one_process(spark):
        master = _conf(spark, "spark.master", "")
        raise ClusterCapacityError(
            f"gpus_per_worker={gpus_per_worker} needs a Spark standalone, YARN or Kubernetes cluster (Spark "
            f"schedules GPUs per stage only there), but the session runs on master {master!r}. Fix: use a "
            "cluster (e.g. LocalCluster(workers=N, worker_resources={'gpu': 1}) or `make up GPU=1`), or "
            "gpus_per_worker=0.",
            slots=0,
        )
    amount = _conf(spark, f"spark.executor.resource.{GPU}.amount")
    if amount is None or float(amount) < gpus_per_worker:
        raise ClusterCapacityError(
            f"gpus_per_worker={gpus_per_worker} needs executors that hold at least {gpus_per_worker} GPU(s), "
            f"but the session has spark.executor.resource.gpu.amount={amount or 'unset'}. Fix: start the "
            f"session with spark.executor.resource.gpu.amount={gpus_per_worker} (or more), on workers that "
            "announce GPUs (spark.worker.resource.gpu.amount and spark.worker.resource.gpu.discoveryScript; "
            "the lab's GPU variant sets both: `make up GPU=1`, k8s/overlays/gpu); or pass gpus_per_worker=0.",
            slots=0,
        )


def check_worker_resources(resources: dict[str, int] | None) -> dict[str, int]:
    """``LocalCluster(worker_resources=...)`` as ``{name: count >= 1}``."""
    if resources is None:
        return {}
    if not isinstance(resources, dict) or not all(
        isinstance(k, str) and k.isidentifier() and isinstance(v, int) and not isinstance(v, bool) and v >= 1
        for k, v in resources.items()
    ):
        raise ValueError(
            f"expected worker_resources as {{name: count >= 1}}, e.g. {{'gpu': 1}}, got {resources!r}"
        )
    return dict(resources)


def worker_resource_opts(resources: dict[str, int], index: int, conf_dir: Path) -> str:
    """Java options announcing ``resources`` on worker `index`; writes its discovery scripts into `conf_dir`."""
    opts = []
    for name, count in sorted(resources.items()):
        addresses = [str(index * count + j) for j in range(count)]
        script = Path(conf_dir) / f"worker-{index}-{name}-discovery.sh"
        script.write_text("#!/bin/sh\n# Written by LocalCluster: announces addresses, no device checked.\n"
                          f"echo '{json.dumps({'name': name, 'addresses': addresses})}'\n")
        os.chmod(script, 0o755)
        opts += [f"-Dspark.worker.resource.{name}.amount={count}",
                 f"-Dspark.worker.resource.{name}.discoveryScript={script}"]
    return " ".join(opts)
