"""Tests of trainer.spark.local_cluster (the embedded standalone cluster) and trainer.spark.session.

The ``spark``-marked tests start real Spark daemons (Java 17+); nothing is mocked.
Failure-path tests use a fake ``java`` script to make the daemons fail the way a
broken installation would.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from trainer.errors import ClusterError, JavaError
from trainer.spark.java import check_java, parse_memory_mb
from trainer.spark.local_cluster import LocalCluster
from trainer.errors import MasterUnreachableError
from trainer.spark.session import _default_conf, executor_env_defaults, spark_session
from spark_processes import java_cmdlines

HOST = "127.0.0.1"


# --------------------------------------------------------------------------- helpers


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie waiting for its reaper is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def _wait_until(predicate, timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def _bindable(port: int) -> bool:
    """Whether a server could listen on the port again (SO_REUSEADDR, as Spark/Jetty/Netty do)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
            s.listen(1)
        except OSError:
            return False
    return True


def _fake_java_home(tmp_path: Path, version: str, on_run: str) -> Path:
    """A JAVA_HOME whose bin/java reports ``version`` and runs ``on_run`` (shell) otherwise."""
    home = tmp_path / "fake-jdk"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(
        textwrap.dedent(
            f"""\
            #!/bin/sh
            if [ "$1" = "-version" ]; then
              echo 'openjdk version "{version}" 2025-01-01' >&2
              exit 0
            fi
            {on_run}
            """
        )
    )
    java.chmod(java.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return home


# --------------------------------------------------------------------------- no Spark needed


@pytest.mark.timeout(30)
def test_parse_memory_mb():
    assert parse_memory_mb("2g") == 2048
    assert parse_memory_mb("512m") == 512
    assert parse_memory_mb("1536MB") == 1536
    assert parse_memory_mb("1t") == 1024 * 1024
    with pytest.raises(ValueError, match="expected a memory size"):
        parse_memory_mb("lots")


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"workers": 0}, "workers >= 1"),
        ({"cores_per_worker": 0}, "cores_per_worker >= 1"),
        ({"worker_memory": "256m"}, "worker_memory >= 512m"),
        ({"worker_memory": "2 gigs"}, "memory size"),
        ({"master_port": 70000}, "master_port in 1..65535"),
        ({"start_timeout": 0}, "start_timeout > 0"),
    ],
)
def test_invalid_arguments_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LocalCluster(**kwargs)


@pytest.mark.timeout(30)
def test_properties_before_start_raise_a_clear_error():
    cluster = LocalCluster(workers=1)
    with pytest.raises(ClusterError, match="call start"):
        _ = cluster.master_url
    cluster.stop()  # stopping a never-started cluster is a no-op
    cluster.stop()


@pytest.mark.timeout(30)
def test_executor_env_defaults_cap_thread_pools():
    env = executor_env_defaults(3)
    assert env["OMP_NUM_THREADS"] == env["TF_NUM_INTRAOP_THREADS"] == env["TF_NUM_INTEROP_THREADS"] == "3"
    assert env["TF_CPP_MIN_LOG_LEVEL"] == "2"
    assert env["KERAS_BACKEND"] == os.environ.get("KERAS_BACKEND", "tensorflow")
    with pytest.raises(ValueError):
        executor_env_defaults(0)


@pytest.mark.timeout(30)
def test_the_executors_get_the_backend_keras_would_start_here(monkeypatch, tmp_path):
    """KERAS_BACKEND, else Keras's config file, else TensorFlow: what `import keras` in the driver starts."""
    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    assert executor_env_defaults(1)["KERAS_BACKEND"] == "tensorflow"  # no file
    (tmp_path / "keras.json").write_text('{"backend": "jax", "floatx": "float32"}')
    assert executor_env_defaults(1)["KERAS_BACKEND"] == "jax"
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    assert executor_env_defaults(1)["KERAS_BACKEND"] == "torch"
    monkeypatch.delenv("KERAS_BACKEND")
    (tmp_path / "keras.json").write_text("not json")
    assert executor_env_defaults(1)["KERAS_BACKEND"] == "tensorflow"


@pytest.mark.timeout(30)
def test_session_defaults_depend_on_the_master():
    standalone = _default_conf("spark://h:7077", "app", 2)
    assert standalone["spark.executor.cores"] == "2"
    assert standalone["spark.pyspark.python"] == sys.executable
    assert standalone["spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures"] == "1"
    assert standalone["spark.executorEnv.OMP_NUM_THREADS"] == "2"
    assert standalone["spark.sql.execution.arrow.pyspark.enabled"] == "true"
    assert "spark.driver.host" not in standalone
    assert standalone["spark.driver.memory"] == "4g"
    local = _default_conf("local[*]", "app", 1)
    assert "spark.executor.cores" not in local
    assert local["spark.pyspark.python"] == sys.executable
    # On YARN/Kubernetes the executor image decides which Python runs.
    for master in ("yarn", "k8s://https://api:6443"):
        remote = _default_conf(master, "app", 4)
        assert "spark.pyspark.python" not in remote
        assert remote["spark.executor.cores"] == "4"


@pytest.mark.timeout(30)
def test_driver_memory_set_by_the_environment_is_not_overridden(monkeypatch):
    monkeypatch.setenv("SPARK_DRIVER_MEMORY", "2g")
    assert "spark.driver.memory" not in _default_conf("spark://h:7077", "app", 1)


@pytest.mark.timeout(60)
def test_java_is_found_and_recent():
    java, major = check_java()
    assert major >= 17
    assert os.access(java, os.X_OK)


# --------------------------------------------------------------------------- start failures


@pytest.mark.spark
@pytest.mark.timeout(60)
def test_bogus_java_home_fails_fast_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-such-jdk"))
    t0 = time.monotonic()
    with pytest.raises(JavaError) as err:
        LocalCluster(workers=1).start()
    assert time.monotonic() - t0 < 10
    assert "JAVA_HOME" in str(err.value) and "openjdk-17-jre-headless" in str(err.value)


@pytest.mark.spark
@pytest.mark.timeout(60)
def test_missing_java_on_path_fails_fast_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(JavaError, match="openjdk-17-jre-headless"):
        LocalCluster(workers=1).start()


@pytest.mark.spark
@pytest.mark.timeout(60)
def test_old_java_is_rejected(tmp_path, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(_fake_java_home(tmp_path, "1.8.0_392", "exit 1")))
    with pytest.raises(JavaError, match="Java 8"):
        LocalCluster(workers=1).start()


@pytest.mark.spark
@pytest.mark.timeout(60)
def test_daemon_that_dies_at_start_fails_fast_with_its_log(tmp_path, monkeypatch):
    home = _fake_java_home(tmp_path, "17.0.99", 'echo "fake-java-refuses-to-start" >&2; exit 3')
    monkeypatch.setenv("JAVA_HOME", str(home))
    cluster = LocalCluster(workers=1, keep_logs=False)
    t0 = time.monotonic()
    with pytest.raises(ClusterError) as err:
        cluster.start()
    assert time.monotonic() - t0 < 20
    message = str(err.value)
    assert "master" in message and "exited with code" in message
    assert "fake-java-refuses-to-start" in message  # the log tail is part of the error
    assert not cluster.running
    assert all(_group_gone(g) for g in cluster.process_groups())
    assert cluster.log_dir is not None and not cluster.log_dir.exists()


@pytest.mark.spark
@pytest.mark.timeout(60)
@pytest.mark.parametrize("which", ["master_port", "ui_port"])
def test_taken_port_fails_fast(which):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind((HOST, 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        cluster = LocalCluster(workers=1, **{which: port})
        t0 = time.monotonic()
        with pytest.raises(ClusterError, match=rf"port {HOST}:{port} to be free"):
            cluster.start()
        assert time.monotonic() - t0 < 10
        assert cluster.process_groups() == []  # nothing was launched


# --------------------------------------------------------------------------- stop / CLI (own clusters)


_DRIVER = """
import sys, time
from trainer.spark.session import spark_session
spark = spark_session(sys.argv[1], "stop-test", expected_executors=1, executor_timeout=150, **{
    "spark.executor.memory": "512m", "spark.cores.max": "1",
    "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
print("sum", spark.sparkContext.parallelize(range(10), 1).sum(), flush=True)
print("ready", flush=True)
time.sleep(600)
"""


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_stop_kills_daemons_executors_and_python_workers_and_frees_ports(tmp_path):
    cluster = LocalCluster(workers=1, worker_memory="1g")
    driver = None
    try:
        cluster.start()
        master_port, ui_port = cluster.master_port, cluster.ui_port
        groups = cluster.process_groups()
        assert len(groups) == 2
        # A driver in another process keeps an executor (JVM + Python daemon) busy.
        script = tmp_path / "driver.py"
        script.write_text(_DRIVER)
        driver = subprocess.Popen(
            [sys.executable, str(script), cluster.master_url],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True,
        )
        lines = []
        for line in driver.stdout:
            lines.append(line.strip())
            if line.strip() == "ready":
                break
        assert lines[-1:] == ["ready"], f"driver ended early: {lines}"
        assert "sum 45" in lines
        pids = cluster.pids()
        # master + worker + executor JVM + its Python daemon (at least)
        assert len(pids) >= 4, pids
        t0 = time.monotonic()
    finally:
        cluster.stop()
    stop_seconds = time.monotonic() - t0
    try:
        assert stop_seconds < 30
        assert _wait_until(lambda: all(_group_gone(g) for g in groups), 15), groups
        assert all(_pid_gone(p) for p in pids), [p for p in pids if not _pid_gone(p)]
        assert cluster.pids() == []
        assert _wait_until(lambda: _bindable(master_port) and _bindable(ui_port), 10)
        assert not cluster.log_dir.exists()
        cluster.stop()  # idempotent
    finally:
        if driver is not None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(30)


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_cli_up_prints_urls_and_stops_on_sigint():
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer", "cluster", "up", "--workers", "1", "--worker-memory", "1g"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    out = []
    try:
        deadline = time.monotonic() + 200
        while not any("Press Ctrl-C" in line for line in out):
            assert proc.poll() is None, f"CLI exited early ({proc.returncode}): {proc.stderr.read()}"
            assert time.monotonic() < deadline, f"no banner after 200s: {out}"
            try:
                out.append(lines.get(timeout=1))
            except queue.Empty:
                pass
        text = "".join(out)
        master_url = re.search(r"master URL\s*:\s*(spark://\S+)", text).group(1)
        ui_url = re.search(r"web UI\s*:\s*(http://\S+)", text).group(1)
        groups = [int(g) for g in re.search(r"process groups\s*:\s*([\d ]+)", text).group(1).split()]
        import json
        import urllib.request

        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(ui_url + "/json/", timeout=10) as resp:
            status = json.loads(resp.read())
        assert status["url"] == master_url
        assert [w["state"] for w in status["workers"]] == ["ALIVE"]
        assert len(groups) == 2 and all(not _group_gone(g) for g in groups)

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        assert _wait_until(lambda: all(_group_gone(g) for g in groups), 15), groups
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


_OWNER = """
import sys, time
from trainer.spark.local_cluster import LocalCluster
cluster = LocalCluster(workers=1, worker_memory="1g", log_dir=sys.argv[2]).start()
print("groups", *cluster.process_groups(), flush=True)
if sys.argv[1] == "exit":
    sys.exit(0)  # no stop(): the atexit hook must clean up
time.sleep(600)
"""


@pytest.mark.spark
@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_daemons_do_not_outlive_their_owner(tmp_path, how):
    """Normal exit without stop() (atexit hook) or SIGKILL of the owner (parent-death signal)."""
    if how == "sigkill" and not (sys.platform.startswith("linux") and shutil.which("setpriv")):
        pytest.skip("the parent-death signal needs Linux with util-linux setpriv")
    script = tmp_path / "owner.py"
    script.write_text(_OWNER)
    proc = subprocess.Popen(
        [sys.executable, str(script), how, str(tmp_path / "logs")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    groups: list[int] = []
    try:
        line = proc.stdout.readline()
        assert line.startswith("groups "), f"owner failed: {line!r} {proc.stderr.read() if not line else ''}"
        groups = [int(g) for g in line.split()[1:]]
        assert len(groups) == 2
        if how == "sigkill":
            assert all(not _group_gone(g) for g in groups)
            proc.kill()
        assert proc.wait(timeout=60) in (0, -signal.SIGKILL)
        assert _wait_until(lambda: all(_group_gone(g) for g in groups), 30), groups
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        for g in groups:
            if not _group_gone(g):
                os.killpg(g, signal.SIGKILL)


# --------------------------------------------------------------------------- shared cluster


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_master_json_shows_two_alive_workers(local_cluster_2):
    status = local_cluster_2.status()
    assert status["status"] == "ALIVE"
    assert status["url"] == local_cluster_2.master_url
    alive = local_cluster_2.alive_workers()
    assert len(alive) == 2
    assert {(w["cores"], w["memory"]) for w in alive} == {(1, 2048)}
    assert local_cluster_2.master_url.startswith(f"spark://{HOST}:")
    assert local_cluster_2.ui_url == f"http://{HOST}:{local_cluster_2.ui_port}"
    assert local_cluster_2.start_seconds is not None and local_cluster_2.start_seconds > 0
    assert local_cluster_2.dead_daemons() == []


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_session_has_all_executors_and_training_defaults(spark, local_cluster_2):
    sc = spark.sparkContext
    assert sc.master == local_cluster_2.master_url
    assert sc._jsc.sc().getExecutorMemoryStatus().size() == 3  # 2 executors + the driver
    conf = sc.getConf()
    assert conf.get("spark.executor.cores") == "1"
    assert conf.get("spark.executor.memory") == "1024m"
    assert conf.get("spark.cores.max") == "2"
    assert conf.get("spark.driver.host") == HOST
    assert conf.get("spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures") == "1"

    def probe(_):
        import os as _os
        import sys as _sys

        keys = ("KERAS_BACKEND", "TF_CPP_MIN_LOG_LEVEL", "OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS")
        yield (_sys.executable,) + tuple(_os.environ.get(k) for k in keys)

    rows = set(sc.parallelize(range(2), 2).mapPartitions(probe).collect())
    keras_backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    assert rows == {(sys.executable, keras_backend, "2", "1", "1")}


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_daemons_and_executors_keep_their_settings_with_no_directory_on_their_class_path(spark, local_cluster_2):
    # Java maps a class-data archive only for a class path without an existing directory (make test gives every
    # JVM one): the cluster's settings reach its JVMs as options and LOG4J_CONFIGURATION_FILE, not a conf dir.
    assert spark.sparkContext.parallelize(range(2), 2).count() == 2
    cmds = java_cmdlines(local_cluster_2.pids())
    kinds = sorted(c.rsplit(".", 1)[1] for cmd in cmds.values() for c in cmd if c.startswith("org.apache.spark."))
    assert kinds == ["CoarseGrainedExecutorBackend"] * 2 + ["Master", "Worker", "Worker"], kinds
    for pid, cmd in cmds.items():
        class_path = cmd[cmd.index("-cp") + 1].split(os.pathsep)
        assert not [entry for entry in class_path if os.path.isdir(entry)], class_path
        archives = [o.split("=", 1)[1] for o in cmd if o.startswith("-XX:SharedArchiveFile=")]
        if archives and os.path.exists(archives[-1]):  # under make test: the archive is mapped, not ignored
            assert archives[-1] in Path(f"/proc/{pid}/maps").read_text(), cmd
    for cmd in cmds.values():
        if "org.apache.spark.executor.CoarseGrainedExecutorBackend" not in cmd:
            assert {"-Dspark.master.rest.enabled=false", "-Dspark.port.maxRetries=0"} <= set(cmd), cmd
    root = local_cluster_2.log_dir
    master_log = (root / "master.log").read_text()
    assert " INFO Master: I have been elected leader" in master_log  # our log4j: the Master's lifecycle lines
    assert "REST server" not in master_log and " INFO SecurityManager" not in master_log, master_log[-2000:]
    executor_logs = sorted(root.glob("work/worker-*/app-*/*/stderr"))
    assert len(executor_logs) >= 2, executor_logs
    for path in executor_logs:
        text = path.read_text()
        assert text.startswith("Spark Executor Command:"), text[:200]
        assert " INFO " not in text, f"{path}: the executor logs at INFO, not our WARN\n{text[-2000:]}"


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_small_jobs_run_on_the_cluster(spark):
    assert spark.sparkContext.parallelize(range(1000), 2).sum() == 499500
    assert spark.range(0, 1000, 1, 2).groupBy().sum("id").collect()[0][0] == 499500


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_barrier_map_in_arrow_spans_both_executors(spark):
    def where(batches):
        import os as _os

        import pyarrow as _pa
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        ctx.barrier()  # both tasks must be running at the same time
        for _ in batches:
            pass
        yield _pa.RecordBatch.from_pydict(
            {"partition": [ctx.partitionId()], "pid": [_os.getpid()], "daemon": [_os.getppid()],
             "peers": [len(ctx.getTaskInfos())]}
        )

    schema = "partition long, pid long, daemon long, peers long"
    rows = spark.range(0, 2, 1, 2).mapInArrow(where, schema, barrier=True).collect()
    assert sorted(r.partition for r in rows) == [0, 1]
    assert len({r.pid for r in rows}) == 2
    assert len({r.daemon for r in rows}) == 2  # one Python daemon per executor: two executors
    assert {r.peers for r in rows} == {2}


@pytest.mark.spark
@pytest.mark.timeout(120)
def test_impossible_barrier_stage_fails_fast(spark):
    """3 barrier tasks on 2 slots: Spark must give up after one check, not wait for minutes."""
    from pyspark.errors import PySparkException
    from py4j.protocol import Py4JJavaError

    t0 = time.monotonic()
    with pytest.raises((Py4JJavaError, PySparkException)) as err:
        spark.sparkContext.parallelize(range(3), 3).barrier().mapPartitions(lambda it: it).collect()
    assert time.monotonic() - t0 < 60
    assert "barrier" in str(err.value).lower()


@pytest.mark.spark
@pytest.mark.timeout(60)
def test_a_second_master_in_the_same_process_is_refused(spark):
    with pytest.raises(RuntimeError, match="one per process"):
        spark_session("local[1]")


@pytest.mark.spark
@pytest.mark.timeout(60)
def test_session_rejects_executors_no_worker_can_host(local_cluster_2):
    with pytest.raises(ValueError, match="spark.executor.memory <= worker_memory"):
        local_cluster_2.session("too-big", **{"spark.executor.memory": "4g"})
    with pytest.raises(ValueError, match="spark.executor.cores <= cores_per_worker"):
        local_cluster_2.session("too-wide", **{"spark.executor.cores": "2"})


@pytest.mark.parametrize("master, reason", [
    ("spark://127.0.0.1:{port}", "Connection refused"),
    ("spark://no-such-host.invalid:7077", "no-such-host.invalid:7077"),
])
def test_unreachable_master_fails_within_seconds(master, reason):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(MasterUnreachableError, match=reason) as exc:
        spark_session(master.format(port=port), "unreachable")
    assert time.monotonic() - started < 10
    assert "Is the master running" in str(exc.value)
    with pytest.raises(ValueError, match="spark://host:7077"):
        spark_session("spark://7077", "no-host")
