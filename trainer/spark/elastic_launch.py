"""Launch seam of an elastic fit: one ordinary Spark job per epoch over the rows in chunks, no barrier stage.

A barrier stage needs all its slots at once for its whole life, and Spark
refuses one under dynamic allocation (SPARK-24942). An elastic fit
(``Trainer(num_workers=(min, max))``, ``trainer.fit.elastic``) instead cuts
its rows once into chunks that Spark keeps (``persist``, two copies on two
executors) and runs each epoch as one job of one task per chunk, so Spark's
own scheduling does the rest:

* **join**: an executor that registers mid-epoch takes chunks still pending;
  under dynamic allocation the pending tasks are what makes Spark ask for
  executors, so a fit starts on the first one granted;
* **leave**: a task lost with its executor is re-run by Spark on another one
  (a task retry, not a new stage), which reads the chunk's other copy; the
  re-run skips what the lost attempt committed
  (``trainer.runtime.ps_worker.chunk_task``);
* **hung**: an executor whose Python worker went silent (``watch()`` names
  it: the fit's own heartbeat, seconds) is declared lost to Spark and
  replaced, as Spark's heartbeat timeout would after ``spark.network.timeout``
  (120 s by default): its task runs again elsewhere (its chunk recomputed if
  the hung executor held it) instead of the epoch waiting for it, and if it
  wakes its task is refused (``trainer.ps.members``). Not on Spark Connect;
* a job that fails anyway on lost executors (a task lost on every attempt)
  runs again, up to `max_retries` times: chunks whose batches were all
  committed only report their epoch again;
* **no waiting for locality**: Spark's delay scheduling keeps a cached chunk
  for the executor that holds it for up to ``spark.locality.wait`` (3 s) while
  that executor keeps finishing tasks, so a joiner would get no chunk at all
  while the others keep up; the fit's jobs run with no locality wait (Spark
  has no per-job setting and refuses ``spark.conf.set`` of it: the
  SparkContext's own conf is set for the fit and put back after; not on Spark
  Connect, whose clients cannot reach it);
* **no idle slots between epochs**: once every chunk of an epoch has begun
  (``begun``) or, for a fit (``one_begun``), once one has and Spark has launched
  every task of the epoch's job (its status tracker; a joiner's task is
  launched seconds before its Python says HELLO; "one has begun" tells the
  chunks' job from the shuffle Spark may run as a job of its own before it),
  the next epoch's job starts beside it, so the slots its last chunks leave idle (a straggler, a joiner
  building its model, a re-run) train the next epoch's chunks. Not sooner: the
  next job's tasks would otherwise take slots before the epoch's own pending
  ones (Spark orders two jobs submitted together as it likes). At most
  `LOOKAHEAD` + 1 epochs run at once (a caller may allow more: an elastic
  search's rounds). An
  epoch's callbacks still run when its last chunk reports (and after the
  earlier epochs'): the later epochs' chunks already running follow their
  stop or new learning rate from their next exchange;
* **the floor**: while the cluster offers fewer than `min_workers` task slots
  for longer than `floor_timeout` seconds, the job is cancelled and the fit
  stops with `ClusterCapacityError` (its last checkpoint kept). Spark Connect
  clients cannot count slots: there the floor is not watched;
* **a cold chunk at the end**: Spark gives an executor that is still
  starting (a joiner, a hung one's replacement) a chunk as soon as it
  registers, and the chunk waits for its Python worker, imports and model
  (tens of seconds on a busy machine). Once every epoch's job has started and
  the only tasks left are such cold ones (running, their chunk in no task's
  hands) while a member idles, each is killed after `COLD_GRACE_S` (`ColdTasks`;
  a kill is not a failure: Spark runs the task again on a free slot, a warm
  one, or the same executor again, up to `COLD_KILLS` times; the server
  refuses the killed attempt's HELLO, should its process still finish
  starting). Not before the last epoch's job has started: until then the
  others train the next epochs' chunks while the joiner starts, and a kill
  would throw its start-up away. Not on Spark Connect;
* **the end**: once training stopped, the jobs still running get
  `WIND_DOWN_S` to end (their running tasks were told to stop); those whose
  tasks still wait for a slot are then cancelled.

It knows nothing about Keras or the parameter server: tasks come from
``make_task(epoch)``.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import functools
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from pyspark.sql import DataFrame

from trainer.errors import ClusterCapacityError, TrainingFailedError
from trainer.spark.connect import is_connect
from trainer.spark.launch import (all_launched, available_slots, cancel_tagged, is_infrastructure_failure, kill_task,
                                  newest_stage, run_job, stage_running_tasks, tasks_launched)
from trainer.spark.resources import in_one_process

log = logging.getLogger("trainer.spark")


@dataclass
class ElasticPolicy:
    """The floor and the retries of an elastic fit's jobs (the module docstring)."""

    min_workers: int
    floor_timeout: float
    max_retries: int


@dataclass
class EpochJobs:
    """What `run_epoch_jobs` returns: the rows of every epoch's job, and when each epoch's job ran."""

    rows: list = field(default_factory=list)
    epochs: list[dict[str, Any]] = field(default_factory=list)


class Floor:
    """Raises ClusterCapacityError once the slots stayed under the minimum longer than the timeout."""

    def __init__(self, slots: Callable[[], int | None], policy: ElasticPolicy, events: list[dict]) -> None:
        self.slots, self.policy, self.events = slots, policy, events  # slots(): None when Spark cannot tell
        self.below_since: float | None = None

    def check(self) -> None:
        slots = self.slots()
        if slots is None or slots >= self.policy.min_workers:
            self.below_since = None
            return
        now = time.monotonic()
        if self.below_since is None:
            self.below_since = now
            self.events.append({"time": time.time(), "event": "below_minimum", "slots": slots,
                                "min_workers": self.policy.min_workers})
        elif now - self.below_since > self.policy.floor_timeout:
            raise ClusterCapacityError(
                f"The cluster offered {slots} task slot(s) for {self.policy.floor_timeout:.0f} s, fewer than the "
                f"elastic fit's minimum of {self.policy.min_workers} workers: training stops. The parameter "
                "server's last state is in the checkpoint if checkpoint_dir was set; resume with fit(df, "
                "resume_from=...) once the cluster is back, or lower the minimum (num_workers=(min, max)).",
                slots=slots)


#: Seconds the tasks left of a fit's last epochs may all stay cold (`ColdTasks`) before they are killed: longer than a
#: warm task takes from its launch to its HELLO (tenths of a second), shorter than a new process's start.
COLD_GRACE_S = 3.0
#: Times a chunk's task is killed for being cold: Spark may give the re-run to the same starting executor.
COLD_KILLS = 3


class ColdTasks:
    """Which tasks to kill at a fit's end for running on an executor still starting (the module docstring).

    Args:
        in_hand: ``in_hand(epoch)``, the chunks of `epoch` a connected task holds (said HELLO for).
        idle: ``idle()``, how many members are alive with no task training.
        fence: ``fence(task)``, called before a task is killed: its HELLO is refused from then on (a killed
            task's Python worker may still finish starting).
    """

    def __init__(self, in_hand: Callable[[int], set[int]], idle: Callable[[], int],
                 fence: Callable[[int], Any] = lambda task: None) -> None:
        self.in_hand, self.idle, self.fence = in_hand, idle, fence
        self.since: dict[int, float] = {}  # task id -> when it was first seen cold with nothing else running
        self.killed: set[int] = set()
        self.kills: collections.Counter[tuple[int, int]] = collections.Counter()  # (epoch, chunk) -> kills

    def pick(self, running: dict[int, list[tuple[int, int]]], now: float) -> list[tuple[int, int, int]]:
        """The (epoch, task id, chunk) to kill now, given the (task id, chunk) running of each epoch's job: none
        while a task holds its chunk or no member idles; then those cold for `COLD_GRACE_S`."""
        tasks = [(epoch, task, chunk) for epoch, pairs in running.items() for task, chunk in pairs
                 if task not in self.killed]
        held = {epoch: self.in_hand(epoch) for epoch in running}
        if not tasks or any(chunk in held[epoch] for epoch, _, chunk in tasks) or self.idle() < 1:
            self.since.clear()
            return []
        for _, task, _ in tasks:
            self.since.setdefault(task, now)
        return [(epoch, task, chunk) for epoch, task, chunk in tasks
                if now - self.since[task] >= COLD_GRACE_S and self.kills[(epoch, chunk)] < COLD_KILLS]

    def killed_one(self, epoch: int, task: int, chunk: int) -> None:
        """Spark took the kill of `task` (chunk `chunk` of `epoch`)."""
        self.killed.add(task)
        self.kills[(epoch, chunk)] += 1


def run_epoch_jobs(frame: DataFrame, chunks: int, epochs: range, make_task: Callable[[int], Callable], schema: str,
                   *, policy: ElasticPolicy, description: str, profile: Any = None,
                   stopped: Callable[[], bool] = lambda: False,
                   fatal: Callable[[], BaseException | None] = lambda: None,
                   events: list[dict] | None = None, watch: Callable[[], Any] = lambda: None,
                   retire: Callable[[set[str]], Any] = lambda executors: None,
                   begun: Callable[[int], bool] = lambda epoch: False, lookahead: int = 0,
                   one_begun: Callable[[int], bool] | None = None, cold: ColdTasks | None = None,
                   poll_s: float = 0.5) -> EpochJobs:
    """Run one job per epoch of `epochs` over `frame` cut into `chunks` partitions (the module docstring);
    ``stopped()`` after an epoch ends the loop (a callback stopped the fit); ``begun(epoch)`` says every chunk
    of `epoch` has started, so the next epoch's job may start beside it (so may ``one_begun(epoch)``, a chunk of it
    has, once Spark launched every task of its job); ``watch()`` runs every `poll_s` seconds
    while a job runs (the members' heartbeats) and returns the members that went silent, each a dict whose
    ``"executor"`` (when known) is released (`release_executor`; ``"executor_released"`` says whether Spark took
    it); ``retire(executors)`` hears the executors being decommissioned (`decommissioned_executors`); at most
    `lookahead` (0: `LOOKAHEAD`) jobs start while an earlier one runs; `cold` kills the last epochs' cold tasks."""
    from pyspark import StorageLevel

    spark = frame.sparkSession
    lookahead = lookahead or LOOKAHEAD
    events = [] if events is None else events
    floor = Floor(lambda: available_slots(spark, profile), policy, events)
    released: set[str] = set()
    retired: set[str] = set()
    tag = f"trainer-elastic-{uuid.uuid4().hex[:12]}"

    def launched(epoch: int) -> bool:
        return one_begun is not None and one_begun(epoch) and bool(tasks_launched(spark, _epoch_tag(tag, epoch)))

    def move_cold() -> None:  # once every epoch's job has started (the module docstring)
        now, tasks = time.monotonic(), {}
        for epoch in running:
            stage = newest_stage(spark, _epoch_tag(tag, epoch))
            listed = stage_running_tasks(spark, stage) if stage is not None and all_launched(stage) else None
            if listed is None:  # a task waits for a slot, or Spark cannot tell
                return
            tasks[epoch] = listed
        for epoch, task, chunk in cold.pick(tasks, now):
            cold.fence(task)
            if kill_task(spark, task, f"trainer: chunk {chunk} of epoch {epoch + 1} waited on a starting executor "
                                      "while the others idled"):
                cold.killed_one(epoch, task, chunk)
                events.append({"time": time.time(), "event": "cold_task_killed", "epoch": epoch, "chunk": chunk,
                               "task": task})
                log.info("Chunk %d of epoch %d ran on an executor still starting: killed for a warm one", chunk,
                         epoch + 1)

    def on_wait() -> None:
        for silent in watch() or ():
            executor = silent.get("executor")
            if executor is not None and executor not in released:
                released.add(executor)
                silent["executor_released"] = release_executor(spark, executor, silent["why"])
        leaving = decommissioned_executors(spark) - retired
        if leaving:
            retired.update(leaving)
            retire(leaving)
        floor.check()

    # Two copies of each chunk, on two executors: a lost executor's chunks are read from the other copy, not
    # recomputed through the shuffle, whose blocks on the lost executor a reader would wait for (fetch retries).
    # local[N] is one executor, the driver's: nowhere to put a copy (Spark would warn of each block).
    cut = frame.repartition(chunks).persist(StorageLevel.MEMORY_AND_DISK if in_one_process(spark)
                                            else StorageLevel.MEMORY_AND_DISK_2)
    done, order = EpochJobs(), epochs  # a range: an elastic search's is long
    running: dict[int, tuple[concurrent.futures.Future, float]] = {}  # epoch -> its job, when it started
    with _no_locality_wait(spark), contextlib.ExitStack() as stack:
        stack.callback(cut.unpersist)
        pool = stack.enter_context(concurrent.futures.ThreadPoolExecutor(lookahead + 1,
                                                                         thread_name_prefix="trainer-epoch"))

        def start(epoch: int) -> None:
            job = functools.partial(_epoch_job, cut, epoch, make_task(epoch), schema, policy,
                                    f"{description} epoch {epoch + 1}", profile, fatal, events, tag)
            running[epoch] = (pool.submit(job), time.time())

        try:
            for i, epoch in enumerate(order):
                if epoch not in running:
                    start(epoch)
                ahead = order[i:i + lookahead + 1]
                job, started = running[epoch]
                while not _finished(job, poll_s):
                    on_wait()
                    for before, after in zip(ahead, ahead[1:]):  # its tasks take the slots left idle
                        if after not in running and before in running and (begun(before) or launched(before)):
                            start(after)
                    if cold is not None and order[-1] in running:
                        move_cold()
                running.pop(epoch)
                done.rows.extend(job.result())
                done.epochs.append({"epoch": epoch, "start": started, "end": time.time()})
                if stopped():  # the next epoch's tasks, if they started, were told to stop: they end soon
                    _wind_down(spark, tag, [job for job, _ in running.values()], done.rows)
                    break
        except BaseException:
            cancel_tagged(spark, tag)
            raise
    return done


#: Epochs whose jobs may start while an earlier one still runs (its last chunks: a straggler, a joiner building its
#: model, a re-run): two, so that a joiner's start-up (several seconds) does not idle the others on short epochs.
LOOKAHEAD = 2


#: Seconds the jobs still running when a fit or a search stopped get to end before they are cancelled: their started
#: tasks were told to stop; a task still pending (waiting for an executor) would only start to be told the same.
WIND_DOWN_S = 5.0


def _wind_down(spark, tag: str, jobs: list[concurrent.futures.Future], rows: list) -> None:
    """The rows of `jobs` that end within `WIND_DOWN_S`; the others are cancelled (their rows lost)."""
    finished, pending = concurrent.futures.wait(jobs, timeout=WIND_DOWN_S)
    if pending:
        log.info("Cancelling %d job(s) whose tasks still wait for a slot: training has ended", len(pending))
        cancel_tagged(spark, tag)
        concurrent.futures.wait(pending)
    for job in jobs:
        if job in finished or job.exception() is None:
            rows.extend(job.result())


def _epoch_tag(tag: str, epoch: int) -> str:
    return f"{tag}-epoch-{epoch}"


def _finished(job: concurrent.futures.Future, timeout: float) -> bool:
    try:
        job.exception(timeout=timeout)
    except concurrent.futures.TimeoutError:
        return False
    return True


def _epoch_job(cut: DataFrame, epoch: int, task: Callable, schema: str, policy: ElasticPolicy, description: str,
               profile: Any, fatal: Callable[[], BaseException | None], events: list[dict], tag: str) -> list:
    """One epoch's job, run again after lost executors (the module docstring); its rows."""
    for attempt in range(policy.max_retries + 1):
        try:
            return run_job(cut, None, task, schema, description=description, profile=profile, barrier=False, tag=tag,
                           job_tag=_epoch_tag(tag, epoch))
        except TrainingFailedError as exc:
            problem = fatal()
            if problem is not None:
                raise problem from exc
            retry = attempt < policy.max_retries and is_infrastructure_failure(exc.__cause__)
            events.append({"time": time.time(), "event": "epoch_job_failed", "epoch": epoch, "attempt": attempt,
                           "error": str(exc), "retry": retry})
            if not retry:
                raise
            log.warning("Epoch %d's job failed (%s); running it again", epoch + 1, exc)
    raise AssertionError("unreachable: the last attempt either returns or raises")


def release_executor(spark, executor: str, why: str) -> bool:
    """Declare `executor` lost and have Spark replace it, what Spark's own heartbeat timeout does (its tasks are
    re-run elsewhere, its blocks and shuffle files forgotten); False on Spark Connect or where Spark refused."""
    if is_connect(spark):
        return False
    try:
        sc, jvm = spark.sparkContext._jsc.sc(), spark.sparkContext._jvm
        reason = jvm.org.apache.spark.scheduler.ExecutorProcessLost(f"trainer: {why}", jvm.scala.Option.empty(),
                                                                    False)
        sc.taskScheduler().executorLost(executor, reason)
        sc.killAndReplaceExecutor(executor)
    except Exception as exc:  # a Spark whose internals moved: the hung task then waits for Spark's own timeout
        log.warning("Could not release hung executor %s (%s); Spark's network timeout will", executor, exc)
        return False
    log.info("Executor %s released: %s", executor, why)
    return True


def decommissioned_executors(spark) -> set[str]:
    """The executors Spark is decommissioning (a graceful leave: they finish their running tasks and take no new
    ones); empty on Spark Connect or where Spark cannot tell."""
    if is_connect(spark):
        return set()
    try:
        sc = spark.sparkContext._jsc.sc()
        scheduler, ids = sc.taskScheduler(), sc.getExecutorIds()
        return {ids.apply(i) for i in range(ids.size())
                if scheduler.getExecutorDecommissionState(ids.apply(i)).isDefined()}
    except Exception as exc:  # a Spark whose internals moved: a decommissioned executor then leaves when it exits
        log.debug("Could not read the executors' decommission state (%s)", exc)
        return set()


LOCALITY_WAIT = "spark.locality.wait"
#: The fit's locality wait: 0 here (see the module docstring).
ELASTIC_LOCALITY_WAIT = "0s"


@contextlib.contextmanager
def _no_locality_wait(spark):
    """``spark.locality.wait`` at 0 for the jobs started inside, then as it was (the module docstring)."""
    if is_connect(spark):
        yield
        return
    conf = spark.sparkContext._jsc.sc().conf()
    before = conf.get(LOCALITY_WAIT) if conf.contains(LOCALITY_WAIT) else None
    conf.set(LOCALITY_WAIT, ELASTIC_LOCALITY_WAIT)
    try:
        yield
    finally:
        if before is None:
            conf.remove(LOCALITY_WAIT)
        else:
            conf.set(LOCALITY_WAIT, before)
