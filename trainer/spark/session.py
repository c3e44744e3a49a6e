"""Build a SparkSession with this project's training defaults for any master URL.

``spark_session`` is the one place that decides how a driver talks to a cluster:
``local[*]``, a standalone ``spark://`` master (for example the embedded
``trainer.spark.local_cluster.LocalCluster``), ``yarn`` or ``k8s://``.  The defaults keep
executors from oversubscribing their cores (one BLAS/TensorFlow thread pool per
task slot), make executors run the driver's Python where that Python exists on
the executors (local and standalone masters; this also sets $PYSPARK_PYTHON in
this process, which is what PySpark actually ships to executors), and make an impossible barrier
stage fail fast instead of waiting forever.  Every default can be overridden by
passing the Spark property as a keyword, e.g.
``spark_session("local[2]", **{"spark.executor.memory": "4g"})``.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trainer import backends, verbosity
from trainer.errors import MasterUnreachableError
from trainer.process_env import prepare_process
from trainer.spark.connect import remote_session

log = logging.getLogger("trainer.spark")

__all__ = ["spark_session", "session_conf", "executor_env_defaults", "wait_for_executors", "registered_executors",
           "check_master_reachable"]


def executor_env_defaults(cores: int) -> dict[str, str]:
    """Environment variables every executor (and its Python workers) should get.

    ``cores`` is the number of task slots per executor: the native thread pools
    (each backend's, ``trainer.backends.executor_env``: OpenMP, TensorFlow intra/inter-op) are capped at it so
    that N executors on N cores do not each start a pool as large as the machine.
    """
    if int(cores) < 1:
        raise ValueError(f"cores must be >= 1, got {cores!r}; pass the number of cores per executor")
    return {
        **verbosity.quiet_env(),
        verbosity.ENV: os.environ.get(verbosity.ENV, "warning"),
        "KERAS_BACKEND": backends.configured_name(),
        **backends.executor_env(int(cores)),
    }


def _is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[") or master.startswith("local-cluster[")


#: Default heap of the driver JVM (``spark.driver.memory``); SPARK_DRIVER_MEMORY or a keyword overrides it.
DRIVER_MEMORY = "4g"


def _default_conf(master: str, app_name: str, cores_per_worker: int) -> dict[str, str]:
    conf: dict[str, str] = {
        "spark.app.name": app_name,
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # A barrier stage that cannot get all its slots at once fails after one
        # check instead of retrying for minutes.
        "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "1",
        "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "1s",
        # A lost machine's address answers nothing: a task reading a block (its task binary's broadcast) from its
        # dead executor waited for the connection until spark.network.timeout (120 s), holding an elastic fit's
        # epoch; connecting within a LAN takes milliseconds, so give up after 10 s and read another copy.
        "spark.shuffle.io.connectionCreationTimeout": "10s",
    }
    if "SPARK_DRIVER_MEMORY" not in os.environ:
        # Spark's 1g heap is too small for the driver-side copies some paths make (a local
        # numpy array turned into a DataFrame; the full copy that the task-parallel
        # selection baseline broadcasts): 60,000 MNIST images are 0.4 GB as doubles.
        conf["spark.driver.memory"] = DRIVER_MEMORY
    if not _is_local(master):
        conf["spark.executor.cores"] = str(int(cores_per_worker))
    # The driver's interpreter path only exists on the executors when they run
    # on this machine (local mode, or a standalone cluster started from here);
    # on YARN/Kubernetes the executor image decides.
    if _is_local(master) or master.startswith("spark://"):
        conf["spark.pyspark.python"] = sys.executable
    for key, value in executor_env_defaults(cores_per_worker).items():
        conf[f"spark.executorEnv.{key}"] = value
    if "SPARK_CONF_DIR" not in os.environ:  # the user's own log4j2.properties wins
        conf["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{_driver_log4j()}"
    return conf


def _driver_log4j() -> str:
    """A log4j2 file for the driver JVM at the level of ``TRAINER_LOG`` (see ``trainer.verbosity``)."""
    path = os.path.join(tempfile.gettempdir(), f"trainer-log4j2-{os.getuid()}-{verbosity.level()}.properties")
    text = verbosity.spark_log4j()
    if not os.path.isfile(path) or Path(path).read_text() != text:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".trainer-log4j2-")
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    return path


def registered_executors(spark: Any) -> int:
    """Number of executors (the driver not counted) registered with the driver."""
    sc = spark.sparkContext if hasattr(spark, "sparkContext") else spark
    jsc = sc._jsc
    if jsc is None:  # stopped
        return 0
    if _is_local(sc.master):
        return 1
    # getExecutorMemoryStatus has one entry per block manager, the driver's included.
    return max(0, int(jsc.sc().getExecutorMemoryStatus().size()) - 1)


def fit_hosts(spark: Any) -> int | None:
    """Distinct hosts of the driver and the executors registered with it (`count_hosts`): 1 for a local master or
    an embedded cluster; None for a Spark Connect session or a stopped one, whose executors the client cannot
    list."""
    try:
        sc = spark.sparkContext if hasattr(spark, "sparkContext") else spark
        jsc = sc._jsc
    except Exception:  # a Spark Connect session has no JVM context to ask
        return None
    if jsc is None:
        return None
    if _is_local(sc.master):
        return 1
    status = jsc.sc().getExecutorMemoryStatus()  # a Scala Map: "host:port" of every block manager -> memory
    keys = status.keys().toList()
    return count_hosts(sc.getConf().get("spark.driver.host", ""),
                       [str(keys.apply(i)).rsplit(":", 1)[0] for i in range(keys.size())])


def count_hosts(driver: str, block_managers: list[str]) -> int | None:
    """The machines among the driver's host and its block managers' hosts. A loopback address is the driver's
    machine: an executor that advertises one is reachable by the driver only from that machine, and a driver
    on one can be reached only by executors on its machine (so a driver started by ``spark_session(url)``
    against an embedded cluster, whose workers bind to 127.0.0.1, is one host with them, not two)."""
    if _is_loopback(driver):
        return 1
    hosts = {driver if _is_loopback(host) else host for host in block_managers}
    return len(hosts | {driver} if driver else hosts) or None


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name
        return False


def wait_for_executors(spark: Any, count: int, timeout: float = 120.0, interval: float = 0.25) -> int:
    """Block until ``count`` executors have registered, so that a barrier stage has all its slots.

    Returns the number registered.  Raises ``TimeoutError`` after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        n = registered_executors(spark)
        if n >= count:
            return n
        if time.monotonic() >= deadline:
            sc = spark.sparkContext if hasattr(spark, "sparkContext") else spark
            raise TimeoutError(
                f"expected {count} executor(s) to register with the driver within {timeout:.0f}s, "
                f"got {n} (master {sc.master}); check that the cluster has enough free cores and "
                f"memory for spark.executor.cores/spark.executor.memory, and read the executor "
                f"logs in the workers' work dirs"
            )
        time.sleep(interval)


def check_master_reachable(master: str, timeout: float = 5.0) -> None:
    """Fail in seconds, with the fix, when a ``spark://`` master does not answer.

    Spark itself retries the registration for about a minute and then only logs
    "All masters are unresponsive". Other URLs (local, yarn, k8s) are left to Spark.
    """
    if not master.startswith("spark://"):
        return
    problems = []
    for address in master[len("spark://"):].split(","):  # HA: spark://host1:7077,host2:7077
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"expected a Spark master URL such as 'spark://host:7077', got {master!r}")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
                return
        except OSError as exc:
            problems.append(f"{host}:{port}: {exc.strerror or exc}")
    raise MasterUnreachableError(
        f"Cannot reach the Spark master at {master} ({'; '.join(problems)}). Is the master running and is "
        "the URL right? Start one with `make up` or `python -m trainer cluster up`, or leave --master out to "
        "use an embedded LocalCluster."
    )


def session_conf(master: str, app_name: str = "trainer", cores_per_worker: int = 1, **conf: Any) -> dict[str, str]:
    """The Spark properties `spark_session` starts a driver with: the defaults, then `conf` (None removes one)."""
    settings: dict[str, str] = _default_conf(master, app_name, cores_per_worker)
    for key, value in conf.items():
        if value is None:
            settings.pop(key, None)
        else:
            settings[key] = value if isinstance(value, str) else _to_conf_string(value)
    return settings


def spark_session(
    master: str,
    app_name: str = "trainer",
    cores_per_worker: int = 1,
    *,
    expected_executors: int = 0,
    executor_timeout: float = 120.0,
    **conf: Any,
):
    """Create (or reuse) the process's SparkSession connected to ``master``.

    ``cores_per_worker`` is the cores of each executor (``spark.executor.cores``,
    not set for local masters; the executors' thread pools start capped at it):
    its task slots at ``spark.task.cpus=1``, while a training task sets its own
    pools to its ``spark.task.cpus`` (docs/guide.md#running-on-your-cluster, step 2).
    Extra keyword arguments are Spark properties and override the defaults; ``None``
    removes a default.  With ``expected_executors > 0`` the call returns only once that
    many executors have registered (bounded by ``executor_timeout`` seconds;
    on timeout the session is stopped and ``TimeoutError`` raised).

    Spark allows one SparkContext per process: if one is already running for a
    different master this raises ``RuntimeError``; stop it first.

    ``sc://host:port`` connects to a Spark Connect server instead
    (``trainer.spark.connect.remote_session``); the server's own settings
    apply there, and the other arguments are not used.
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    if not master or not isinstance(master, str):
        raise ValueError(
            f"expected a Spark master URL such as 'local[*]', 'spark://host:7077', 'yarn' or "
            f"'k8s://https://host:443', got {master!r}"
        )
    # The driver's process from here on: TensorFlow's logs quiet and GPU memory taken as used, unless the user
    # set them (Keras reads them when its backend starts; `import trainer` leaves the process as it was).
    prepare_process()
    if master.startswith("sc://"):
        return remote_session(master)
    check_master_reachable(master)
    settings = session_conf(master, app_name, cores_per_worker, **conf)

    active = SparkContext._active_spark_context
    if active is not None and active._jsc is not None and active.master != master:
        raise RuntimeError(
            f"expected no SparkContext or one for master {master!r}, but one for master "
            f"{active.master!r} (app {active.appName!r}) is already running in this process; "
            f"Spark allows one per process: call spark.stop() on it first"
        )

    python = settings.get("spark.pyspark.python")
    if python:
        # PySpark ships the interpreter path to executors from the driver's
        # $PYSPARK_PYTHON (read when the SparkContext is created), not from the
        # spark.pyspark.python property, unless launched through spark-submit.
        previous = os.environ.get("PYSPARK_PYTHON")
        if previous not in (None, python):
            log.info("PYSPARK_PYTHON=%s replaced by spark.pyspark.python=%s", previous, python)
        os.environ["PYSPARK_PYTHON"] = python

    t0 = time.monotonic()
    builder = SparkSession.builder.master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    with verbosity.quiet_child_stderr():  # the driver JVM's start-up banners
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(_SPARK_LEVELS.get(verbosity.level(), "ERROR"))
    t1 = time.monotonic()
    if expected_executors > 0:
        try:
            wait_for_executors(spark, expected_executors, timeout=executor_timeout)
        except BaseException:
            spark.stop()  # do not leave a half-usable context holding the process's only slot
            raise
    log.info(
        "SparkSession %r connected to %s in %.1fs (+%.1fs until %d executor(s) registered)",
        app_name, master, t1 - t0, time.monotonic() - t1, expected_executors,
    )
    return spark


_SPARK_LEVELS = {logging.DEBUG: "INFO", logging.INFO: "WARN"}


def _to_conf_string(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
