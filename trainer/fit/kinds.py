"""What differs between the kinds of fit: what runs in the tasks, and what the driver's server serves.

The one driver (``trainer.fit.driver``) plans, stages, checkpoints, runs the
callbacks and builds the history the same way for every kind; a kind says
only the rest:

* `ParameterServerFit` (every rule but all-reduce): N long-lived worker
  tasks (``trainer.runtime.ps_worker.task``) commit to the parameter server, which
  holds the center and hears from every worker (`reporters` = N). A retry may
  continue on fewer workers (`min_workers`): the server is resized.
* `CollectiveFit` (``AllReduce``): N tasks all-reduce every step's gradients
  on the Keras backend's own collective engine
  (``trainer.runtime.collective``); the server is task 0's once-per-epoch
  endpoint (`reporters` = 1: one "worker" whose epochs are everybody's), for
  progress, checkpoints and the callbacks, which run before its reply
  (`inline`). A per-step all-reduce never shrinks (the global batch is
  ``num_workers * batch_size``); local SGD (a period other than 1) goes on
  with the workers left, down to `min_workers`, as the parameter-server rules do.

A third kind is one more class with these members.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from trainer.algorithms.choice import measured_line
from trainer.fit.plan import FitPlan
from trainer.ps.server import ParameterServer
from trainer.ps.shards import ShardedParameterServer
from trainer.runtime.collective.task import CollectiveConfig, train_collective_partition
from trainer.runtime.shipping import PickledSource
from trainer.runtime.ps_worker.task import WorkerConfig, train_partition
from trainer.spark.launch import RetryPolicy


class ParameterServerFit:
    """N workers commit to the parameter server (the module docstring)."""

    inline_callbacks = False

    def __init__(self, options) -> None:
        self.options = options
        self.reporters = options.num_workers
        self.shards = options.ps_shards

    def check(self, backend: str) -> None:
        """Every backend runs the parameter-server worker."""

    def progress_steps(self, steps_per_worker_epoch: int) -> int:
        return steps_per_worker_epoch * self.options.num_workers * self.options.epochs

    def server(self, **kwargs) -> ParameterServer:
        if self.shards == 1:
            return ParameterServer(**kwargs)
        return ShardedParameterServer(**kwargs, shards=self.shards)

    def task(self, plan: FitPlan, server, host: str, attempt: int, workers: int, backend: str,
             shard_budget: int | None, task_memory: int | None) -> Callable:
        o = self.options
        return functools.partial(train_partition, WorkerConfig(
            model=plan.source, algorithm=o.algorithm, ps_host=host, ps_ports=tuple(p for _, p in server.addresses),
            secret=server.credentials, num_workers=workers, batch_size=o.batch_size, epochs=o.epochs,
            input_shape=plan.spec.input_shape, label_size=plan.spec.label_size, attempt=attempt, seed=o.seed,
            io_timeout=o.io_timeout, keras_backend=backend, share_epochs=o.share_epochs, feed=o.feed,
            shard_budget=shard_budget, task_memory=task_memory, overlap=o.overlap,
        ))

    def retry_policy(self) -> RetryPolicy:
        o = self.options
        return RetryPolicy(o.max_retries, o.retry_timeout, o.min_workers)

    def on_retry(self, server, workers: int) -> int:
        """The stage continues on `workers`; the reporters the server hears from from now on."""
        server.resize(workers)
        return workers

    def description(self, model_name: str) -> str:
        return f"trainer: {model_name} {self.options.algorithm.describe()}"

    def summary(self, history: Any) -> str:
        return f"{history.num_updates} updates, {history.bytes_moved / 1e6:.1f} MB moved"


class CollectiveFit:
    """N tasks all-reduce their gradients; the server hears from task 0 once per epoch (the module docstring)."""

    inline_callbacks = True
    reporters = 1
    shards = 1

    def __init__(self, options) -> None:
        self.options = options

    def check(self, backend: str) -> None:
        """The backend must have a collective path (a clear error before any cluster work)."""
        self.options.algorithm.check_backend(backend)

    def progress_steps(self, steps_per_worker_epoch: int) -> int:
        return steps_per_worker_epoch * self.options.epochs

    def server(self, **kwargs) -> ParameterServer:
        return ParameterServer(**kwargs)

    def task(self, plan: FitPlan, server, host: str, attempt: int, workers: int, backend: str,
             shard_budget: int | None, task_memory: int | None) -> Callable:
        o = self.options
        return functools.partial(train_collective_partition, CollectiveConfig(
            model=PickledSource.of(plan.source), ps_host=host, ps_port=server.address[1], secret=server.credentials,
            num_workers=workers, batch_size=o.batch_size, epochs=o.epochs, input_shape=plan.spec.input_shape,
            label_size=plan.spec.label_size, attempt=attempt, seed=o.seed, io_timeout=o.io_timeout,
            keras_backend=backend, feed=o.feed, shard_budget=shard_budget, task_memory=task_memory,
            lr_scaling=o.algorithm.lr_scaling, period=o.algorithm.period, max_period=o.algorithm.max_period,
            wire=o.algorithm.wire,
        ))

    def retry_policy(self) -> RetryPolicy:
        o = self.options
        # Per-step all-reduce never shrinks (its global batch is num_workers * batch_size); local SGD averages
        # replicas, so a retry may go on with the workers left, as the parameter-server rules do (min_workers).
        return RetryPolicy(o.max_retries, o.retry_timeout, o.min_workers if o.algorithm.periodic else None)

    def on_retry(self, server, workers: int) -> int:
        return 1

    def description(self, model_name: str) -> str:
        return f"trainer: {model_name} {self.options.algorithm.describe()} x{self.options.num_workers}"

    def summary(self, history: Any) -> str:
        first = next((w for w in history.workers if w.get("period") is not None), None)
        if first is None:
            return f"all-reduce over {self.options.num_workers} workers"
        return f"local SGD over {self.options.num_workers} workers, {measured_line(first)}"


def fit_kind(options) -> ParameterServerFit | CollectiveFit:
    """The kind of fit the trainer's rule asks for."""
    return CollectiveFit(options) if getattr(options.algorithm, "collective", False) else ParameterServerFit(options)
