"""Launch seam: gang-scheduled Spark barrier stages and the checks around them.

* `wait_for_slots` fails fast with a clear message when the cluster cannot run
  N tasks at once (a barrier stage would otherwise wait for slots forever).
* `run_barrier_job` runs ``frame.repartition(N).mapInArrow(fn, barrier=True)``
  in a Spark job group from a helper thread, so that the calling thread can
  show progress and a Ctrl-C cancels the job at once.
* `error_summary` turns a Py4J error with its Java and Python traces into the
  one line a user needs.

It knows nothing about update rules or Keras.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Any, Callable

from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("trainer.launch")


class ClusterCapacityError(RuntimeError):
    """The cluster cannot run the requested number of workers at the same time.

    `slots` is the number of concurrent task slots last seen (None when unknown).
    """

    def __init__(self, message: str, slots: int | None = None) -> None:
        super().__init__(message)
        self.slots = slots


class TrainingFailedError(RuntimeError):
    """A worker task failed; the message carries the root cause from the executor."""


def available_slots(spark: SparkSession) -> int:
    """Number of tasks the cluster can run concurrently right now (all executors)."""
    jsc = spark.sparkContext._jsc.sc()
    profile = jsc.resourceProfileManager().defaultResourceProfile()
    return int(jsc.maxNumConcurrentTasks(profile))


def wait_for_slots(spark: SparkSession, needed: int, timeout: float) -> int:
    """Wait up to `timeout` s for `needed` concurrent task slots; raise ClusterCapacityError."""
    deadline = time.monotonic() + timeout
    while True:
        slots = available_slots(spark)
        if slots >= needed or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    if slots < needed:
        sc = spark.sparkContext
        cores = sc.getConf().get("spark.executor.cores", "?")
        task_cpus = sc.getConf().get("spark.task.cpus", "1")
        raise ClusterCapacityError(
            f"num_workers={needed} needs {needed} task slots at the same time, but the cluster at "
            f"{sc.master} offers {slots} (spark.executor.cores={cores}, spark.task.cpus={task_cpus}) "
            f"after waiting {timeout:.0f} s. Use num_workers<={max(slots, 1)}, add workers or cores "
            "(e.g. LocalCluster(workers=N) or `make up WORKERS=N`), or raise slot_timeout if executors "
            "are still starting.",
            slots=slots,
        )
    return slots


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


def run_barrier_job(
    frame: DataFrame,
    num_workers: int,
    task: Callable[[Any], Any],
    schema: str,
    *,
    description: str,
    on_wait: Callable[[], None] | None = None,
    poll_s: float = 0.5,
) -> list:
    """Collect ``frame.repartition(N).mapInArrow(task, schema, barrier=True)``; Ctrl-C cancels it."""
    from pyspark import InheritableThread

    sc = frame.sparkSession.sparkContext
    group = f"trainer-{uuid.uuid4().hex[:12]}"
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            sc.setJobGroup(group, description, interruptOnCancel=True)
            stage = frame.repartition(num_workers).mapInArrow(task, schema, barrier=True)
            outcome["rows"] = stage.collect()
        except BaseException as exc:  # handed to the calling thread
            outcome["error"] = exc

    thread = InheritableThread(target=target, name=group, daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(poll_s)
            if on_wait is not None:
                on_wait()
    except BaseException:
        log.warning("Interrupted: cancelling Spark job group %s", group)
        sc.cancelJobGroup(group)
        thread.join(timeout=30)
        raise
    if "error" in outcome:
        error = outcome["error"]
        raise TrainingFailedError(f"Training failed on a worker: {error_summary(error)}") from error
    return outcome["rows"]
