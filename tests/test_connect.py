"""Spark Connect: fit, transform, evaluate, model selection and all-reduce through a real Connect server.

One server for the module, started from the installed pyspark wheel (``spark-submit
--class ...SparkConnectServer``) against the session's drivers cluster (3 workers,
each announcing one fake GPU; tests/conftest.py), two executors with a GPU each, and
stopped even when a test fails; the last test stops it and checks that its
processes and port are gone. Each client runs in its own process
(tests/connect_client.py, tests/allreduce_client.py): a Connect session switches
pyspark into remote mode for the whole interpreter, which the other tests' classic
session must not see, and the client's Keras backend is the one its tasks use.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.errors import ConnectUnsupportedError
from trainer.spark.connect import is_connect, require_classic
from trainer.spark.procs import group_alive

CONNECT_CLIENT = Path(__file__).with_name("connect_client.py")
ALLREDUCE_CLIENT = Path(__file__).with_name("allreduce_client.py")


@pytest.fixture(scope="module")
def connect_server(drivers_cluster):
    """A Spark Connect server on 2 of the drivers cluster's workers, a GPU per executor; stopped at the end of
    the module."""
    server = drivers_cluster.connect_server(**{"spark.driver.memory": "1g", "spark.cores.max": "2",
                                               "spark.executor.resource.gpu.amount": "1"})
    try:
        yield server
    finally:
        server.stop()


def _client(script: Path, server, out: Path, **env: str) -> dict:
    """Run a Connect client script against `server`; what it saw (the JSON it wrote)."""
    proc = subprocess.run([sys.executable, str(script), server.url, str(out)], cwd=script.parent.parent,
                          capture_output=True, text=True, timeout=800, env={**os.environ, **env})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(out.read_text())


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
def test_fit_transform_evaluate_and_selection_through_a_connect_server(connect_server, tmp_path):
    seen = _client(CONNECT_CLIENT, connect_server, tmp_path / "connect.json")
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


@pytest.mark.spark
@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend", ["torch"])
def test_allreduce_through_spark_connect_each_process_sees_its_own_gpu(connect_server, tmp_path, backend):
    """Spark Connect and gpus_per_worker together, on fake-GPU workers: the all-reduce stage is scheduled with
    a GPU per task, each collective process sets its own visible, and the fit trains (on the CPU). The client's
    Keras backend is the one its tasks use, here torch.distributed: under a backend other than the session's
    default, tasks that fell back to TensorFlow would show. The stage, its GPUs and the client's backend reach
    the tasks through the same code under every backend; each backend's collective ops train through a
    classic session in test_allreduce.py (TensorFlow in make test's main run, JAX and torch in its backend
    runs). The TensorFlow client ran here too until 2026-11-28 (81 s; docs/testing.md)."""
    pytest.importorskip(backend)
    seen = _client(ALLREDUCE_CLIENT, connect_server, tmp_path / "allreduce.json", KERAS_BACKEND=backend)
    assert seen["is_connect"] and seen["backend"] == backend and seen["epochs"] == 3
    workers = seen["workers"]
    assert [w["worker"] for w in workers] == [0, 1] and all(w["backend"] == backend for w in workers), workers
    gpus = [g for w in workers for g in w["gpus"]]
    assert len(gpus) == 2 == len(set(gpus)) and set(gpus) <= {"0", "1", "2"}, workers  # one each, never the same
    assert all(w["visible_devices"] == w["gpus"][0] for w in workers), workers
    # Plain Keras, the same model, rows and global batch of 32, 3 epochs: 0.909-0.963 over 5 seeds.
    assert seen["accuracy"] > 0.85, seen


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_a_cluster_stops_its_connect_server_with_its_processes_and_its_port(connect_server):
    """Last in the module: stopping the cluster that started a Connect server stops the server, ends its
    processes and frees its port. The drivers cluster serves the rest of the session, so a cluster object that
    never started daemons of its own takes the server over and is stopped instead."""
    from trainer.spark.local_cluster import LocalCluster

    pgid = connect_server._daemon.pgid if connect_server._daemon is not None else None
    owner = LocalCluster(workers=1)
    owner._connect_servers.append(connect_server)
    owner.stop()
    assert pgid is not None and not group_alive(pgid), "the Connect server's processes must be gone"
    with socket.socket() as sock:  # and its port free again
        sock.bind(("127.0.0.1", connect_server.port))
