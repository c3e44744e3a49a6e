"""Launch seam: gang-scheduled Spark barrier stages, their retries and the checks around them.

* `wait_for_slots` fails fast with a clear message when the cluster cannot run
  N tasks at once (a barrier stage would otherwise wait for slots forever).
* `run_job` runs ``frame.repartition(N).mapInArrow(fn, barrier=True)``
  (with a ResourceProfile when tasks need GPUs; an elastic fit's jobs are not
  barrier jobs, ``trainer.spark.elastic_launch``) under a job tag from a helper
  thread, so that the calling thread can show progress and a Ctrl-C cancels
  the job at once.
* `run_stage_with_retries` re-runs a failed barrier stage after lost executors
  (Spark does not retry a failed barrier result stage), waiting for the lost
  slots and continuing on fewer workers when the policy allows it. The trainer
  and model selection both launch through it.
* `error_summary` turns a Py4J error with its Java and Python traces into the
  one line a user needs.

Every call here works on classic and Spark Connect sessions (``spark.conf``,
job tags); where they differ, ``trainer.spark.connect`` decides. It knows
nothing about algorithms or Keras.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from pyspark.sql import DataFrame, SparkSession

from trainer.errors import ClusterCapacityError, TrainingFailedError
from trainer.spark.connect import is_connect, probe_slots
from trainer.spark.resources import GPU
from trainer.versions import check_spark

log = logging.getLogger("trainer.spark")


def available_slots(spark: SparkSession, profile: Any = None) -> int | None:
    """Tasks of `profile` (default: the session's default resources) the cluster can run at once; None on
    Spark Connect, whose clients cannot ask the scheduler (`wait_for_slots` probes there)."""
    if is_connect(spark):
        return None
    jsc = spark.sparkContext._jsc.sc()
    manager = jsc.resourceProfileManager()
    if profile is None:
        return int(jsc.maxNumConcurrentTasks(manager.defaultResourceProfile()))
    manager.addResourceProfile(profile._java_resource_profile)  # idempotent; the scheduler must know it
    return int(jsc.maxNumConcurrentTasks(profile._java_resource_profile))


def wait_for_slots(spark: SparkSession, needed: int, timeout: float, profile: Any = None) -> int | None:
    """Wait up to `timeout` s for `needed` concurrent task slots of `profile`; raise ClusterCapacityError.

    Returns the slots counted (None on Spark Connect, where a barrier probe only says yes or no). Raises
    UnsupportedVersionError first when the session's Spark is older than the supported floor.
    """
    check_spark(spark)
    if is_connect(spark):
        if not probe_slots(spark, needed, profile, timeout):
            raise ClusterCapacityError(_capacity_message(spark, needed, None, timeout, profile))
        return None
    deadline = time.monotonic() + timeout
    while True:
        slots = available_slots(spark, profile)
        if slots >= needed or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    if slots < needed:
        raise ClusterCapacityError(_capacity_message(spark, needed, slots, timeout, profile), slots=slots)
    return slots


def _capacity_message(spark: SparkSession, needed: int, slots: int | None, timeout: float, profile: Any) -> str:
    conf = spark.conf
    offered = "could not start them" if slots is None else f"offers {slots}"
    settings = (f"spark.executor.cores={conf.get('spark.executor.cores', '?')}, "
                f"spark.task.cpus={conf.get('spark.task.cpus', '1')}")
    gpus = (profile.taskResources.get(GPU).amount if profile is not None and GPU in profile.taskResources else 0)
    if gpus:
        settings += (f", {gpus:g} GPU(s) per task, spark.executor.resource.gpu.amount="
                     f"{conf.get('spark.executor.resource.gpu.amount', 'unset')}")
    return (
        f"num_workers={needed} needs {needed} task slots at the same time, but the cluster at "
        f"{conf.get('spark.master', '?')} {offered} ({settings}) after waiting {timeout:.0f} s. Use "
        f"num_workers<={max(slots or 1, 1)}, add workers, cores{' or GPUs' if gpus else ''} (e.g. "
        "LocalCluster(workers=N) or `make up WORKERS=N`), or raise slot_timeout if executors are still starting."
    )


_PY_ERROR = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b:?.*)$", re.MULTILINE)
_INFRA_MARKERS = (
    "ExecutorLostFailure", "exited unexpectedly", "Python worker exited", "Connection reset",
    "ConnectionClosed", "ConnectionResetError", "BrokenPipeError", "Worker lost", "executor lost",
    "ConnectionRefusedError", "crashed", "FetchFailed", "ExecutorDeadException", "TaskKilled",
)


def error_summary(error: BaseException) -> str:
    """The innermost Python exception line of an executor failure, else Spark's reason for
    the failed stage (a lost executor), else the first line."""
    text = str(error)
    if "Traceback (most recent call last)" in text:
        tail = text.split("Traceback (most recent call last)")[-1]
        matches = [m for m in _PY_ERROR.findall(tail) if not m.startswith(("py4j", "org.apache"))]
        if matches:
            return matches[0].strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for marker in ("ExecutorLostFailure", "Job aborted due to stage failure"):  # a JVM-side cause
        found = next((line for line in lines if marker in line), None)
        if found:
            return found[found.index(marker):][:500]
    return lines[0][:2000] if lines else type(error).__name__


def is_infrastructure_failure(error: BaseException) -> bool:
    """True for lost executors, killed Python workers and dropped connections (worth a retry)."""
    text = str(error)
    return any(marker in text for marker in _INFRA_MARKERS)


def run_job(
    frame: DataFrame,
    num_workers: int | None,
    task: Callable[[Any], Any],
    schema: str,
    *,
    description: str,
    on_wait: Callable[[], None] | None = None,
    poll_s: float = 0.5,
    profile: Any = None,
    barrier: bool = True,
    tag: str | None = None,
    job_tag: str | None = None,
) -> list:
    """Collect ``frame.repartition(N).mapInArrow(task, schema, barrier=barrier, profile=profile)`` (`frame`'s own
    partitions when `num_workers` is None); Ctrl-C, or an error `on_wait` raises, cancels it (job tags: `tag`, or
    one of its own; `cancel_tagged` cancels them from another thread). `job_tag` also tags the job for
    `tasks_launched` (classic sessions only)."""
    from pyspark import InheritableThread

    spark = frame.sparkSession
    tag = tag or f"trainer-{uuid.uuid4().hex[:12]}"
    outcome: dict[str, Any] = {}
    options = {} if profile is None else {"profile": profile}  # pyspark 3.5 has no `profile`

    def target() -> None:
        _tag_jobs(spark, tag, description)
        if job_tag is not None and not is_connect(spark):
            spark.sparkContext.addJobTag(job_tag)
        try:
            parts = frame if num_workers is None else frame.repartition(num_workers)
            stage = parts.mapInArrow(task, schema, barrier=barrier, **options)
            outcome["rows"] = stage.collect()
        except BaseException as exc:  # handed to the calling thread
            outcome["error"] = exc
        finally:
            _untag_jobs(spark, tag)
            if job_tag is not None and not is_connect(spark):
                spark.sparkContext.removeJobTag(job_tag)

    thread = InheritableThread(target=target, name=tag, daemon=True,
                               **({"session": spark} if is_connect(spark) else {}))
    thread.start()
    try:
        while thread.is_alive():
            thread.join(poll_s)
            if on_wait is not None:
                on_wait()
    except BaseException:
        log.warning("Interrupted: cancelling the Spark jobs tagged %s", tag)
        cancel_tagged(spark, tag)
        thread.join(timeout=30)
        raise
    if "error" in outcome:
        error = outcome["error"]
        raise TrainingFailedError(f"Training failed on a worker: {error_summary(error)}") from error
    return outcome["rows"]


def _job_tags(spark: SparkSession) -> bool:
    # Job tags work on Spark Connect and, from pyspark 4.0 on, on classic sessions; pyspark 3.5's
    # classic sessions only have job groups.
    import pyspark

    return is_connect(spark) or int(pyspark.__version__.split(".")[0]) >= 4


def _tag_jobs(spark: SparkSession, tag: str, description: str) -> None:
    """Tag the jobs this thread starts (a job group on pyspark 3.5's classic sessions)."""
    if not _job_tags(spark):
        spark.sparkContext.setJobGroup(tag, description, interruptOnCancel=True)
        return
    spark.addTag(tag)
    if not is_connect(spark):
        spark.sparkContext.setJobDescription(description)


def _untag_jobs(spark: SparkSession, tag: str) -> None:
    if _job_tags(spark):
        spark.removeTag(tag)


def newest_stage(spark: SparkSession, job_tag: str) -> Any:
    """The status (pyspark's ``SparkStageInfo``) of the last stage of the newest job tagged `job_tag` (`run_job`'s),
    or None: no such job yet, Spark Connect (no status tracker), or a Spark whose tracker moved. (A query may run a
    shuffle as a job of its own before its result's: the caller tells which job it sees.)"""
    if is_connect(spark):
        return None
    try:
        sc = spark.sparkContext
        jobs = list(sc._jsc.sc().statusTracker().getJobIdsForTag(job_tag))
        job = sc.statusTracker().getJobInfo(max(jobs)) if jobs else None
        return sc.statusTracker().getStageInfo(max(job.stageIds)) if job is not None and job.stageIds else None
    except Exception as exc:  # a Spark whose tracker moved: the caller's other signal decides
        log.debug("Could not read the status of the jobs tagged %s (%s)", job_tag, exc)
        return None


def tasks_launched(spark: SparkSession, job_tag: str) -> bool | None:
    """Whether every task of the newest job tagged `job_tag` has been launched: its last stage (`newest_stage`)
    has as many tasks running or done as it has; None on Spark Connect, where Spark cannot tell."""
    if is_connect(spark):
        return None
    stage = newest_stage(spark, job_tag)
    return stage is not None and all_launched(stage)


def all_launched(stage: Any) -> bool:
    """Whether a stage (`newest_stage`'s) has as many tasks running or done as it has: none waits for a slot."""
    return stage.numActiveTasks + stage.numCompletedTasks >= stage.numTasks


def running_tasks(spark: SparkSession, job_tag: str) -> list[tuple[int, int]] | None:
    """The (task id, partition) of every task running in the last stage of the newest job tagged `job_tag`, as
    Spark's status store has them (it may lag the scheduler by a few milliseconds); None on Spark Connect or where
    Spark cannot tell."""
    return stage_running_tasks(spark, newest_stage(spark, job_tag))


def stage_running_tasks(spark: SparkSession, stage: Any) -> list[tuple[int, int]] | None:
    """`running_tasks` of a stage already read (`newest_stage`'s; None gives None)."""
    if stage is None:
        return None
    try:
        tasks = spark.sparkContext._jsc.sc().statusStore().taskList(stage.stageId, stage.currentAttemptId, 1 << 16)
        found = [tasks.apply(i) for i in range(tasks.size())]
        return [(int(t.taskId()), int(t.index())) for t in found if t.status() == "RUNNING"]
    except Exception as exc:  # a Spark whose status store moved: nothing is killed
        log.debug("Could not list the running tasks of stage %s (%s)", stage.stageId, exc)
        return None


def kill_task(spark: SparkSession, task_id: int, reason: str) -> bool:
    """Kill one attempt of a task (Spark runs the task again, on whichever free slot it offers first: a kill is not
    a failure); False on Spark Connect or where Spark refused."""
    if is_connect(spark):
        return False
    try:
        return bool(spark.sparkContext._jsc.sc().killTaskAttempt(task_id, True, reason))
    except Exception as exc:
        log.debug("Could not kill task %d (%s)", task_id, exc)
        return False


def cancel_tagged(spark: SparkSession, tag: str) -> None:
    """Cancel the running jobs tagged `tag` (`run_job`'s)."""
    if _job_tags(spark):
        spark.interruptTag(tag)
    else:
        spark.sparkContext.cancelJobGroup(tag)


@dataclass(frozen=True)
class RetryPolicy:
    """How `run_stage_with_retries` re-runs a barrier stage that lost executors.

    Args:
        max_retries: Integer. Re-runs after the first attempt.
        retry_timeout: Float. Seconds a retry waits for all the workers' slots
            (Spark standalone relaunches a killed executor in seconds; a lost
            machine or container may never come back).
        min_workers: Integer or None. After `retry_timeout`, continue on the
            slots left if there are at least this many; None never shrinks.
    """

    max_retries: int = 2
    retry_timeout: float = 60.0
    min_workers: int | None = None


@dataclass
class StageRun:
    """What `run_stage_with_retries` returns: the rows of the attempt that succeeded."""

    rows: list
    workers: int
    attempts: int
    events: list[dict] = field(default_factory=list)


def run_stage_with_retries(
    frame: DataFrame,
    num_workers: int,
    make_task: Callable[[int, int], Callable[[Any], Any]],
    schema: str,
    *,
    policy: RetryPolicy,
    description: str,
    on_retry: Callable[[int], None] | None = None,
    fatal: Callable[[], BaseException | None] | None = None,
    events: list[dict] | None = None,
    profile: Any = None,
) -> StageRun:
    """Run one barrier stage of `num_workers` tasks, re-running it after lost executors.

    ``make_task(attempt, workers)`` gives the task function of an attempt;
    ``on_retry(workers)`` runs before a re-run (the driver-side services learn
    the new number of workers); ``fatal()`` may return the driver's own error,
    raised instead of retrying. Python errors in a task (a bug in the model or
    the data) are never retried. Failed attempts and changes in the number of
    workers are appended to `events` (``attempt_failed``, ``workers_changed``).
    """
    events = [] if events is None else events
    workers = num_workers
    for attempt in range(policy.max_retries + 1):
        try:
            rows = run_job(frame, workers, make_task(attempt, workers), schema,
                                   description=f"{description} attempt {attempt}", profile=profile)
        except TrainingFailedError as exc:
            problem = fatal() if fatal is not None else None
            if problem is not None:
                raise problem from exc
            retry = attempt < policy.max_retries and is_infrastructure_failure(exc.__cause__)
            events.append({"time": time.time(), "event": "attempt_failed", "attempt": attempt,
                           "error": str(exc), "retry": retry})
            if not retry:
                raise
            log.warning("Attempt %d failed (%s); re-running the stage", attempt, exc)
            slots = _slots_for_retry(frame.sparkSession, num_workers, policy, profile)
            if slots != workers:
                log.warning("Continuing on %d workers (was %d)", slots, workers)
                events.append({"time": time.time(), "event": "workers_changed", "from": workers, "to": slots})
                workers = slots
            if on_retry is not None:
                on_retry(workers)
            continue
        return StageRun(rows=rows, workers=workers, attempts=attempt + 1, events=events)
    raise AssertionError("unreachable: the last attempt either returns or raises")


def _slots_for_retry(spark: SparkSession, num_workers: int, policy: RetryPolicy, profile: Any) -> int:
    """Wait for `num_workers` slots; after `retry_timeout` continue on what is left (>= min_workers)."""
    try:
        wait_for_slots(spark, num_workers, policy.retry_timeout, profile)
        return num_workers
    except ClusterCapacityError as error:
        if policy.min_workers is None:
            raise
        slots = error.slots if error.slots is not None else available_slots(spark, profile)
        if slots is None:
            raise ClusterCapacityError(
                f"After losing executors the {num_workers} task slot(s) did not come back within retry_timeout="
                f"{policy.retry_timeout:.0f} s, and a Spark Connect client cannot count the slots left to go on "
                "with fewer workers (min_workers): training stops. Resume with fit(df, resume_from=...) from "
                "checkpoint_dir once the cluster is back, or use a classic SparkSession to shrink instead.",
            ) from None
        if slots < policy.min_workers:
            raise ClusterCapacityError(
                f"After losing executors only {slots} task slot(s) came back within retry_timeout="
                f"{policy.retry_timeout:.0f} s, fewer than min_workers={policy.min_workers}: training stops. "
                "The parameter server's last state is in the checkpoint if checkpoint_dir was set; "
                "resume with fit(df, resume_from=...) once the cluster is back.",
                slots=slots,
            ) from None
        return slots

