"""The driver program of the elastic search's test (tests/test_elastic_search.py): its own cluster, in its own process.

Spark allows one SparkContext per process and the test's pytest worker may hold the session's: so the search runs
here, against a `LocalCluster` of 2 one-core workers with Spark's dynamic allocation on (standalone, shuffle
tracking): three configurations, three chunks (``num_workers=(1, 3)``), up to 20 epochs (stopped once every model
ended two epochs after the kill). Once the search trains a third worker daemon is added (its executor started by the
chunk waiting for a slot), and once the joiner's process trained a unit, one of the first two is killed as it starts
its next unit (with its executor and Python workers, as a lost machine): at a commit of a chunk some model still
needs, so that its task does not end in between and leave nothing to lose. Writes what happened as JSON.

    python tests/elastic_search_driver.py OUT.json
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from elastic_driver import dynamic_digits  # noqa: E402

from trainer import LocalCluster  # noqa: E402
from trainer.selection import GridSearch, ModelSelector, SelectionCallback, choice  # noqa: E402
from trainer.spark.procs import descendants  # noqa: E402


def model_fn(params):  # defined in __main__: shipped to the executors by value
    import keras

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(params["lr"]), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def main(out: str) -> int:
    with LocalCluster(workers=2) as cluster:
        _, df = dynamic_digits(cluster, "elastic-search", 2400)
        disturbed: dict[str, float] = {}
        units: list[dict] = []
        joined = threading.Event()
        victim: list[int] = []  # the worker daemon to kill, named by the server thread
        after: dict[str, list[int]] = {}  # the epochs each model ended after the kill

        def still_needed(chunk: int) -> bool:
            """Whether a model still needs `chunk` in its current epoch (an ended epoch: the next one needs every
            chunk), so that the task serving it stays (a kill then finds it connected, most often mid-unit)."""
            latest: dict[str, tuple[int, set[int]]] = {}
            for u in units:
                epoch, chunks = latest.get(u["model"], (-1, set()))
                if u["epoch"] > epoch:
                    epoch, chunks = u["epoch"], set()
                latest[u["model"]] = (epoch, chunks | {u["worker"]} if u["epoch"] == epoch else chunks)
            return any(chunk not in chunks or len(chunks) == 3 for _, chunks in latest.values())

        class Watch(SelectionCallback):
            def on_unit_end(self, record) -> None:  # runs as the unit commits: its task asks for the next one
                units.append(record)
                if "added" in disturbed and len({u["process"] for u in units}) >= 3 and not victim \
                        and still_needed(record["worker"]):
                    pid = int(record["process"].rsplit(":", 1)[1])
                    for index in (0, 1):
                        if pid in descendants(cluster._worker_daemons[index].proc.pid):
                            victim.append(index)
                            joined.set()  # the joiner trained a unit; kill one of the first two

            def on_epoch_end(self, config_id, epoch, logs) -> None:  # every model two epochs past the kill: enough
                if "killed" in disturbed:
                    after.setdefault(config_id, []).append(epoch)
                    if len(after) == 3 and all(len(e) >= 2 for e in after.values()):
                        self.selector.stop_search = True

        def disturb() -> None:
            while not units:  # the search trains: a machine joins the cluster
                time.sleep(0.05)
            cluster.add_worker()
            disturbed["added"] = time.time()
            if joined.wait(timeout=90):
                time.sleep(0.1)  # its next unit in flight
                disturbed["killed"] = time.time()
                cluster.kill_worker(victim[0])  # a lost machine

        thread = threading.Thread(target=disturb, daemon=True)
        thread.start()
        search = GridSearch({"lr": choice([0.003, 0.01, 0.03])}, epochs=20, batch_size=16, metric="val_accuracy")
        result = ModelSelector(model_fn, search, num_workers=(1, 3), seed=3,
                               verbose=False).fit(df, validation=0.2, callbacks=[Watch()])
        thread.join(timeout=30)
    Path(out).write_text(json.dumps({
        "disturbed": disturbed, "units": result.units, "tasks": result.tasks,
        "history": {cid: [{"epoch": r["epoch"], "value": r["value"], "units": r["units"]} for r in h]
                    for cid, h in result.history.items()},
        "membership": result.membership, "best": result.best_config.id if result.best_config else None,
    }, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
