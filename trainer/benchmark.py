"""Scaling benchmarks shared by the jobs: N workers vs 1 worker vs plain Keras.

* `cluster_session` gives a SparkSession on a given master URL, or on an
  embedded `LocalCluster` large enough for the biggest worker count.
* `plain_keras_fit` trains the same model with ``model.fit`` in a fresh
  process limited to the same number of threads as one worker: the
  framework-overhead baseline.
* `fitted_row` / `baseline_row` / `with_ratios` turn runs into result rows
  for `trainer.report` (time, epoch time, samples/s, speed-up, efficiency,
  overhead vs plain Keras, updates, bytes, timing validity).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from .checkpoint import FILE_NAME as CHECKPOINT_FILE

log = logging.getLogger("trainer.benchmark")


@contextlib.contextmanager
def cluster_session(master: str | None, workers: int, cores_per_worker: int = 1,
                    app_name: str = "trainer-job") -> Iterator[Any]:
    """SparkSession on `master`, or on an embedded LocalCluster with `workers` workers."""
    if master:
        from .session import spark_session

        spark = spark_session(master, app_name, cores_per_worker=cores_per_worker)
        try:
            yield spark
        finally:
            spark.stop()
        return
    from .cluster import LocalCluster

    with LocalCluster(workers=workers, cores_per_worker=cores_per_worker) as cluster:
        yield cluster.session(app_name)


def timing_valid(workers: int, cores_per_worker: int, master: str | None) -> bool:
    """False when an embedded run time-shares more worker cores than this machine has."""
    return bool(master) or workers * cores_per_worker <= (os.cpu_count() or 1)


def _baseline_child(builder, x, y, epochs, batch_size, threads, backend, seed, queue) -> None:
    os.environ.update({
        "TF_NUM_INTRAOP_THREADS": str(threads), "TF_NUM_INTEROP_THREADS": "1",
        "OMP_NUM_THREADS": str(threads), "TF_CPP_MIN_LOG_LEVEL": "2", "KERAS_BACKEND": backend,
    })
    import keras

    keras.utils.set_random_seed(seed)
    model = builder()
    times: list[float] = []

    class EpochTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            times.append(time.perf_counter() - self.start)

    started = time.perf_counter()
    history = model.fit(x, y, batch_size=batch_size, epochs=epochs, verbose=0, callbacks=[EpochTimer()])
    queue.put({"train_s": time.perf_counter() - started, "epoch_times": times,
               "loss": [float(v) for v in history.history["loss"]], "weights": model.get_weights()})


def plain_keras_fit(builder: Callable[[], Any], x: np.ndarray, y: np.ndarray, *, epochs: int, batch_size: int,
                    threads: int = 1, seed: int = 0) -> dict[str, Any]:
    """Train `builder()` with plain ``model.fit`` in a fresh process using `threads` threads, Keras seeded with `seed`.

    Returns train_s, epoch_times, loss and the trained weights. A separate
    process is needed because TensorFlow fixes its thread pools at start-up.
    """
    import keras

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


def steady_epoch_time(epoch_times: list[float]) -> float:
    """Mean epoch time without the first epoch (graph tracing and warm-up) when there are several."""
    times = list(epoch_times[1:] if len(epoch_times) > 1 else epoch_times)
    return float(np.mean(times)) if times else float("nan")


def fitted_row(model_name: str, fitted, *, workers: int, rows: int, epochs: int, metric: str, value: float,
               valid: bool, **extra: Any) -> dict[str, Any]:
    """One result row for a distributed run."""
    history = fitted.history
    epoch_time = steady_epoch_time([e["time_s"] for e in history.epochs])
    return {
        "model": model_name, "mode": "distributed", "workers": workers,
        "algorithm": history.algorithm, "time_s": history.timings["wall_s"],
        "train_s": history.timings["train_s"], "epoch_time_s": epoch_time,
        "data_delivery_s": history.timings["data_delivery_s"],
        "samples_per_s_per_worker": rows / workers / epoch_time if epoch_time else float("nan"),
        "metric_name": metric, "metric_value": value, "updates": history.num_updates,
        "bytes": history.bytes_moved, "timing_valid": valid, "epochs": epochs,
        "retries": sum(e.get("event") == "attempt_failed" for e in history.events),
        "resumed": any(e.get("event") == "resumed" for e in history.events), **extra,
    }


def baseline_row(model_name: str, result: dict[str, Any], *, rows: int, epochs: int, metric: str,
                 value: float, threads: int, **extra: Any) -> dict[str, Any]:
    """The result row of a plain Keras run (workers = 0 marks it as the baseline)."""
    epoch_time = steady_epoch_time(result["epoch_times"])
    return {
        "model": model_name, "mode": f"plain keras ({threads} thread{'s' if threads > 1 else ''})",
        "workers": 0, "algorithm": "none", "time_s": result["train_s"], "train_s": result["train_s"],
        "epoch_time_s": epoch_time, "data_delivery_s": 0.0, "samples_per_s_per_worker": rows / epoch_time,
        "metric_name": metric, "metric_value": value, "updates": 0, "bytes": 0, "timing_valid": True,
        "epochs": epochs, **extra,
    }


def with_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add speed-up/efficiency (epoch time vs the 1-worker rows of the same model) and the
    framework-overhead ratio (per-worker samples/s vs the plain Keras rows, workers == 0).
    Repeated runs of a baseline count with their mean."""
    from .report import speedup_rows

    rows = speedup_rows(rows, group_by=("model",), time_key="epoch_time_s")
    for r in rows:
        plain = [p["samples_per_s_per_worker"] for p in rows if p["model"] == r["model"] and p["workers"] == 0]
        if r["workers"] == 0:
            r["speedup"] = r["efficiency"] = None
        elif plain:
            r["throughput_vs_keras"] = r["samples_per_s_per_worker"] / float(np.mean(plain))
    return rows


def add_trainer_args(parser) -> None:
    """--seed, --fixed-epochs, --checkpoint-dir, --resume and --retry-timeout for a job's argument parser."""
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the runs (plain Keras uses it, worker i of a distributed run seed + i; "
                             "default 0): repeat a run with other seeds to see its run-to-run spread")
    parser.add_argument("--fixed-epochs", action="store_true",
                        help="every worker makes exactly one pass over its shard per epoch, instead of the "
                             "workers of an asynchronous algorithm sharing each epoch (Trainer share_epochs=False)")
    parser.add_argument("--checkpoint-dir", default=None,
                        help="save the parameter server's state under DIR/<model>-<N>w every 100 updates and "
                             "at every epoch (default: no checkpoints)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the runs interrupted under --checkpoint-dir (runs without a checkpoint "
                             "start afresh)")
    parser.add_argument("--retry-timeout", type=float, default=60.0,
                        help="seconds a retry after lost executors waits for their slots before it continues "
                             "on the workers left (default 60)")


def check_checkpoint_args(parser, args) -> None:
    """Exit through `parser.error` on checkpoint flags that do not go together."""
    if args.resume and args.checkpoint_dir is None:
        parser.error("--resume needs --checkpoint-dir: the folder the interrupted run saved its checkpoints to")


def trainer_options(args, model_name: str, workers: int, seed: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(Trainer keyword arguments, fit keyword arguments) for one run of a job: seeded with `seed`
    (default --seed); a repeat with another seed checkpoints to its own folder."""
    seed = args.seed if seed is None else seed
    options: dict[str, Any] = {"retry_timeout": args.retry_timeout, "share_epochs": not args.fixed_epochs,
                               "seed": seed}
    if args.checkpoint_dir is None:
        return options, {}
    directory = Path(args.checkpoint_dir) / f"{model_name}-{workers}w{'' if seed == args.seed else f'-seed{seed}'}"
    resume = args.resume and (directory / CHECKPOINT_FILE).is_file()
    if args.resume and not resume:
        log.info("No checkpoint in %s: %s with %d worker(s) starts afresh", directory, model_name, workers)
    options["checkpoint_dir"] = str(directory)
    return options, ({"resume_from": str(directory)} if resume else {})


def algorithm_from_args(name: str, window: int | None):
    """An algorithm from CLI flags: `window` is the exchange window (``every`` for sync);
    None keeps the algorithm's default (per epoch for sync)."""
    from .algorithms import SyncAveraging, get_algorithm

    if name.lower() == "sync":
        return SyncAveraging(every=window or "epoch")
    return get_algorithm(name) if window is None else get_algorithm(name, window=window)


def parse_workers(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4] with a clear error for anything else."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise ValueError(f"--workers expects a comma-separated list of positive integers, e.g. 1,2,4. Received: {text!r}")
    return sorted(set(counts))
