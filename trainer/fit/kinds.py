"""The kinds of fit, declared: what runs in the tasks, what the driver serves, the records, how a fit resumes.

The one driver (``trainer.fit.driver``) plans, runs the stage through the
controller (``trainer.controller``), checkpoints, runs the callbacks and
builds the history the same way for every kind; a kind implements `FitKind`
for the rest. Each algorithm names its kind (``Algorithm.fit_kind``) and
`fit_kind` builds it from `KINDS`:

* `ParameterServerFit` (every algorithm but all-reduce and local SGD): N
  long-lived worker tasks (``trainer.runtime.ps_worker.worker_task``) commit to the
  parameter server, which holds the center and applies the algorithm; it hears
  from every worker (`reporters` = N). A retry may continue on fewer workers
  (`min_workers`): the server is resized.
* `CollectiveFit` (``AllReduce``, ``LocalSGD``): N tasks train as one group
  on the Keras backend's own collective engine (``trainer.runtime.collective``);
  the driver serves task 0's once-per-epoch endpoint, whose algorithm keeps the
  state task 0 reports (``ReportedState``): `reporters` = 1, one "worker"
  whose epochs are everybody's, for progress, checkpoints and the callbacks,
  which run before its reply (`inline_callbacks`). A per-step all-reduce never
  shrinks (the global batch is ``num_workers * batch_size``); local SGD (a
  period other than 1) goes on with the workers left, down to `min_workers`.
* `ElasticFit` (``num_workers=(min, max)`` with an asynchronous
  parameter-server algorithm or local SGD): one ordinary Spark job per epoch
  of one task per chunk of the rows (``trainer.runtime.ps_worker.chunk_task``);
  every chunk is a reporter, workers are the processes that run them
  (``trainer.fit.membership``), and they may leave and join. Local SGD
  averages through the server there, in rounds of the chunk tasks training
  at the time (``trainer.algorithms.elastic_local_sgd``).

Every kind's tasks end with the stage's one result row, the task's record as
JSON (``trainer.runtime.stage_result``); `summary` reads what the kind's
records add. `fit_kind` picks `ElasticFit` for an elastic trainer; another kind
(model-parallel) is one more class that implements `FitKind` and one more
entry in `KINDS`.
"""

from __future__ import annotations

import abc
import functools
import uuid
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from trainer.algorithms import COLLECTIVE, PARAMETER_SERVER, Algorithm
from trainer.algorithms.choice import measured_line
from trainer.algorithms.elastic_local_sgd import ElasticLocalSGD, OuterRounds
from trainer.algorithms.reported import ReportedState
from trainer.fit.checkpoints import Checkpoint
from trainer.fit.membership import Membership
from trainer.fit.plan import FitPlan, resume_center
from trainer.ps.server import ParameterServer
from trainer.ps.shards import ShardedParameterServer
from trainer.runtime.collective.collective_task import CollectiveConfig, train_collective_partition
from trainer.runtime.ps_worker.chunk_task import ChunkConfig, train_chunk
from trainer.runtime.ps_worker.worker_task import WorkerConfig, train_partition
from trainer.runtime.shipping import PickledSource
from trainer.spark.elastic_launch import ColdTasks, ElasticPolicy
from trainer.spark.launch import RetryPolicy


@dataclass(frozen=True)
class TaskLaunch:
    """What the tasks of one attempt get from the driver besides the plan."""

    host: str  # where executors reach the driver's server
    attempt: int
    workers: int
    backend: str  # the driver's Keras backend: the tasks run the same
    shard_budget: int | None  # bytes of its shard a task holds in memory (None: the task's own default)
    task_memory: int | None  # bytes of memory a task may use (None: unknown)


class FitKind(abc.ABC):
    """What a kind of fit declares (the module docstring): built from the `Trainer` and this fit's algorithm."""

    #: Whether the driver's callbacks run on the server's thread before its reply to the reporter.
    inline_callbacks: ClassVar[bool] = False
    #: Who trains, for a kind whose workers come and go (`ElasticFit`); None for a fixed set of workers.
    membership: Membership | None = None

    def __init__(self, trainer, algorithm: Algorithm) -> None:
        self.trainer, self.algorithm = trainer, algorithm

    @property
    @abc.abstractmethod
    def reporters(self) -> int:
        """The workers the server hears from: their epochs make the fit's epochs."""

    @property
    def endpoints(self) -> int:
        """Ports the driver's server listens on."""
        return 1

    def check(self, backend: str) -> None:
        """Raise before any cluster work when this kind cannot run on Keras's `backend`."""

    @abc.abstractmethod
    def progress_steps(self, steps_per_worker_epoch: int) -> int:
        """The steps the progress bar counts over the whole fit."""

    @abc.abstractmethod
    def server(self, **endpoint: Any) -> ParameterServer:
        """What the driver serves; `endpoint` holds the server's common arguments (``trainer.fit.driver``)."""

    @abc.abstractmethod
    def task(self, plan: FitPlan, server, launch: TaskLaunch) -> Callable:
        """What each task of an attempt runs: ``f(batches) -> the stage's result rows``."""

    @abc.abstractmethod
    def resume_center(self, checkpoint: Checkpoint, model) -> list:
        """The center a resumed fit starts from: the checkpoint's, checked against `model`."""

    @abc.abstractmethod
    def retry_policy(self) -> RetryPolicy:
        """How the stage is retried after lost executors."""

    @abc.abstractmethod
    def on_retry(self, server, workers: int) -> int:
        """The stage goes on with `workers`; returns the reporters the server hears from from now on."""

    def description(self, model_name: str) -> str:
        """The stage's name in Spark's UI."""
        return f"trainer: {model_name} {self.algorithm.describe()} x{self.trainer.num_workers}"

    @abc.abstractmethod
    def summary(self, history: Any) -> str:
        """The end of the fit's closing log line: what the tasks' records say of the exchange."""

    def run_stage(self, controller, plan: FitPlan, server, launch: Callable[[int, int], TaskLaunch], *,
                  on_started, on_retry, events: list[dict], fatal, stopped: Callable[[], bool]):
        """Run the fit's tasks through `controller` (inside its `closing`); `launch(attempt, workers)` starts an
        attempt on the server and says what its tasks get. A fixed kind: one barrier stage with retries."""
        t = self.trainer
        return controller.run(
            plan.frame, t.num_workers, lambda attempt, workers: self.task(plan, server, launch(attempt, workers)),
            server=server, policy=self.retry_policy(), description=self.description(plan.model.name),
            slot_timeout=t.slot_timeout, profile=plan.profile, on_started=on_started, on_retry=on_retry,
            events=events, fatal=fatal)


class ParameterServerFit(FitKind):
    """N workers commit to the parameter server (the module docstring)."""

    @property
    def reporters(self) -> int:
        return self.trainer.num_workers

    @property
    def endpoints(self) -> int:
        return self.trainer.ps_shards

    def progress_steps(self, steps_per_worker_epoch: int) -> int:
        return steps_per_worker_epoch * self.trainer.num_workers * self.trainer.epochs

    def server(self, **endpoint: Any) -> ParameterServer:
        if self.endpoints == 1:
            return ParameterServer(algorithm=self.algorithm, **endpoint)
        return ShardedParameterServer(algorithm=self.algorithm, **endpoint, shards=self.endpoints)

    def task(self, plan: FitPlan, server, launch: TaskLaunch) -> Callable:
        t = self.trainer
        return functools.partial(train_partition, WorkerConfig(
            model=plan.source, algorithm=self.algorithm, ps_host=launch.host,
            ps_ports=tuple(p for _, p in server.addresses), secret=server.credentials, num_workers=launch.workers,
            batch_size=t.batch_size, epochs=t.epochs, input_shape=plan.spec.input_shape,
            label_size=plan.spec.label_size, attempt=launch.attempt, seed=t.seed, io_timeout=t.io_timeout,
            keras_backend=launch.backend, share_epochs=t.share_epochs, feed=t.feed, shard_budget=launch.shard_budget,
            task_memory=launch.task_memory, overlap=t.overlap,
        ))

    def resume_center(self, checkpoint: Checkpoint, model) -> list:
        return resume_center(checkpoint, model, self.algorithm.exchanges_optimizer_state)

    def retry_policy(self) -> RetryPolicy:
        t = self.trainer
        return RetryPolicy(t.max_retries, t.retry_timeout, t.min_workers)

    def on_retry(self, server, workers: int) -> int:
        server.resize(workers)
        return workers

    def description(self, model_name: str) -> str:
        return f"trainer: {model_name} {self.algorithm.describe()}"

    def summary(self, history: Any) -> str:
        return f"{history.num_updates} updates, {history.bytes_moved / 1e6:.1f} MB moved"


class CollectiveFit(FitKind):
    """N tasks train as one collective group; the server hears from task 0 once per epoch (the module docstring)."""

    inline_callbacks = True

    @property
    def reporters(self) -> int:
        return 1

    def check(self, backend: str) -> None:
        self.algorithm.check_backend(backend)

    def progress_steps(self, steps_per_worker_epoch: int) -> int:
        return steps_per_worker_epoch * self.trainer.epochs

    def server(self, **endpoint: Any) -> ParameterServer:
        return ParameterServer(algorithm=ReportedState(), **endpoint)

    def task(self, plan: FitPlan, server, launch: TaskLaunch) -> Callable:
        t, algorithm = self.trainer, self.algorithm
        return functools.partial(train_collective_partition, CollectiveConfig(
            model=PickledSource.of(plan.source), ps_host=launch.host, ps_port=server.address[1],
            secret=server.credentials, num_workers=launch.workers, batch_size=t.batch_size, epochs=t.epochs,
            input_shape=plan.spec.input_shape, label_size=plan.spec.label_size, attempt=launch.attempt, seed=t.seed,
            io_timeout=t.io_timeout, keras_backend=launch.backend, feed=t.feed, shard_budget=launch.shard_budget,
            task_memory=launch.task_memory, lr_scaling=algorithm.lr_scaling, cadence=algorithm.cadence(),
        ))

    def resume_center(self, checkpoint: Checkpoint, model) -> list:
        return resume_center(checkpoint, model, True)  # task 0 reports its optimizer's variables too

    def retry_policy(self) -> RetryPolicy:
        t = self.trainer
        # Per-step all-reduce never shrinks (its global batch is num_workers * batch_size); local SGD averages
        # replicas, so a retry may go on with the workers left, as the parameter-server algorithms do (min_workers).
        return RetryPolicy(t.max_retries, t.retry_timeout, t.min_workers if self.algorithm.periodic else None)

    def on_retry(self, server, workers: int) -> int:
        return 1

    def summary(self, history: Any) -> str:
        first = next((w for w in history.workers if w.get("period") is not None), None)
        if first is None:
            return f"all-reduce over {self.trainer.num_workers} workers"
        return f"local SGD over {self.trainer.num_workers} workers, {measured_line(first)}"


#: Chunks per worker of the maximum: more chunks even out the epoch's tail when the workers are fewer or uneven,
#: and a lost task redoes less; but each chunk is a Spark task, and between two tasks a worker waits for Spark to
#: launch the next (on the 2-core machine, 3 workers of the MNIST CNN: with 4 chunks per worker an epoch took a
#: fifth longer than with 2; make bench-elastic measures them against a fixed fit).
CHUNKS_PER_WORKER = 2


class ElasticFit(ParameterServerFit):
    """An elastic fit, ``Trainer(num_workers=(min, max))``: workers leave and join while it runs.

    A fixed fit runs ONE barrier stage of `num_workers` long-lived tasks; an
    elastic one runs one ordinary Spark job per epoch over its rows cut into
    `CHUNKS_PER_WORKER` x max chunks (``trainer.spark.elastic_launch``), each task
    one pass over one chunk (``trainer.runtime.ps_worker.chunk_task``) that
    commits to the parameter server like any worker of the asynchronous
    algorithms. To the server every chunk is a worker that finishes each epoch
    once: its epoch accounting, checkpoints, the driver's callbacks (run before the
    epoch's last report is answered, so the next epoch sees their stop or new
    learning rate) and resuming work as for a fixed fit of that many workers.

    Who trains is whatever Spark runs the tasks on: a worker is a Python
    process (`trainer.fit.membership`), joining with its first task and leaving
    when its connection drops without goodbye or its heartbeat stops (a hung
    one's executor is then released to Spark); at most max of them train at once
    (the server makes the others wait). The fit goes on while the cluster
    offers at least min task slots (``retry_timeout`` seconds below it stop the
    fit with `ClusterCapacityError`). With Spark's dynamic allocation on, the
    pending chunk tasks are what makes Spark ask for executors.

    What changes with the workers, and what does not: the chunks are the same
    whatever the workers, every row is trained once per epoch (a task re-run
    after a loss skips what its lost attempt committed), and the learning rate is
    the optimizer's (DOWNPOUR's commits are each worker's own steps); more
    workers mean more commits in flight, hence more staleness, which the
    time-sized window bounds (``trainer.algorithms.cadence``). Local SGD
    (`ElasticLocalSGD`) trains at the rate of a fixed fit of max workers and
    the server's rounds (`OuterRounds`, with the outer velocity) average the
    tasks training at the time, a round of fewer shrunk in proportion.
    """

    inline_callbacks = True

    def __init__(self, trainer, algorithm) -> None:
        if algorithm.fit_kind == COLLECTIVE:  # local SGD: its average taken by the server, round by round
            algorithm = ElasticLocalSGD.of(algorithm, trainer.num_workers)
        super().__init__(trainer, algorithm)
        self.chunks = CHUNKS_PER_WORKER * trainer.num_workers
        self.fit_id = uuid.uuid4().hex
        self.epoch = 0
        self.membership: Membership | None = None
        self.rounds = OuterRounds(algorithm) if isinstance(algorithm, ElasticLocalSGD) else None
        self._server: ParameterServer | None = None

    @property
    def reporters(self) -> int:
        return self.chunks

    @property
    def endpoints(self) -> int:
        return 1

    def progress_steps(self, steps_per_worker_epoch: int) -> int:
        return steps_per_worker_epoch * self.trainer.num_workers * self.trainer.epochs

    def server(self, **endpoint: Any) -> ParameterServer:
        server: ParameterServer | None = None
        self.membership = Membership(self.trainer.num_workers, epoch=lambda: self.epoch,
                                     step=lambda: server.version if server is not None else 0)
        server = ParameterServer(algorithm=self.rounds or self.algorithm, **endpoint,
                                 on_member=self.membership.heard, admit=self.membership.admit)
        self._server = server
        return server

    def _watch(self) -> list[dict[str, Any]]:
        """Members silent too long leave; no round of the server waits for their tasks any more."""
        changes = self.membership.check()
        for change in changes:
            self._server.drop_member(change["worker"])
        return changes

    def task(self, plan: FitPlan, server, launch: TaskLaunch) -> Callable:
        return self.chunk_task(plan, server, launch, plan.completed_epochs)

    def chunk_task(self, plan: FitPlan, server, launch: TaskLaunch, epoch: int) -> Callable:
        """What each chunk task of `epoch` runs. One attempt for the whole fit (a process's heartbeat outlives
        epochs): a task Spark gave up on is fenced per chunk and epoch instead (``trainer.ps.members``)."""
        t = self.trainer
        self.epoch = epoch
        return functools.partial(train_chunk, ChunkConfig(
            model=plan.source, algorithm=self.algorithm, ps_host=launch.host, ps_ports=(server.address[1],),
            secret=server.credentials, num_workers=t.num_workers, batch_size=t.batch_size, epochs=t.epochs,
            input_shape=plan.spec.input_shape, label_size=plan.spec.label_size, attempt=launch.attempt, seed=t.seed,
            io_timeout=t.io_timeout, keras_backend=launch.backend, overlap=t.overlap, epoch=epoch,
            fit_id=self.fit_id, chunks=self.chunks,
        ))

    def run_stage(self, controller, plan: FitPlan, server, launch: Callable[[int, int], TaskLaunch], *,
                  on_started, on_retry, events: list[dict], fatal, stopped: Callable[[], bool]):
        t = self.trainer
        policy = ElasticPolicy(min_workers=t.min_workers, floor_timeout=t.retry_timeout, max_retries=t.max_retries)
        if self.rounds is not None:  # the outer momentum and the learning-rate factor apply to trained weights
            trained = {id(v) for v in plan.model.trainable_weights}
            self.rounds.trained = [id(v) in trained for v in plan.model.weights]
        tasks = launch(0, t.num_workers)
        stage = controller.run_elastic(
            plan.frame, self.chunks, range(plan.completed_epochs, t.epochs),
            lambda epoch: self.chunk_task(plan, server, tasks, epoch), server=server, policy=policy,
            description=self.description(plan.model.name), profile=plan.profile, on_started=on_started,
            stopped=stopped, events=events, fatal=fatal, watch=self._watch, retire=self.membership.retire,
            begun=lambda epoch: server.claimed_chunks(epoch) >= self.chunks,
            one_begun=lambda epoch: server.claimed_chunks(epoch) > 0,
            cold=ColdTasks(server.chunks_in_hand, self.membership.idle, server.fence_task))
        for record in stage.records:  # what the server counted, whatever attempts of the chunk committed it
            record["committed_batches"] = server.committed_batches(record["epoch"], record["chunk"])
        return stage

    def description(self, model_name: str) -> str:
        lo, hi = self.trainer.options.elastic
        return f"trainer: {model_name} {self.algorithm.describe()} elastic {lo}-{hi}"

    def summary(self, history: Any) -> str:
        joined = sum(1 for e in history.membership if e["event"] == "joined")
        left = sum(1 for e in history.membership if e["event"] == "left")
        return f"{super().summary(history)}, {joined} worker(s) joined, {left} left"


#: Each kind of fit by the name an algorithm declares (``Algorithm.fit_kind``).
KINDS: dict[str, type[FitKind]] = {PARAMETER_SERVER: ParameterServerFit, COLLECTIVE: CollectiveFit}


def fit_kind(trainer, algorithm: Algorithm) -> FitKind:
    """The kind of fit `algorithm` declares, for this `trainer` (an elastic one for ``num_workers=(min, max)``)."""
    if trainer.options.elastic is not None:
        return ElasticFit(trainer, algorithm)
    kind = KINDS.get(algorithm.fit_kind)
    if kind is None:
        raise ValueError(f"{algorithm.describe()} declares the kind of fit {algorithm.fit_kind!r}, which the trainer "
                         f"does not run. Known kinds: {', '.join(KINDS)}.")
    return kind(trainer, algorithm)
