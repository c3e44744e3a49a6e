"""Elastic searches against fixed ones when a worker is lost or joins: MNIST model selection on the embedded cluster.

On one `LocalCluster` of 3 worker daemons, each repeat (--runs) runs the same
model-hopper search (the first --configs configurations of the MNIST job's
grid, ``trainer_jobs.select_mnist``: CNNs and MLPs, --epochs epochs each, on
--limit images, of which a fifth validate) in five ways:

* ``fixed``: ``num_workers=3``, undisturbed (one barrier stage);
* ``fixed, killed``: the same, one worker daemon killed (with its executor and
  Python workers, as a lost machine) once a model ended its first epoch: the
  stage fails and its retry waits for the 3 slots it needs (60 s), then the
  search fails with ``ClusterCapacityError`` (``failed``);
* ``elastic``: ``num_workers=(1, 3)``, undisturbed (rounds of chunk tasks);
* ``elastic, killed``: the same kill; the others go on, the lost unit is
  trained again by another task;
* ``elastic, joined``: started on 2 workers, a third added once the first
  unit ended.

A first, untimed search starts every worker's Python process and imports; a
killed worker is added back before the next search, followed by another
untimed one. Each row: the search's wall time, its ratio to the undisturbed run
of its kind in the same repeat (``vs_undisturbed``), seconds from the kill to
the elastic search's ``lost`` event (``noticed_s``), the units the joiner's
processes trained (``joiner_units``) and the best configuration's validation
accuracy.

    python benchmarks/bench_elastic_search.py --out results/elastic-search        # 3 repeats: about 25 minutes
    python benchmarks/bench_elastic_search.py --runs 1 --epochs 2 --out /tmp/es   # a quick look
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

from trainer import ClusterCapacityError, LocalCluster
from trainer.data.prep import scale_pixels
from trainer.selection import GridSearch, ModelSelector, SelectionCallback
from trainer_jobs.select_mnist import SPACE, model_fn
from trainer_jobs.support.cli import add_verbose_arg, positive_int, start_logging
from trainer_jobs.support.datasets import data_dir, load_mnist, parquet_images
from trainer_jobs.support.published import add_publish_arg, publish
from trainer_jobs.support.report import markdown_table, write_results
from trainer_jobs.support.selection import first_configs

COLUMNS = ["run", "mode", "wall_s", "vs_undisturbed", "noticed_s", "joiner_units", "best_val_accuracy", "failed"]
MODES = ("fixed", "fixed, killed", "elastic", "elastic, killed", "elastic, joined")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=positive_int, default=3, help="repeats of the five searches (default 3)")
    parser.add_argument("--epochs", type=positive_int, default=3, help="epochs of each configuration (default 3)")
    parser.add_argument("--configs", type=positive_int, default=4, help="configurations of the grid (default 4)")
    parser.add_argument("--limit", type=positive_int, default=12000, help="training images (default 12000)")
    parser.add_argument("--data-dir", default=None, help="where the Parquet copy of MNIST goes (default ./data)")
    parser.add_argument("--out", default="results/elastic-search", help="results directory")
    add_publish_arg(parser, "elastic-search")
    add_verbose_arg(parser)
    return parser.parse_args(argv)


def search_run(cluster: LocalCluster, train, mode: str, args) -> tuple:
    """One search of `mode`; (its result, when the kill or the join happened or None)."""
    at: dict[str, float] = {}
    first_unit, first_epoch = threading.Event(), threading.Event()

    class Watch(SelectionCallback):
        def on_unit_end(self, record) -> None:
            first_unit.set()

        def on_epoch_end(self, config_id, epoch, logs) -> None:
            first_epoch.set()

    def disturb() -> None:
        if mode.endswith("killed") and first_epoch.wait(timeout=600):
            at["time"] = time.time()
            cluster.kill_worker()
        elif mode.endswith("joined") and first_unit.wait(timeout=600):
            at["time"] = time.time()
            cluster.add_worker()

    thread = threading.Thread(target=disturb, daemon=True)
    thread.start()
    search = first_configs(GridSearch(SPACE, epochs=args.epochs, metric="val_accuracy"), args.configs)
    selector = ModelSelector(model_fn, search, num_workers=(1, 3) if mode.startswith("elastic") else 3, seed=0,
                             check_data=False, verbose=False)
    try:
        result = selector.fit(train, validation=0.2, callbacks=[Watch()])
    except ClusterCapacityError as exc:  # a fixed search cannot go on with fewer workers than it asked for
        result = exc
    first_unit.set(), first_epoch.set()
    thread.join(timeout=120)
    return result, at.get("time")


def warm_up(train) -> None:
    """An untimed elastic search of one configuration and epoch: every executor's Python worker imports Keras."""
    search = first_configs(GridSearch(SPACE, epochs=1, metric="val_accuracy"), 1)
    ModelSelector(model_fn, search, num_workers=(1, 3), check_data=False, verbose=False).fit(train, validation=0.2)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start_logging(args)
    x_train, y_train, _, _ = load_mnist(None, limit=args.limit)
    rows = []
    with LocalCluster(workers=3, cores_per_worker=1) as cluster:
        spark = cluster.session("elastic-search", **{"spark.cores.max": "4"})
        train = scale_pixels(parquet_images(spark, data_dir(args.data_dir), "mnist-train", x_train, y_train)).cache()
        warm_up(train)
        for run in range(args.runs):
            undisturbed: dict[str, float] = {}
            for mode in MODES:
                if mode == "elastic, joined":
                    cluster.kill_worker()  # start on 2
                    time.sleep(2)
                start = time.time()
                result, at = search_run(cluster, train, mode, args)
                wall = time.time() - start
                kind = mode.split(",")[0]
                undisturbed.setdefault(kind, wall)
                row = {"run": run + 1, "mode": mode, "wall_s": wall, "vs_undisturbed": wall / undisturbed[kind],
                       "noticed_s": None, "joiner_units": None, "best_val_accuracy": None, "failed": None,
                       "workers": 3, "speedup": None}
                if isinstance(result, Exception):
                    row.update(vs_undisturbed=None, failed=type(result).__name__)
                else:
                    lost = [e["time"] for e in result.membership if e["event"] == "lost"]
                    before = {e["process"] for e in result.membership if at and e["time"] < at}
                    joiners = [u for u in result.units if u.get("process") not in before]
                    row.update(noticed_s=min(lost) - at if lost and at else None,
                               joiner_units=len(joiners) if mode.endswith("joined") else None,
                               best_val_accuracy=result.best_value)
                rows.append(row)
                print(markdown_table([row], COLUMNS), flush=True)
                if mode.endswith("killed"):
                    cluster.add_worker()  # back to 3 for the next search
                    warm_up(train)
    paths = write_results(rows, Path(args.out), "elastic-search",
                          metadata={"job": "bench_elastic_search", **vars(args)})
    print(markdown_table(rows, COLUMNS))
    print(f"results: {', '.join(str(p) for p in paths.values())}")
    publish(args.publish, "elastic-search", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
