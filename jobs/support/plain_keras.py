"""Plain Keras as the jobs measure it: one fresh process per set-up, the cores of one Spark task.

The scaling jobs (``trainer_jobs.support.scaling``) time their plain-Keras
baseline and the side-by-side limit here, and the benchmarks' worker loop
(``trainer_benchmarks.support.worker_loop``) builds on the same processes.
Every set-up trains the same model on the same rows, each process held to
the cores given as a Spark task with that many cores is (`hold_to_cores`:
thread pools and CPU affinity; side-by-side copies on different cores):

* ``plain``: ``model.fit`` on numpy arrays, Keras's own input pipeline (the
  baseline of `make bench`);
* ``feed``: ``model.fit`` on the worker's input pipeline (``ShardFeed``); with
  ``copies=N``, N such processes at once, each on 1/N of the rows, no exchange
  at all: what N processes training side by side cost each other on this
  machine's cores, caches and memory (the ceiling of ``workers=N``);
* ``feed+callback``: the same with a Keras callback that has a per-batch hook
  doing nothing (what a batch-level callback costs by itself).

Each process reports its epoch times and the cores it kept busy (CPU seconds /
wall seconds: plain Keras's input pipeline and batch-end callbacks run on
threads of their own, so it may use more than the one thread of its model).
No Spark and no pyspark import: it runs wherever Keras and a backend are.
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Any, Callable

import numpy as np

from trainer.internals import DEFAULT_NAME, configure_process, import_keras_quietly, quiet_env

_TIMEOUT = 1800.0


def hold_to_cores(threads: int = 1, backend: str = DEFAULT_NAME, index: int = 0) -> None:
    """Hold this fresh process to `threads` cores as a Spark task with that many cores is held (thread pools and
    CPU affinity: ``configure_process``; `index` spreads side-by-side processes over the cores as task indexes
    do), set the Keras backend, then start Keras without TensorFlow's import banners (`import_keras_quietly`).
    Plain Keras and the workers it is compared with thus run on the same cores: unpinned, XLA (JAX) spreads
    one process over every core of the machine."""
    configure_process(threads, None, backend, quiet_env(), index=index)
    import_keras_quietly()


def epoch_timer(times: list[float]):
    """A Keras callback appending each epoch's wall seconds to `times`."""
    import keras  # deferred: after the thread settings

    class EpochTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            times.append(time.perf_counter() - self.start)

    return EpochTimer()


def _noop_batch_callback():
    import keras  # deferred: after the thread settings

    class BatchHook(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            self.batches = getattr(self, "batches", 0) + 1

    return BatchHook()


def _single(mode: str, builder: Callable, x, y, epochs: int, batch_size: int, seed: int, threads: int,
            queue, backend: str = DEFAULT_NAME, test: tuple | None = None, index: int = 0) -> None:
    hold_to_cores(threads, backend, index)
    import keras  # deferred: after the thread settings

    from trainer.internals import ShardFeed  # deferred: after the thread settings

    keras.utils.set_random_seed(seed)
    model = builder()
    times: list[float] = []
    callbacks = [epoch_timer(times)]
    cpu0, wall0 = time.process_time(), time.perf_counter()
    if mode == "plain":
        model.fit(x, y, batch_size=batch_size, epochs=epochs, verbose=0, callbacks=callbacks)
    else:
        if mode == "feed+callback":
            callbacks.append(_noop_batch_callback())
        feed = ShardFeed(x, y, seed=seed)
        for epoch in range(epochs):
            model.fit(**feed.fit_kwargs(batch_size), epochs=epoch + 1, initial_epoch=epoch, verbose=0,
                      callbacks=callbacks)
    cores = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    result = {"mode": mode, "worker": 0, "rows": len(x), "epoch_times": times, "cores_used": cores}
    if test is not None:
        result["test"] = {k: float(v) for k, v in model.evaluate(*test, verbose=0, return_dict=True).items()}
    queue.put(result)


def collect(procs, queue, count: int) -> list[dict[str, Any]]:
    try:
        results = [queue.get(timeout=_TIMEOUT) for _ in range(count)]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.terminate()
    return results


def run_single(mode: str, builder, x, y, *, epochs: int, batch_size: int, seed: int = 0, copies: int = 1,
               threads: int = 1, backend: str = DEFAULT_NAME, test: tuple | None = None) -> list[dict[str, Any]]:
    """One plain-Keras set-up (``plain``, ``feed``, ``feed+callback``) in `copies` fresh processes of `threads`
    threads of `backend` started together, each on its 1/copies of the rows (as workers split them); one result
    per process (``rows``, ``epoch_times``, ``cores_used``, and with `test` = (x, y) the model's ``test``
    metrics)."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    bounds = np.linspace(0, len(x), copies + 1).round().astype(int)  # contiguous parts: views, not copies
    procs = [ctx.Process(target=_single, args=(mode, builder, x[a:b], y[a:b], epochs, batch_size, seed, threads,
                                               queue, backend, test, i))
             for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
    for proc in procs:
        proc.start()
    return collect(procs, queue, copies)


