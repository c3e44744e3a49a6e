"""The driver program of the elastic fit's test (tests/test_elastic.py): its own cluster, in its own process.

Spark allows one SparkContext per process and the test's pytest worker may hold the session's: so the fit runs
here, against a `LocalCluster` of 2 workers with Spark's dynamic allocation on (standalone, shuffle tracking), and
writes what happened as JSON. A worker daemon is added once the fit trains (its executor started by tasks waiting
while the fit waits at its first epoch's end); once its process joined, one of the first two is killed while it
trains (with its executor and Python workers, as a lost machine), then the other one paused while it trains (a hung
machine, woken 8 s later), then the added one decommissioned while it trains (SIGPWR: a machine drained before the
cluster manager takes it, Spark's graceful leave). The fit waits for the join at its first epoch's end and for the rest at its third's, so
that it cannot end before them (the epoch after a waiting one may run meanwhile, not the one after that).

    python tests/elastic_driver.py OUT.json
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import digits_model  # noqa: E402

from trainer import LocalCluster, Trainer  # noqa: E402
from trainer.ps.members import SILENT_S  # noqa: E402
from trainer.spark.procs import descendants  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _connections_below(pid: int, port: int) -> int:
    """Connections to the parameter server at `port` of the processes below `pid` (a worker daemon): a process's
    heartbeat, and its task's while one trains."""
    count = 0
    for child in descendants(pid):
        try:
            count += sum(1 for c in psutil.Process(child).net_connections("tcp")
                         if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED)
        except psutil.Error:
            continue
    return count


def dynamic_digits(cluster: LocalCluster, name: str, rows: int):
    """`cluster`'s session with Spark's dynamic allocation on (standalone, shuffle tracking, up to 3 one-core
    executors), and `rows` rows of the digits (the first 1,500 repeated) as features array<float>, label int."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    spark = cluster.session(name, **{
        "spark.dynamicAllocation.enabled": "true", "spark.dynamicAllocation.shuffleTracking.enabled": "true",
        "spark.dynamicAllocation.maxExecutors": "3", "spark.dynamicAllocation.executorIdleTimeout": "120s",
        "spark.cores.max": "3"})
    return spark, spark.createDataFrame([(x[i % 1500].tolist(), int(data.target[i % 1500])) for i in range(rows)],
                                        "features array<float>, label int")


def main(out: str) -> int:
    with LocalCluster(workers=2) as cluster:
        spark, df = dynamic_digits(cluster, "elastic", 3000)
        epochs_seen: list[int] = []
        disturbed: dict[str, float] = {}
        gates = {"added": threading.Event(), "disturbed": threading.Event()}
        port = _free_port()

        def nap(batches):  # a closure: cloudpickle ships it by value
            for batch in batches:
                time.sleep(2)
                yield batch

        def training(index: int) -> bool:  # its process's task holds a connection beside its heartbeat's
            return _connections_below(cluster._worker_daemons[index].proc.pid, port) >= 2

        def when_training(indexes, act, what: str) -> int:  # act on the first of `indexes` caught training (10 s)
            deadline = time.monotonic() + 10
            while True:
                for index in indexes:
                    if training(index) or time.monotonic() > deadline:
                        disturbed[what] = time.time()  # before the act: the fit may notice before act returns
                        act(index)
                        return index
                time.sleep(0.02)

        def disturb() -> None:
            while not epochs_seen:  # the fit trains: a machine joins the cluster
                time.sleep(0.05)
            cluster.add_worker()  # (the fit waits for it at its first epoch's end)
            disturbed["added"] = time.time()
            gates["added"].set()
            # Tasks waiting make dynamic allocation start an executor on it
            spark.range(6, numPartitions=6).mapInPandas(nap, "id long").collect()
            deadline = time.monotonic() + 30
            while not _connections_below(cluster._worker_daemons[2].proc.pid, port) and (
                    time.monotonic() < deadline):  # its process joined (the test says if it never did)
                time.sleep(0.02)
            killed = when_training((0, 1), cluster.kill_worker, "killed")  # a lost machine
            hung = when_training((1 - killed,), cluster.pause_worker, "paused")  # a hung machine (docker pause)
            time.sleep(SILENT_S + 3)  # it wakes once the fit dropped it and Spark re-ran its chunk
            cluster.pause_worker(hung, paused=False)
            disturbed["woken"] = time.time()
            when_training((2,), cluster.decommission_worker, "decommissioned")  # a graceful leave
            gates["disturbed"].set()

        def on_update(record) -> None:
            epochs_seen.append(record.epoch or 0)

        def on_epoch_end(epoch, center, when) -> None:  # the join before epoch 2, the rest before the last
            gate = {0: gates["added"], 2: gates["disturbed"]}.get(epoch)
            if gate is not None:
                gate.wait(timeout=120)

        thread = threading.Thread(target=disturb, daemon=True)
        thread.start()
        fitted = Trainer(digits_model(), num_workers=(1, 3), epochs=4, batch_size=32, on_update=on_update,
                         on_epoch_end=on_epoch_end, ps_port=port, verbose=False).fit(df)
        thread.join(timeout=30)
    history = fitted.history
    Path(out).write_text(json.dumps({"disturbed": disturbed, "membership": history.membership,
                                     "workers": history.workers, "epochs": history.epochs}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
