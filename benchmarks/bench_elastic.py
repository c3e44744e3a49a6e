"""Elastic fits against fixed ones when a worker is lost or joins: the MNIST CNN on the embedded cluster.

On one `LocalCluster` of 3 worker daemons, each repeat (--runs) trains the
MNIST CNN (--limit images, --epochs epochs, --algorithm: by default the
defaults, DOWNPOUR on one host; ``localsgd`` runs local SGD, the fixed fits on
the backend's collective group, the elastic ones averaged by the parameter
server round by round) in six ways:

* ``fixed``: ``num_workers=3``, undisturbed;
* ``fixed, killed``: the same, one worker daemon killed (with its executor and
  Python workers, as a lost machine) when epoch 2 starts: the barrier stage
  fails, the retry waits ``retry_timeout`` for the slot, then goes on with 2;
* ``elastic``: ``num_workers=(1, 3)``, undisturbed;
* ``elastic, killed``: the same kill; the fit goes on with the others;
* ``elastic, paused``: one worker daemon paused (SIGSTOP, with everything
  below it: a hung machine) when epoch 2 starts and woken 8 s later; the fit
  drops it after 5 s without a heartbeat and releases its executor to Spark;
* ``elastic, joined``: started on 2 workers, a third added --join-after
  seconds into epoch 1.

``--elastic-only`` leaves the two fixed fits out; ``--backend NAME`` runs
every fit under that Keras backend and names the results ``elastic-NAME``
(``make bench-elastic``: JAX and torch, elastic fits only).

A first, untimed fit starts every worker's Python process and imports; a
killed worker is added back before the next fit, and a paused one's executor
replaced, each followed by another untimed fit (`warm_up`). Each row: the fit's wall
time, its ratio to the undisturbed run of its kind in the same repeat
(``vs_undisturbed``, the target for an elastic fit that loses one of 3 workers
at epoch 2: at most 1.15), seconds from the kill to the fit noticing it
(``noticed_s``: the elastic fit's ``left`` event, the fixed fit's failed
attempt), the joiner's time to ready (process start to model built), and the
test accuracy. A joined row also says whether the other two waited for the
joiner: ``others_rate`` is their commits per second while it starts (from
the join to its first HELLO) over their rate before it; ``first_step_s`` the
seconds from its model built to its first step done (the center loaded, the
step compiled), and ``first_average_s`` from then to its first commit,
against ``period_s``, the others' median seconds between two commits (the
target: at most one period). ``cold_kills`` counts the fit's tasks killed at its end
for waiting on an executor still starting (``trainer.spark.elastic_launch.ColdTasks``). The last
repeat's disturbed elastic fits are also drawn, workers and rows per second
over time (``elastic-timeline.png``, ``elastic-localsgd-timeline.png``, beside the results and, with
``--publish``, in its folder: docs/faults.md shows it).

    python benchmarks/bench_elastic.py --out results/elastic              # 3 repeats: about 40 minutes
    python benchmarks/bench_elastic.py --runs 1 --epochs 2 --limit 3000 --out /tmp/elastic   # a quick look
    python benchmarks/bench_elastic.py --algorithm localsgd --out results/elastic-localsgd     # local SGD
    python benchmarks/bench_elastic.py --backend jax --elastic-only --out results/elastic-jax  # under JAX
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import numpy as np

from trainer import LocalCluster, Trainer
from trainer.data.prep import scale_pixels
from trainer.internals import wait_for_slots
from trainer_jobs.support.cli import add_verbose_arg, positive_int, start_logging
from trainer_jobs.support.datasets import data_dir, load_mnist, parquet_images
from trainer_jobs.support.models import build_cnn
from trainer_jobs.support.published import add_publish_arg, publish
from trainer_jobs.support.report import markdown_table, write_results
from trainer_jobs.support.timeline import fit_timeline, plot_timelines

COLUMNS = ["run", "mode", "wall_s", "vs_undisturbed", "noticed_s", "joined_ready_s", "others_rate", "first_step_s",
           "first_average_s", "period_s", "cold_kills", "accuracy"]
MODES = ("fixed", "fixed, killed", "elastic", "elastic, killed", "elastic, paused", "elastic, joined")
#: Seconds a paused worker stays paused: past the fit's SILENT_S, so it is dropped, then woken.
PAUSE_S = 8.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=positive_int, default=3, help="repeats of the five fits (default 3)")
    parser.add_argument("--epochs", type=positive_int, default=4, help="epochs of each fit (default 4)")
    parser.add_argument("--limit", type=positive_int, default=6000, help="training images (default 6000)")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="minibatch size (default 32)")
    parser.add_argument("--join-after", type=float, default=2.0,
                        help="seconds into epoch 1 the third worker is added (default 2)")
    parser.add_argument("--elastic-only", action="store_true", help="leave the fixed fits out")
    parser.add_argument("--retry-timeout", type=float, default=60.0,
                        help="a fixed fit's wait for the lost slot before it goes on with fewer (default 60)")
    parser.add_argument("--algorithm", default="auto", choices=("auto", "localsgd", "downpour"),
                        help="what every fit runs (default auto: the defaults, DOWNPOUR on one host)")
    parser.add_argument("--data-dir", default=None, help="where the Parquet copy of MNIST goes (default ./data)")
    parser.add_argument("--out", default="results/elastic", help="results directory")
    add_publish_arg(parser, "elastic")
    add_verbose_arg(parser)
    return parser.parse_args(argv)


def disturbed_fit(cluster: LocalCluster, train, mode: str, args) -> tuple:
    """One fit of `mode`; (the fitted model, when the kill or the join happened or None, its commits as (time,
    epoch, chunk))."""
    elastic = mode.startswith("elastic")
    at: dict[str, float] = {}
    started = threading.Event()
    second = threading.Event()
    commits: list[tuple[float, int | None, int]] = []

    def on_update(record) -> None:
        commits.append((record.time, record.epoch, record.worker))
        started.set()
        if (record.epoch or 0) >= 1:
            second.set()

    def disturb() -> None:
        if mode.endswith("killed"):
            second.wait()
            at["time"] = time.time()
            cluster.kill_worker()
        elif mode.endswith("paused"):
            second.wait()
            at["time"] = time.time()
            hung = cluster.pause_worker()
            time.sleep(PAUSE_S)
            cluster.pause_worker(hung, paused=False)
        elif mode.endswith("joined"):
            started.wait()
            time.sleep(args.join_after)
            at["time"] = time.time()
            cluster.add_worker()

    thread = threading.Thread(target=disturb, daemon=True)
    thread.start()
    trainer = Trainer(build_cnn, num_workers=(1, 3) if elastic else 3, epochs=args.epochs,
                      algorithm=args.algorithm, batch_size=args.batch_size, retry_timeout=args.retry_timeout, on_update=on_update,
                      check_data=False, verbose=False)
    fitted = trainer.fit(train)
    started.set(), second.set()
    thread.join(timeout=120)
    return fitted, at.get("time"), commits


def join_figures(fitted, at: float, commits: list[tuple[float, int | None, int]]) -> dict[str, float | None]:
    """Whether the others waited for the joiner and how soon it averaged with them (the module docstring)."""
    joined = [e for e in fitted.history.membership if e["event"] == "joined" and e["time"] > at]
    if not joined or not commits:
        return {"others_rate": None, "first_step_s": None, "first_average_s": None, "period_s": None}
    ready = joined[0]["time"]
    tasks = [w for w in fitted.history.workers if w.get("member") == joined[0]["worker"]]
    mine = {(w.get("epoch"), w.get("chunk")) for w in tasks}
    cold = next((w for w in tasks if w.get("first_in_process")), {})
    stepped = cold.get("first_step_end")
    before = [c for c in commits if c[0] < at]
    while_starting = [c for c in commits if at <= c[0] < ready]
    rate = (len(while_starting) / (ready - at)) / (len(before) / (at - before[0][0])) \
        if len(before) > 1 and ready > at else None
    by_chunk: dict[tuple, list[float]] = {}
    for t, epoch, chunk in before:
        by_chunk.setdefault((epoch, chunk), []).append(t)
    gaps = [b - a for times in by_chunk.values() for a, b in zip(times, times[1:])]
    first = [c[0] for c in commits if c[0] >= ready and (c[1], c[2]) in mine]
    compiled = stepped is not None and cold.get("model_built") is not None
    return {"others_rate": rate, "first_step_s": stepped - cold["model_built"] if compiled else None,
            "first_average_s": first[0] - stepped if first and compiled else None,
            "period_s": float(np.median(gaps)) if gaps else None}


def warm_up(train) -> None:
    """An untimed elastic fit of one epoch: every executor's Python worker imports Keras and builds the model, so
    that a fit after a worker was added back does not time a cold start (a new executor's JVM and imports take
    10-20 s on 2 busy cores)."""
    Trainer(build_cnn, num_workers=(1, 3), epochs=1, check_data=False, verbose=False).fit(train)


def noticed(fitted, at: float | None) -> float | None:
    """Seconds from the kill (or the pause) to the fit's own record of it."""
    if at is None:
        return None
    left = [e["time"] for e in fitted.history.membership if e["event"] == "left"]
    failed = [e["time"] for e in fitted.history.events if e.get("event") == "attempt_failed"]
    times = left or failed
    return min(times) - at if times else None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start_logging(args)
    x_train, y_train, x_test, y_test = load_mnist(None, limit=args.limit)
    rows = []
    with LocalCluster(workers=3, cores_per_worker=1) as cluster:
        spark = cluster.session("elastic", **{"spark.cores.max": "4"})
        folder = data_dir(args.data_dir)
        train = scale_pixels(parquet_images(spark, folder, "mnist-train", x_train, y_train)).cache()
        test = scale_pixels(parquet_images(spark, folder, "mnist-test", x_test, y_test)).cache()
        warm_up(train)
        for run in range(args.runs):
            undisturbed: dict[str, float] = {}
            timelines: dict[str, dict] = {}
            for mode in (m for m in MODES if not (args.elastic_only and m.startswith("fixed"))):
                if mode == "elastic, joined":
                    cluster.kill_worker()  # start on 2
                    time.sleep(2)
                start = time.time()
                fitted, at, commits = disturbed_fit(cluster, train, mode, args)
                wall = time.time() - start
                kind = mode.split(",")[0]
                undisturbed.setdefault(kind, wall)
                joined = [e for e in fitted.history.membership if e["event"] == "joined" and at and e["time"] > at
                          and mode.endswith("joined")]  # not the paused worker's return
                if mode.startswith("elastic,"):
                    timelines[mode] = fit_timeline(fitted, start, start + wall, at)
                row = {"run": run + 1, "mode": mode, "wall_s": wall, "vs_undisturbed": wall / undisturbed[kind],
                       "noticed_s": noticed(fitted, at) if mode.endswith(("killed", "paused")) else None,
                       "joined_ready_s": joined[0]["ready_s"] if joined else None,
                       **(join_figures(fitted, at, commits) if mode.endswith("joined") and at else {}),
                       "cold_kills": sum(e.get("event") == "cold_task_killed" for e in fitted.history.events),
                       "accuracy": fitted.evaluate(test)["accuracy"], "workers": 3, "speedup": None}
                rows.append(row)
                print(markdown_table([row], COLUMNS), flush=True)
                if mode.endswith("killed"):
                    cluster.add_worker()  # back to 3 for the next fit
                    warm_up(train)
                elif mode.endswith("paused"):
                    wait_for_slots(spark, 3, 120)  # the woken worker's executor replaced
                    warm_up(train)
    name = "-".join(["elastic", *([args.algorithm] if args.algorithm != "auto" else []),
                     *([args.backend] if args.backend else [])])
    paths = write_results(rows, Path(args.out), name, metadata={"job": "bench_elastic", **vars(args)})
    for folder in {Path(args.out), *([Path(args.publish)] if args.publish else [])}:
        print(f"timeline: {plot_timelines(timelines, folder / f'{name}-timeline.png')}")
    print(markdown_table(rows, COLUMNS))
    print(f"results: {', '.join(str(p) for p in paths.values())}")
    publish(args.publish, name, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
