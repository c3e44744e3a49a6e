"""The worker loops without Spark that `make bench-gpu` and `benchmarks/profile_overhead.py` time.

Beside the plain-Keras set-ups of ``trainer_jobs.support.plain_keras`` (``plain``,
``feed``, ``feed+callback``, N ``feed`` copies side by side):

* ``workers=N``: N workers running the real task loop's callback
  (``make_sync_callback``: an exchange with a real parameter server every
  `window` batches), each on 1/N of the rows, with the server in a separate
  process as in the driver; the server process reports its CPU seconds (the
  cores it takes from the workers);
* ``run_collective``: N processes of the all-reduce loop (``CollectiveJob``),
  process 0 reporting to a real parameter server once per epoch.

No Spark: the task loop's Spark parts (Arrow, the barrier) are not what is
measured, and nothing here imports pyspark, so the set-ups run on any machine
with Keras and a backend (``make bench-gpu``). Each process starts the Keras
backend given (``backend``) on the cores given (``threads``: thread pools and
the CPU affinity a Spark task gets, ``configure_process``). Each worker reports
its steady epoch time (the first epoch left out), the exchange time and its
parts, and the cores its process kept busy. What the loops take of the
package's internals comes through ``trainer.internals``.
"""

from __future__ import annotations

import cProfile
import io
import math
import multiprocessing
import os
import pstats
import time
from typing import Any

import numpy as np

from trainer.internals import DEFAULT_NAME, new_secret
from trainer_jobs.support.plain_keras import collect, epoch_timer, hold_to_cores



def _server(algorithm, center, workers: int, secret: bytes, address_queue, stop, queue) -> None:
    from trainer.internals import ParameterServer  # deferred: in the server's own process

    with ParameterServer(algorithm, center, workers, secret, io_timeout=600.0) as ps:
        address_queue.put(ps.address)
        cpu0 = time.process_time()
        stop.wait()
        queue.put({"mode": "server", "cpu_s": time.process_time() - cpu0, "updates": ps.version,
                   "center": [np.array(a) for a in ps.center()]})


def _worker(builder, algorithm, address, secret, worker: int, x, y, epochs: int, batch_size: int, seed: int,
            profile: bool, overlap: bool, queue, backend: str = DEFAULT_NAME, threads: int = 1,
            workers: int = 1) -> None:
    from trainer.internals import configure_process  # deferred: in the worker's own process

    configure_process(threads, None, backend, {}, index=worker)  # as a Spark task with `threads` cores does
    import keras  # deferred: after the thread settings

    from trainer.internals import PSClient, ShardFeed, load_state, make_sync_callback  # after the thread settings

    keras.utils.set_random_seed(seed + worker)
    model = builder()
    record: dict[str, Any] = {"epochs": [], "commits": 0, "comm_s": 0.0,
                              "exchange_s": {"state": 0.0, "payload": 0.0, "round_trip": 0.0, "load": 0.0}}
    times: list[float] = []
    profiler = cProfile.Profile() if profile else None
    with PSClient(*address, secret, worker=worker) as client:
        client.connect()
        center, _ = client.hello()
        load_state(model, list(center), with_optimizer=False, strict=False)
        epoch_batches = math.ceil(len(x) / batch_size) * workers
        callback = make_sync_callback(client, algorithm, worker, record, None, overlap=overlap,
                                      epoch_batches=epoch_batches, workers=workers)
        callback.begin(model)
        feed = ShardFeed(x, y, seed=seed + worker)
        timer = epoch_timer(times)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for epoch in range(epochs):
            callback.start_epoch(epoch)
            if profiler is not None and epoch == epochs - 1:
                profiler.enable()
            model.fit(**feed.fit_kwargs(batch_size), epochs=epoch + 1, initial_epoch=epoch, verbose=0,
                      callbacks=[callback, timer])
            callback.finish_epoch()
        if profiler is not None:
            profiler.disable()
        callback.finish()
        cores = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    top = ""
    if profiler is not None:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(40)
        top = text.getvalue()
    queue.put({"mode": "worker", "worker": worker, "rows": len(x), "epoch_times": times,
               "commits": record["commits"], "comm_s": record["comm_s"], "exchange_s": record["exchange_s"],
               "window": record.get("window"), "cores_used": cores, "profile": top})


def _model_task(builder, backend: str, seed: int, center, test, queue) -> None:
    hold_to_cores(1, backend)
    import keras  # deferred: after the thread settings

    keras.utils.set_random_seed(seed)
    model = builder()
    if center is None:
        queue.put([np.asarray(w) for w in model.get_weights()])
        return
    model.set_weights(center)
    queue.put({k: float(v) for k, v in model.evaluate(*test, verbose=0, return_dict=True).items()})


def model_in_fresh_process(builder, backend: str = DEFAULT_NAME, seed: int = 0, center=None, test=None):
    """In a fresh process (this one never starts a backend, nor takes a GPU): the seeded model's initial weights,
    or with `center` and `test` = (x, y) the metrics of the model holding `center` on the test rows."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_model_task, args=(builder, backend, seed, center, test, queue))
    proc.start()
    return collect([proc], queue, 1)[0]


def run_workers(workers: int, builder, algorithm, x, y, *, epochs: int, batch_size: int, seed: int = 0,
                profile: bool = False, overlap: bool = False, backend: str = DEFAULT_NAME,
                threads: int = 1) -> list[dict[str, Any]]:
    """`workers` worker processes (`threads` cores of `backend` each) and a server process; every worker
    trains on its 1/N of the rows. The server's result holds the final ``center``."""
    center = model_in_fresh_process(builder, backend, seed)
    ctx = multiprocessing.get_context("spawn")
    queue, address_queue, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    secret = new_secret()
    server = ctx.Process(target=_server, args=(algorithm, center, workers, secret, address_queue, stop, queue))
    server.start()
    address = address_queue.get(timeout=120)
    shards = np.array_split(np.arange(len(x)), workers)
    procs = [ctx.Process(target=_worker, args=(builder, algorithm, address, secret, w, x[s], y[s], epochs,
                                                batch_size, seed, profile and w == 0, overlap, queue, backend,
                                                threads, workers))
             for w, s in enumerate(shards)]
    for p in procs:
        p.start()
    try:
        results = collect(procs, queue, workers)
    finally:
        stop.set()
    results += collect([server], queue, 1)
    return results


def run_collective(workers: int, builder, x, y, *, epochs: int, batch_size: int, seed: int = 0,
                   backend: str = DEFAULT_NAME, threads: int = 1, gpus: list[str] | None = None,
                   algorithm=None) -> list[dict[str, Any]]:
    """`workers` processes of the all-reduce loop (``trainer.runtime.collective.loop``), no Spark: each trains on
    its 1/N of the rows (padded to equal batches) in a group on `backend`'s collective engine, process 0 reporting
    to a real parameter server in this process once per epoch. `algorithm`: an ``AllReduce`` (default: every
    step; ``LocalSGD()`` averages every few steps). One record per process, with ``epoch_times`` and the final
    ``center`` in process 0's."""
    import tempfile
    from pathlib import Path

    from trainer.algorithms import AllReduce, ReportedState
    from trainer.internals import CollectiveJob, ModelSource, ParameterServer, reserve_port, start_process, wait_process

    initial = model_in_fresh_process(builder, backend, seed)
    algorithm = algorithm or AllReduce()
    server = ParameterServer(ReportedState(), initial, 1, new_secret())  # task 0 reports once per epoch
    server.start()
    shards = np.array_split(np.arange(len(x)), workers)
    rows = max(len(s) for s in shards)
    ports, processes = [reserve_port() for _ in shards], []
    addresses = [f"127.0.0.1:{port.getsockname()[1]}" for port in ports]
    try:
        for pid, rows_of in enumerate(shards):
            rows_of = np.resize(rows_of, rows)  # the loop's equal batches: a short shard repeats its first rows
            directory = Path(tempfile.mkdtemp(prefix="bench-collective-"))
            for name, array in (("x", x[rows_of]), ("y", y[rows_of]), ("vx", x[:0]), ("vy", y[:0])):
                np.save(directory / f"{name}.npy", array)
            job = CollectiveJob(model=ModelSource(builder=builder), ps_address=server.address,
                                secret=server.credentials, addresses=addresses, process_id=pid, num_processes=workers,
                                batch_size=batch_size, epochs=epochs, seed=seed, keras_backend=backend, cpus=threads,
                                gpus=gpus, shared_gpu=bool(gpus) and workers > 1,  # every process on these GPUs
                                lr_factor=algorithm.learning_rate_factor(workers), cadence=algorithm.cadence(),
                                parent_pid=os.getpid(),
                                record={"worker": pid, "attempt": 0, "rows": len(shards[pid]), "padded_rows": rows})
            processes.append((start_process(directory, job), directory))
        records = [wait_process(process, directory, pid) for pid, (process, directory) in enumerate(processes)]
        records[0]["center"] = server.center()[:len(initial)]  # the weights (the optimizer's variables follow)
    finally:
        server.stop()
        for port in ports:
            port.close()
    for record in records:
        record["epoch_times"] = [e["end"] - e["start"] for e in record["epochs"]]
    return records


def steady(times: list[float]) -> float:
    """Mean epoch time without the first epoch (tracing, warm-up) when there are several."""
    return float(np.mean(times[1:] if len(times) > 1 else times))
