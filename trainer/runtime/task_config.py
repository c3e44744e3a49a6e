"""What every training task gets from the driver, whatever its kind; serialized into the Spark task closure.

`TaskConfig` holds the fields the parameter-server worker
(``trainer.runtime.ps_worker.worker_task.WorkerConfig``) and the collective
task (``trainer.runtime.collective.collective_task.CollectiveConfig``) share;
each adds its own. Keyword-only, so a kind's required fields may follow the
shared defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainer.backends import DEFAULT_NAME


@dataclass(kw_only=True)
class TaskConfig:
    """The model, the server to report to, the data's shape and the run's sizes."""

    model: Any  # a ModelSource, or a PickledSource of one
    ps_host: str
    secret: Any = field(repr=False)  # the server's Credentials (secret, frame MAC, TLS fingerprint): never shown
    num_workers: int
    batch_size: int
    epochs: int
    input_shape: tuple[int, ...]
    label_size: int | None
    attempt: int = 0
    seed: int = 0
    io_timeout: float = 600.0
    keras_backend: str = DEFAULT_NAME
    env: dict[str, str] = field(default_factory=dict)
    validation_batch_size: int = 256
    feed: str = "auto"  # how the shard is held: trainer.runtime.feeding.shard
    shard_budget: int | None = None  # bytes; None: derived from task_memory or the worker's limit
    task_memory: int | None = None  # spark.executor.memory per task slot, in bytes, if known
