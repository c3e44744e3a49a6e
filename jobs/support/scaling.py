"""Scaling benchmarks shared by the jobs: N workers vs 1 worker vs plain Keras.

* `cluster_session` gives a SparkSession on a given master URL, or on an
  embedded `LocalCluster` large enough for the biggest worker count.
* `plain_keras_fit` trains the same model with ``model.fit`` in a fresh
  process limited to the same number of threads as one worker: the
  framework-overhead baseline; `plain_keras_side_by_side` runs N Keras
  processes at once on the N workers' shares of the rows, fed as workers
  are (what N processes cost each other on the machine, no exchange).
* `fitted_row` / `baseline_row` / `with_ratios` turn runs into result rows
  for `trainer_jobs.support.report` (time, epoch time, samples/s, speed-up,
  efficiency, overhead vs plain Keras and vs N processes side by side,
  updates, bytes, timing validity).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
from typing import Any, Callable, Iterator

import numpy as np

from trainer import LocalCluster, spark_session
from trainer_jobs.support.plain_keras import epoch_timer, hold_to_cores, run_single
from trainer_jobs.support.report import markdown_table, speedup_rows


@contextlib.contextmanager
def cluster_session(master: str | None, workers: int, cores_per_worker: int = 1,
                    app_name: str = "trainer-job", wait_for_workers: bool = False) -> Iterator[Any]:
    """SparkSession on `master`, or on an embedded LocalCluster with `workers` workers.

    On `master` the job asks for the cores of its largest run only (``spark.cores.max``), leaving the rest of a
    shared cluster to others; with `wait_for_workers` it returns once the executors of `workers` task slots have
    registered (at most 180 s), for a job whose first step uses them all."""
    if master:
        executors = -(-workers // cores_per_worker) if wait_for_workers else 0  # cores_per_worker slots each
        spark = spark_session(master, app_name, cores_per_worker=cores_per_worker, expected_executors=executors,
                              executor_timeout=180.0, **{"spark.cores.max": str(workers * cores_per_worker)})
        print(f"Spark master {master}", flush=True)
        try:
            yield spark
        finally:
            spark.stop()
        return
    with LocalCluster(workers=workers, cores_per_worker=cores_per_worker) as cluster:
        spark = cluster.session(app_name)
        print(f"embedded Spark cluster up: {workers} worker(s) x {cores_per_worker} core(s), UI {cluster.ui_url}",
              flush=True)
        yield spark


def timing_valid(workers: int, cores_per_worker: int, master: str | None) -> bool:
    """False when an embedded run time-shares more worker cores than this machine has."""
    return bool(master) or workers * cores_per_worker <= (os.cpu_count() or 1)


def _baseline_child(builder, x, y, epochs, batch_size, threads, backend, seed, queue) -> None:
    hold_to_cores(threads, backend)  # and Keras started quietly, after the thread settings
    import keras

    keras.utils.set_random_seed(seed)
    model = builder()
    times: list[float] = []
    started = time.perf_counter()
    history = model.fit(x, y, batch_size=batch_size, epochs=epochs, verbose=0, callbacks=[epoch_timer(times)])
    queue.put({"train_s": time.perf_counter() - started, "epoch_times": times,
               "loss": [float(v) for v in history.history["loss"]], "weights": model.get_weights()})


def plain_keras_fit(builder: Callable[[], Any], x: np.ndarray, y: np.ndarray, *, epochs: int, batch_size: int,
                    threads: int = 1, seed: int = 0) -> dict[str, Any]:
    """Train `builder()` with plain ``model.fit`` in a fresh process using `threads` threads, Keras seeded with `seed`.

    Returns train_s, epoch_times, loss and the trained weights. A separate
    process is needed because TensorFlow fixes its thread pools at start-up.
    """
    import keras  # deferred: TensorFlow starts only when a job runs

    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_baseline_child, args=(builder, x, y, epochs, batch_size, threads,
                                                     keras.backend.backend(), seed, queue))
    proc.start()
    try:
        result = queue.get()
    finally:
        proc.join()
    return result


def plain_keras_side_by_side(builder: Callable[[], Any], x: np.ndarray, y: np.ndarray, *, copies: int, epochs: int,
                             batch_size: int, threads: int = 1, seed: int = 0) -> list[dict[str, Any]]:
    """`copies` Keras processes started together, each on its 1/copies of the rows as N workers split them and
    fed as workers are (``ShardFeed``): the ``feed`` set-up of `trainer_jobs.support.plain_keras` run `copies`
    times at once; one result per process (``rows``, ``epoch_times``, ``cores_used``).

    No parameter server, no Spark: what N processes training at once cost
    each other on this machine's cores, caches and memory, the ceiling of
    per-worker throughput at N workers (two on the 2-vCPU development
    machine trained at 0.83-1.05 of one alone, run to run). Not ``fit`` on
    numpy arrays: Keras's own input pipeline adds autotuned threads, and N
    of those side by side fight for the cores (two trained at 0.69 of one
    alone in a run of 2026-11-25), which would flatter the workers.
    """
    return run_single("feed", builder, x, y, epochs=epochs, batch_size=batch_size, seed=seed, copies=copies,
                      threads=threads)


def side_by_side_rate(builder: Callable[[], Any], x: np.ndarray, y: np.ndarray, *, copies: int, epochs: int,
                      batch_size: int, threads: int = 1, seed: int = 0) -> float:
    """Samples/s of each of `copies` bare Keras processes side by side (`plain_keras_side_by_side`), their mean
    over the processes: the per-worker limit of N workers, and the compute of all-reduce's step breakdown."""
    side = plain_keras_side_by_side(builder, x, y, copies=copies, epochs=epochs, batch_size=batch_size,
                                    threads=threads, seed=seed)
    return float(np.mean([r["rows"] / steady_epoch_time(r["epoch_times"]) for r in side]))


def steady_epoch_time(epoch_times: list[float]) -> float:
    """Mean epoch time without the first epoch (graph tracing and warm-up) when there are several."""
    times = list(epoch_times[1:] if len(epoch_times) > 1 else epoch_times)
    return float(np.mean(times)) if times else float("nan")


def fitted_row(model_name: str, fitted, *, workers: int, rows: int, epochs: int, metric: str, value: float,
               valid: bool, **extra: Any) -> dict[str, Any]:
    """One result row for a distributed run."""
    history = fitted.history
    epoch_times = [e["time_s"] for e in history.epochs]
    epoch_time = steady_epoch_time(epoch_times)
    return {
        "model": model_name, "mode": "distributed", "workers": workers,
        "algorithm": history.algorithm, "time_s": history.timings["wall_s"],
        "train_s": history.timings["train_s"], "epoch_time_s": epoch_time, "epoch_times_s": epoch_times,
        "data_delivery_s": history.timings["data_delivery_s"],
        "samples_per_s_per_worker": rows / workers / epoch_time if epoch_time else float("nan"),
        "metric_name": metric, "metric_value": value, "updates": history.num_updates,
        "bytes": history.bytes_moved, "timing_valid": valid, "epochs": epochs,
        "retries": sum(e.get("event") == "attempt_failed" for e in history.events),
        "resumed": any(e.get("event") == "resumed" for e in history.events),
        "period": ((history.choice or {}).get("measured") or {}).get("period"),  # local SGD's, as measured
        **collective_parts(history), **elastic_parts(history), **extra,
    }


def elastic_parts(history) -> dict[str, Any]:
    """An elastic fit's (``num_workers=(min, max)``) joins and leaves (``history.membership``) and the rows each
    worker process (``host:pid``) trained, summed over its chunk tasks; empty for a fixed fit."""
    if not history.membership:
        return {}
    rows: dict[str, int] = {}
    for w in history.workers:
        if w.get("member"):
            rows[w["member"]] = rows.get(w["member"], 0) + int(w.get("trained_rows") or 0)
    return {"membership": history.membership, "rows_by_worker": rows}


def collective_parts(history) -> dict[str, float]:
    """Per step of a fit over the collective group (all-reduce, local SGD), from its processes' records
    (``trainer.runtime.collective.loop``), in ms, the first epoch (tracing) left out as in the epoch times:
    ``step_ms`` (the time in ``fit``), ``in_allreduce_ms`` (in the step's all-reduce: waiting for the slower
    process, then reducing; not measured under JAX) and ``allreduce_ms`` (one all-reduce of the gradients alone,
    after a barrier); ``step_rows`` and ``steps_per_epoch``, a process's; with local SGD instead of the
    all-reduce's parts ``average_ms`` (one average of the replicas, the processes' mean) and
    ``averages_per_epoch``. Empty for other algorithms."""
    workers = [w for w in history.workers if w.get("fit_s") and w.get("steps")]
    if not workers:
        return {}

    def per_step_ms(w: dict, key: str) -> float:  # the first epoch (tracing, compiling) left out if there are more
        epochs = [e for e in w["epochs"] if key in e]
        epochs = epochs[1:] if len(epochs) > 1 else epochs
        return 1000 * sum(e[key] for e in epochs) / max(sum(e["batches"] for e in epochs), 1)

    out = {"step_ms": float(np.mean([per_step_ms(w, "fit_s") for w in workers])),
           "step_rows": float(np.mean([w["padded_rows"] * len(w["epochs"]) / w["steps"] for w in workers])),
           "steps_per_epoch": float(np.mean([w["steps"] / len(w["epochs"]) for w in workers]))}
    if all(w.get("averages") for w in workers):  # local SGD: no all-reduce inside its steps
        out["average_ms"] = float(np.mean([1000 * w["average_s"] / w["averages"] for w in workers]))
        out["averages_per_epoch"] = float(np.mean([w["averages"] / len(w["epochs"]) for w in workers]))
    elif all(w.get("allreduce_ms") is not None and all("collective_s" in e for e in w["epochs"])
             for w in workers):
        out["in_allreduce_ms"] = float(np.mean([per_step_ms(w, "collective_s") for w in workers]))
        out["allreduce_ms"] = float(np.mean([w["allreduce_ms"] for w in workers]))
    return out


def step_breakdown(row: dict[str, Any]) -> dict[str, float]:
    """Where an all-reduce row's step goes, in ms, against `row`'s side-by-side limit: ``compute_ms`` (a step
    of one of N bare Keras processes side by side), ``wait_ms`` (waiting for the slower process),
    ``allreduce_ms``, ``framework_ms`` (the rest of the time in ``fit``: the local-gradients step's own work,
    Keras's loop) and ``epoch_end_ms`` (the epoch's end spread over its steps: validation, the report, the
    driver)."""
    if not (row.get("step_ms") and row.get("side_by_side_samples_per_s")):
        return {}
    compute = 1000 * row["step_rows"] / row["side_by_side_samples_per_s"]
    out = {"compute_ms": compute, "epoch_end_ms": 1000 * row["epoch_time_s"] / row["steps_per_epoch"] - row["step_ms"]}
    if "in_allreduce_ms" in row:
        out.update(wait_ms=row["in_allreduce_ms"] - row["allreduce_ms"],
                   framework_ms=row["step_ms"] - row["in_allreduce_ms"] - compute)
    return out


def baseline_row(model_name: str, result: dict[str, Any], *, rows: int, epochs: int, metric: str,
                 value: float, threads: int, **extra: Any) -> dict[str, Any]:
    """The result row of a plain Keras run (workers = 0 marks it as the baseline)."""
    epoch_time = steady_epoch_time(result["epoch_times"])
    return {
        "model": model_name, "mode": f"plain keras ({threads} thread{'s' if threads > 1 else ''})",
        "workers": 0, "algorithm": "none", "time_s": result["train_s"], "train_s": result["train_s"],
        "epoch_time_s": epoch_time, "epoch_times_s": list(result["epoch_times"]), "data_delivery_s": 0.0,
        "samples_per_s_per_worker": rows / epoch_time,
        "metric_name": metric, "metric_value": value, "updates": 0, "bytes": 0, "timing_valid": True,
        "epochs": epochs, **extra,
    }


def with_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add speed-up/efficiency (epoch time vs the 1-worker rows of the same model) and the
    framework-overhead ratio (per-worker samples/s vs the plain Keras rows, workers == 0).
    Repeated runs of a baseline count with their mean. Rows that carry ``side_by_side_samples_per_s``
    (samples/s per process of N Keras processes side by side, `plain_keras_side_by_side`) also get
    ``throughput_vs_side_by_side``; so does the 1-worker row of their model (against plain Keras alone)."""
    rows = speedup_rows(rows, group_by=("model",), time_key="epoch_time_s")
    for r in rows:
        plain = [p["samples_per_s_per_worker"] for p in rows if p["model"] == r["model"] and p["workers"] == 0]
        if r["workers"] == 0:
            r["speedup"] = r["efficiency"] = None
        elif plain:
            r["throughput_vs_keras"] = r["samples_per_s_per_worker"] / float(np.mean(plain))
        if r.get("side_by_side_samples_per_s"):
            r["throughput_vs_side_by_side"] = r["samples_per_s_per_worker"] / r["side_by_side_samples_per_s"]
        elif r["workers"] == 1 and plain and any(p.get("side_by_side_samples_per_s") for p in rows
                                                 if p["model"] == r["model"]):
            r["throughput_vs_side_by_side"] = r["throughput_vs_keras"]  # one process: plain Keras alone
        r.update(step_breakdown(r))
    return rows


#: The columns of `step_breakdown_table`.
BREAKDOWN_COLUMNS = ["model", "workers", "seed", "step_ms", "compute_ms", "wait_ms", "allreduce_ms", "framework_ms",
                     "epoch_end_ms"]


def step_breakdown_table(rows: list[dict[str, Any]]) -> str:
    """The all-reduce rows' step breakdown (`step_breakdown`) as a Markdown table, or "" when no row has one."""
    broken_down = [r for r in rows if r.get("compute_ms") is not None]
    if not broken_down:
        return ""
    return "where an all-reduce step goes (ms):\n" + markdown_table(broken_down, BREAKDOWN_COLUMNS)
