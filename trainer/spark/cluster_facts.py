"""The cluster a fit or a search runs on, as one object: `FitCluster`, made once from the session and handed on.

The driver of a fit (``trainer.fit.driver``) and of a search
(``trainer.selection.selector``) each make one `FitCluster(spark,
gpus_per_worker)` and hand it to what only reads facts of the cluster: the
algorithm choice (`hosts`), the controller (`addresses`: where executors reach
the driver's server; `session`: the stage's slots), the plan (`profile`: the
stage's ResourceProfile) and the tasks (`task_memory`). Each fact is read from
the session when first asked for and then kept, so every check fails where it
always did (the GPU check in the plan, after the model's and the data's):

* `connect`: whether the session is a Spark Connect client's (``trainer.spark.connect``).
* `hosts`: distinct hosts of the driver and its executors
  (``trainer.spark.session.fit_hosts``; None on Spark Connect).
* `addresses(host, bind, port, endpoints)`: where executors reach a server in
  this driver, where it listens and its first port.
* `profile`: the stage's ResourceProfile for ``gpus_per_worker`` GPUs per task
  (``trainer.spark.resources.stage_profile``; None for 0).
* `task_memory`: the memory Spark gives one task (`task_memory_bytes`), for the
  workers' shard budget.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from trainer.spark.connect import client_address, is_connect
from trainer.spark.java import parse_memory_mb
from trainer.spark.resources import stage_profile
from trainer.spark.session import fit_hosts

__all__ = ["FitCluster", "task_memory_bytes"]


class FitCluster:
    """The facts of the cluster one fit or search runs on (the module docstring).

    Args:
        session: the SparkSession (classic or Spark Connect) the stage runs on.
        gpus_per_worker: Integer. GPUs each task gets (`profile`).
    """

    def __init__(self, session: Any, gpus_per_worker: int = 0) -> None:
        self.session = session
        self.gpus_per_worker = gpus_per_worker

    @functools.cached_property
    def connect(self) -> bool:
        """Whether the session is a Spark Connect client's."""
        return is_connect(self.session)

    @functools.cached_property
    def hosts(self) -> int | None:
        """Distinct hosts of the driver and its executors; None where the client cannot list them."""
        return fit_hosts(self.session)

    @functools.cached_property
    def profile(self) -> Any:
        """The stage's ResourceProfile (None for no GPUs); raises ClusterCapacityError when none is offered."""
        return stage_profile(self.session, self.gpus_per_worker)

    @functools.cached_property
    def task_memory(self) -> int | None:
        """The memory Spark gives one task, in bytes (`task_memory_bytes`)."""
        return task_memory_bytes(self.session)

    def addresses(self, host: str | None = None, bind: str | None = None, port: int | None = None,
                  endpoints: int = 1) -> tuple[str, str, int]:
        """(address executors use to reach a server in this driver, address it listens on, port).

        Defaults: ``$TRAINER_PS_HOST`` or ``spark.driver.host`` (on Spark Connect: this client's
        address on the route to the server, see `trainer.spark.connect`); ``$TRAINER_PS_BIND``
        or that host (never all interfaces unless asked); ``$TRAINER_PS_PORT`` or 0
        (a free port). A server of several `endpoints` (a sharded parameter server) listens on
        ``port, port + 1, ...`` (free ports when it is 0): open that range to the executors.
        """
        # On Spark Connect the driver is the server; the servers run in this client process.
        spark = self.session
        default = client_address(spark) if self.connect else spark.conf.get("spark.driver.host", None)
        host = host or os.environ.get("TRAINER_PS_HOST") or default or "127.0.0.1"
        bind = bind or os.environ.get("TRAINER_PS_BIND") or host
        port = port if port is not None else int(os.environ.get("TRAINER_PS_PORT", "0"))
        if not 0 <= port <= 65536 - endpoints:
            raise ValueError(f"the parameter server's port {port} cannot start a range of {endpoints} ports "
                             f"(ps_shards={endpoints} listens on port, port + 1, ...). Fix: a port <= "
                             f"{65536 - endpoints}, or 0 for free ports.")
        return host, bind, port


def task_memory_bytes(spark) -> int | None:
    """``spark.executor.memory`` divided over an executor's task slots (``spark.executor.cores`` /
    ``spark.task.cpus``), in bytes; None when the session does not say (a Spark Connect server may not)."""

    def setting(key: str) -> str | None:
        try:
            return spark.conf.get(key, None)
        except Exception:  # Spark Connect may refuse to show a static setting: then it is unknown
            return None

    memory = setting("spark.executor.memory")
    if not memory:
        return None
    try:
        total = parse_memory_mb(memory) * 1024 * 1024
        slots = max(1, int(setting("spark.executor.cores") or 1) // max(1, int(setting("spark.task.cpus") or 1)))
    except ValueError:
        return None
    return total // slots
