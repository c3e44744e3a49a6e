"""Spark Connect: fit, transform, evaluate and model selection through a real Connect server.

The server is started from the installed pyspark wheel (``spark-submit --class
...SparkConnectServer``) against a LocalCluster, and stopped (with the
cluster) even when the test fails. The client runs in its own process
(tests/connect_client.py): a Connect session switches pyspark into remote mode
for the whole interpreter, which the other tests' classic session must not see.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.errors import ConnectUnsupportedError
from trainer.spark.connect import is_connect, require_classic
from trainer.spark.local_cluster import LocalCluster
from trainer.spark.procs import group_alive

CONNECT_CLIENT = Path(__file__).with_name("connect_client.py")


def test_connect_is_told_apart_and_unsupported_calls_say_what_and_why():
    class ClassicLike:  # what matters is the session's class: pyspark.sql.session vs pyspark.sql.connect...
        pass

    assert not is_connect(ClassicLike())
    require_classic(ClassicLike(), "x", "y", "z")  # a classic session passes

    from pyspark.sql.connect.session import SparkSession as ConnectSession

    remote = ConnectSession.__new__(ConnectSession)  # no server needed to check the class
    assert is_connect(remote)
    with pytest.raises(ConnectUnsupportedError, match=r"shrinking does not work with a Spark Connect session: "
                                                      r"no slot count\. Fix: resume"):
        require_classic(remote, "shrinking", "no slot count", "resume")


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fit_transform_evaluate_and_selection_through_a_connect_server(tmp_path):
    cluster = LocalCluster(workers=2, cores_per_worker=1, worker_memory="2g")
    server = None
    try:
        cluster.start()
        server = cluster.connect_server(**{"spark.driver.memory": "1g"})
        out = tmp_path / "connect.json"
        proc = subprocess.run([sys.executable, str(CONNECT_CLIENT), server.url, str(out)],
                              cwd=CONNECT_CLIENT.parent.parent, capture_output=True, text=True, timeout=800)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
        seen = json.loads(out.read_text())
    finally:
        pgid = server._daemon.pgid if server is not None and server._daemon is not None else None
        cluster.stop()  # stops the Connect server too
    assert pgid is not None and not group_alive(pgid), "the Connect server's processes must be gone"
    with socket.socket() as sock:  # and its port free again
        sock.bind(("127.0.0.1", server.port))

    assert seen["is_connect"] and not seen["has_spark_context"]
    assert seen["ps_host"] == "127.0.0.1"  # this client's address on the route to the server
    assert seen["fit_workers"] == [0, 1] and seen["fit_updates"] > 10
    assert seen["evaluate"]["accuracy"] > 0.85, seen["evaluate"]
    assert seen["transform_rows"] == 297 and seen["transform_accuracy"] > 0.85
    for strategy in ("mop", "task_parallel"):
        run = seen[f"select_{strategy}"]
        assert run["configs"] == 2 and run["tasks"] == 2 and run["best"] > 0.6, run
    assert seen["capacity_error"] and "num_workers=3 needs 3 task slots" in seen["capacity_error"]
    assert seen["capacity_check_s"] < 60
    assert seen["inline_error"] and "Spark Connect has no broadcast" in seen["inline_error"]
