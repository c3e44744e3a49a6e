"""The embedded default cluster: a real Spark standalone master and workers on this machine.

``LocalCluster`` starts a Spark standalone master and N worker daemons as
separate OS processes from the installed ``pyspark`` wheel (no Spark download,
no ``start-master.sh``), waits until all workers are ALIVE, and hands out a
``SparkSession`` connected to it whose N executors have registered.  Unlike
``local[*]`` this exercises the real distributed code paths: separate executor
JVMs and Python workers, barrier stages across executors, serialization of
everything that crosses a process boundary.

Every daemon runs in its own session, so ``stop()`` can kill its whole process
group (worker -> executor JVMs); the Python daemons that executors fork are
found by an environment marker (``trainer.spark.procs``).  ``stop()`` is
idempotent, also runs at interpreter exit, and works after a failed ``start()``.

Usage::

    with LocalCluster(workers=2) as cluster:
        spark = cluster.session("my-app")
        ...

or from a shell (blocks until Ctrl-C / SIGTERM)::

    python -m trainer cluster up --workers 3
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import signal
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from trainer.errors import ClusterError
from trainer.spark.connect_server import ConnectServer
from trainer.spark.java import check_java, find_spark_home, parse_memory_mb
from trainer.spark.procs import (
    MARKER_ENV, Daemon, ensure_port_free, free_port, kill_daemons, kill_marked, kill_tree, marked_pids, pdeathsig_prefix,
    tail, wait_groups_reaped,
)
from trainer.spark.resources import check_worker_resources, worker_resource_opts
from trainer.spark.session import executor_env_defaults, session_conf, spark_session

log = logging.getLogger("trainer.spark")

MIN_WORKER_MEMORY_MB = 512  # Spark refuses executors below ~450m
_MASTER_CLASS = "org.apache.spark.deploy.master.Master"
_WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"

_LOG4J2 = """\
# Written by trainer.spark.local_cluster.LocalCluster: quiet Spark daemons and executors.
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
# Keep the few lifecycle lines of master and worker (start, registration).
logger.master.name = org.apache.spark.deploy.master.Master
logger.master.level = info
logger.worker.name = org.apache.spark.deploy.worker.Worker
logger.worker.level = info
logger.jetty.name = org.sparkproject.jetty
logger.jetty.level = warn
logger.hadoop.name = org.apache.hadoop.util.NativeCodeLoader
logger.hadoop.level = error
"""

# The daemons' settings, as Java options rather than a spark-defaults.conf: several clusters may run on one
# machine, so no fixed-port REST server, and a port that is taken is an error (not a silent move to port+1).
_DAEMON_PROPERTIES = "-Dspark.master.rest.enabled=false -Dspark.port.maxRetries=0"
#: A worker daemon decommissions itself on SIGPWR (`LocalCluster.decommission_worker`).
_WORKER_PROPERTIES = "-Dspark.decommission.enabled=true"
# SPARK_CONF_DIR of the daemons (and so of the executors the workers launch): a path under the cluster's
# directory that is never created. Spark puts the conf directory first on a JVM's class path; an absent one
# keeps a Spark configuration of the machine (SPARK_HOME/conf) out of our daemons, and lets their JVMs map a
# class-data archive made with the same class path (Java refuses an archive for a class path that holds a
# directory that exists: `make test` gives every JVM one, docs/testing.md). The log4j configuration goes by
# LOG4J_CONFIGURATION_FILE instead, which executors inherit from their worker.
_ABSENT_CONF_DIR = "no-conf-dir"


class LocalCluster:
    """A Spark standalone master plus ``workers`` worker daemons on this machine.

    Use as a context manager, or call ``start()`` / ``stop()`` (both idempotent).
    ``master_port`` / ``ui_port`` default to free ports.  Logs of the daemons go
    to ``log_dir`` (a temporary directory by default, removed by ``stop()``
    unless ``keep_logs``); executor logs are in ``<log_dir>/work/worker-*/``.
    ``worker_resources`` (e.g. ``{"gpu": 1}``) makes every worker announce that
    many addresses of each custom resource through a discovery script, the
    addresses of worker ``i`` following those of worker ``i - 1`` ("0", "1", ...),
    as distinct GPUs of one machine would be split between its workers; nothing
    checks that the devices exist (``trainer.spark.resources``).
    """

    def __init__(
        self,
        workers: int = 2,
        cores_per_worker: int = 1,
        worker_memory: str = "2g",
        host: str = "127.0.0.1",
        master_port: int | None = None,
        ui_port: int | None = None,
        start_timeout: float = 90.0,
        log_dir: str | os.PathLike | None = None,
        keep_logs: bool = False,
        worker_resources: dict[str, int] | None = None,
    ):
        if int(workers) < 1:
            raise ValueError(f"expected workers >= 1, got {workers!r}")
        if int(cores_per_worker) < 1:
            raise ValueError(f"expected cores_per_worker >= 1, got {cores_per_worker!r}")
        mem_mb = parse_memory_mb(worker_memory)
        if mem_mb < MIN_WORKER_MEMORY_MB:
            raise ValueError(
                f"expected worker_memory >= {MIN_WORKER_MEMORY_MB}m (Spark executors need ~450m), "
                f"got {worker_memory!r}; pass e.g. worker_memory='1g'"
            )
        for name, port in (("master_port", master_port), ("ui_port", ui_port)):
            if port is not None and not (0 < int(port) < 65536):
                raise ValueError(f"expected {name} in 1..65535 or None (pick a free one), got {port!r}")
        if start_timeout <= 0:
            raise ValueError(f"expected start_timeout > 0 seconds, got {start_timeout!r}")
        self.worker_resources = check_worker_resources(worker_resources)
        self.workers = int(workers)
        self.cores_per_worker = int(cores_per_worker)
        self.worker_memory = str(worker_memory)
        self.worker_memory_mb = mem_mb
        self.host = host
        self.start_timeout = float(start_timeout)
        self.keep_logs = bool(keep_logs)
        self._want_master_port = master_port
        self._want_ui_port = ui_port
        self._user_log_dir = Path(log_dir) if log_dir is not None else None
        self._lock = threading.RLock()
        self._reset()

    def _reset(self) -> None:
        self._root: Path | None = None
        self._owns_root = False
        self._master: Daemon | None = None
        self._worker_daemons: list[Daemon] = []
        self._master_port: int | None = None
        self._ui_port: int | None = None
        self._marker: str | None = None
        self._session = None
        self._connect_servers: list[ConnectServer] = []
        self._started = False
        self._atexit_registered = False
        self.start_seconds: float | None = None

    # ------------------------------------------------------------------ properties

    def _require_started(self) -> None:
        if not self._started:
            raise ClusterError("expected a started LocalCluster; call start() or use it in a 'with' block first")

    @property
    def master_url(self) -> str:
        """``spark://host:port`` of the master."""
        self._require_started()
        return f"spark://{self.host}:{self._master_port}"

    @property
    def ui_url(self) -> str:
        """``http://host:port`` of the master's web UI."""
        self._require_started()
        return f"http://{self.host}:{self._ui_port}"

    @property
    def master_port(self) -> int | None:
        return self._master_port

    @property
    def ui_port(self) -> int | None:
        return self._ui_port

    @property
    def log_dir(self) -> Path | None:
        """Directory holding master.log, worker-*.log and the workers' work dirs."""
        return self._root

    @property
    def running(self) -> bool:
        return self._started

    def process_groups(self) -> list[int]:
        """Process-group ids of the daemons (workers first, then the master)."""
        daemons = list(self._worker_daemons) + ([self._master] if self._master else [])
        return [d.pgid for d in daemons]

    def pids(self) -> list[int]:
        """Live processes of this cluster: daemons, executors and their Python workers (Linux)."""
        pids = set()
        if self._marker:
            pids.update(marked_pids(self._marker))
        for d in self._all_daemons():
            if d.proc.poll() is None:
                pids.add(d.proc.pid)
        return sorted(pids)

    def _all_daemons(self) -> list[Daemon]:
        return list(self._worker_daemons) + ([self._master] if self._master else [])

    def status(self, timeout: float = 5.0) -> dict[str, Any]:
        """The master's JSON status (``GET <ui_url>/json/``), parsed."""
        if self._ui_port is None:
            self._require_started()
        return self._fetch_status(timeout)

    def _fetch_status(self, timeout: float) -> dict[str, Any]:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy
        with opener.open(f"http://{self.host}:{self._ui_port}/json/", timeout=timeout) as resp:
            return json.loads(resp.read().decode("utf-8"))

    def alive_workers(self) -> list[dict[str, Any]]:
        """The workers the master lists with state ALIVE."""
        return [w for w in self.status().get("workers", []) if w.get("state") == "ALIVE"]

    def dead_daemons(self) -> list[str]:
        """Descriptions (with log tails) of daemons that have exited; empty while all run."""
        return [d.describe_exit() for d in self._all_daemons() if d.proc.poll() is not None]

    # ------------------------------------------------------------------ start

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> "LocalCluster":
        """Start master and workers; return once all workers are ALIVE (or raise ClusterError)."""
        with self._lock:
            if self._started:
                return self
            self._reset()
            t0 = time.monotonic()
            env = self._daemon_env()
            check_java(env)
            spark_home = find_spark_home()
            if not self._atexit_registered:
                atexit.register(self._stop_at_exit)
                self._atexit_registered = True
            try:
                self._prepare_dirs()
                self._start_master(spark_home, env, t0)
                self._start_workers(spark_home, env, t0)
                self._started = True
            except BaseException:
                self.stop()
                raise
            self.start_seconds = time.monotonic() - t0
            log.info(
                "local Spark cluster up in %.1fs: %s (UI %s), %d worker(s) x %d core(s), %s each; logs in %s",
                self.start_seconds, self.master_url, self.ui_url, self.workers,
                self.cores_per_worker, self.worker_memory, self._root,
            )
            return self

    def _daemon_env(self) -> dict[str, str]:
        env = dict(os.environ)
        self._marker = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        env.update(executor_env_defaults(self.cores_per_worker))
        env.update(
            {
                MARKER_ENV: self._marker,
                "PYSPARK_PYTHON": sys.executable,
                "SPARK_LOCAL_IP": self.host,
                "TF_CPP_MIN_LOG_LEVEL": "2",
            }
        )
        env.setdefault("SPARK_DAEMON_MEMORY", "512m")
        # Master and worker only do bookkeeping: a small heap, one GC thread and
        # the quick JIT tier start faster and leave the cores to the executors.
        env["SPARK_DAEMON_JAVA_OPTS"] = (
            f"{env.get('SPARK_DAEMON_JAVA_OPTS', '')} -XX:+UseSerialGC -XX:TieredStopAtLevel=1 {_DAEMON_PROPERTIES}"
        ).strip()
        # A driver-side SPARK_CONF_DIR / spark-env.sh must not leak into our daemons.
        env.pop("SPARK_ENV_LOADED", None)
        env.pop("PYSPARK_DRIVER_PYTHON", None)
        return env

    def _prepare_dirs(self) -> None:
        if self._user_log_dir is not None:
            self._root = self._user_log_dir.resolve()
            self._root.mkdir(parents=True, exist_ok=True)
            self._owns_root = False
        else:
            self._root = Path(tempfile.mkdtemp(prefix="trainer-cluster-"))
            self._owns_root = True
        (self._root / "log4j2.properties").write_text(_LOG4J2)
        (self._root / "resources").mkdir(exist_ok=True)
        (self._root / "work").mkdir(exist_ok=True)

    def _launch(self, name: str, args: list[str], spark_home: str, env: dict[str, str]) -> Daemon:
        assert self._root is not None
        env = dict(
            env, SPARK_HOME=spark_home, SPARK_CONF_DIR=str(self._root / _ABSENT_CONF_DIR),
            LOG4J_CONFIGURATION_FILE=str(self._root / "log4j2.properties"),
        )
        log_path = self._root / f"{name}.log"
        cmd = pdeathsig_prefix() + [os.path.join(spark_home, "bin", "spark-class"), *args]
        log.debug("starting %s: %s", name, " ".join(cmd))
        with open(log_path, "ab") as logf:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(self._root),
                start_new_session=True,
                close_fds=True,
            )
        return Daemon(name, proc, log_path)

    def _start_master(self, spark_home: str, env: dict[str, str], t0: float) -> None:
        auto_ports = self._want_master_port is None or self._want_ui_port is None
        attempts = 3 if auto_ports else 1
        for attempt in range(1, attempts + 1):
            self._master_port = self._want_master_port or free_port(self.host)
            self._ui_port = self._want_ui_port or free_port(self.host)
            while self._ui_port == self._master_port:
                self._ui_port = free_port(self.host)
            if self._want_master_port is not None:
                ensure_port_free(self.host, self._master_port, "master")
            if self._want_ui_port is not None:
                ensure_port_free(self.host, self._ui_port, "master web UI")
            self._master = self._launch(
                "master",
                [_MASTER_CLASS, "--host", self.host, "--port", str(self._master_port),
                 "--webui-port", str(self._ui_port)],
                spark_home, env,
            )
            try:
                self._wait_master(t0)
                return
            except ClusterError:
                log_text = tail(self._master.log_path, 200)
                lost_race = "BindException" in log_text or "Address already in use" in log_text
                if not (lost_race and attempt < attempts):
                    raise
                log.warning("master lost a race for its port, retrying with new ports")
                kill_daemons([self._master])
                self._master = None

    def _deadline_left(self, t0: float) -> float:
        return self.start_timeout - (time.monotonic() - t0)

    def _wait_master(self, t0: float) -> None:
        assert self._master is not None
        last_error: Exception | None = None
        while True:
            if self._master.proc.poll() is not None:
                raise ClusterError(
                    f"expected the Spark master to start on {self.host}:{self._master_port} "
                    f"(UI port {self._ui_port}), but {self._master.describe_exit()}"
                )
            try:
                status = self._fetch_status(timeout=2.0)
                if status.get("status") == "ALIVE":
                    return
                last_error = ClusterError(f"master status is {status.get('status')!r}")
            except (urllib.error.URLError, OSError, ValueError) as exc:
                last_error = exc
            if self._deadline_left(t0) <= 0:
                raise ClusterError(
                    f"expected the Spark master to answer on http://{self.host}:{self._ui_port}/json/ "
                    f"with status ALIVE within {self.start_timeout:.0f}s, last error: {last_error}; "
                    f"raise start_timeout on a slow machine. Last lines of {self._master.log_path}:\n"
                    f"{tail(self._master.log_path)}"
                )
            time.sleep(0.2)

    def _start_workers(self, spark_home: str, env: dict[str, str], t0: float) -> None:
        self._spark_home, self._env = spark_home, env
        for _ in range(self.workers):
            self._launch_worker()
        self._wait_alive(self.workers, t0)

    def _launch_worker(self) -> None:
        assert self._root is not None
        i = len(self._worker_daemons)
        work_dir = self._root / "work" / f"worker-{i}"
        work_dir.mkdir(parents=True, exist_ok=True)
        env = self._env
        opts = f"{_WORKER_PROPERTIES} {worker_resource_opts(self.worker_resources, i, self._root / 'resources')}"
        worker_env = dict(env, SPARK_WORKER_OPTS=f"{env.get('SPARK_WORKER_OPTS', '')} {opts}".strip())
        self._worker_daemons.append(self._launch(
            f"worker-{i}", [_WORKER_CLASS, "--host", self.host, "--cores", str(self.cores_per_worker),
                            "--memory", f"{self.worker_memory_mb}m", "--work-dir", str(work_dir),
                            "--webui-port", "0", f"spark://{self.host}:{self._master_port}"],
            self._spark_home, worker_env))

    def add_worker(self) -> int:
        """Start one more worker daemon (as a machine joining the cluster); returns its index once it is ALIVE."""
        with self._lock:
            self._require_started()
            self._launch_worker()
            self._wait_alive(len(self.alive_workers()) + 1, time.monotonic())
            return len(self._worker_daemons) - 1

    def kill_worker(self, index: int | None = None) -> int:
        """SIGKILL worker daemon `index` (None: the first one alive) with its executors and their Python workers,
        as a lost machine; returns its index."""
        with self._lock:
            index = self._first_alive() if index is None else index
            kill_tree(self._worker_daemons[index].proc.pid)
            self._worker_daemons[index].proc.wait()
            return index

    def pause_worker(self, index: int | None = None, paused: bool = True) -> int:
        """SIGSTOP worker daemon `index` (None: the first one alive) with everything below it, as a hung machine
        (``docker pause``), or wake it (`paused` False); returns its index."""
        with self._lock:
            index = self._first_alive() if index is None else index
            kill_tree(self._worker_daemons[index].proc.pid, signal.SIGSTOP if paused else signal.SIGCONT)
            return index

    def decommission_worker(self, index: int | None = None) -> int:
        """Decommission worker daemon `index` (None: the first one alive) as a cluster manager does before it takes
        a machine away (SIGPWR, Spark's graceful leave): its executors finish their running tasks and take no new
        ones; returns its index. The daemon stays up, DECOMMISSIONED at the master."""
        with self._lock:
            index = self._first_alive() if index is None else index
            os.kill(self._worker_daemons[index].proc.pid, signal.SIGPWR)
            return index

    def _first_alive(self) -> int:
        return next(i for i, d in enumerate(self._worker_daemons) if d.proc.poll() is None)

    def _wait_alive(self, expected: int, t0: float) -> None:
        alive: list[dict[str, Any]] = []
        while True:
            for d in self._all_daemons():
                if d.proc.poll() is not None and d.proc.returncode != -9:  # -9: kill_worker's
                    raise ClusterError(
                        f"expected {expected} Spark worker(s) to register with the master, but "
                        f"{d.describe_exit()}"
                    )
            try:
                status = self._fetch_status(timeout=2.0)
                alive = [w for w in status.get("workers", []) if w.get("state") == "ALIVE"]
                if len(alive) >= expected:
                    return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            if self._deadline_left(t0) <= 0:
                tails = "\n".join(
                    f"--- {d.log_path}:\n{tail(d.log_path, 15)}" for d in self._worker_daemons
                )
                raise ClusterError(
                    f"expected {expected} ALIVE worker(s) at {self.ui_url}/json/ within "
                    f"{self.start_timeout:.0f}s, got {len(alive)}; raise start_timeout on a slow "
                    f"machine or read the worker logs:\n{tails}"
                )
            time.sleep(0.25)

    # ------------------------------------------------------------------ session

    def executor_memory_mb(self) -> int:
        """Default spark.executor.memory: half the worker memory (at least 512m, at most all of it)."""
        return min(self.worker_memory_mb, max(self.worker_memory_mb // 2, MIN_WORKER_MEMORY_MB))

    def session(self, app_name: str = "trainer", *, executor_timeout: float | None = None, **conf: Any):
        """A SparkSession connected to this cluster; returns once all its executors registered.

        Keyword arguments are Spark properties overriding the defaults, e.g.
        ``cluster.session("app", **{"spark.executor.memory": "1500m"})``.
        """
        self._require_started()
        settings = self._session_settings(conf)
        expected = self._expected_executors(settings)
        # Executor JVMs start after the driver's; on a loaded machine that takes a while.
        timeout = max(self.start_timeout, 180.0) if executor_timeout is None else executor_timeout
        spark = spark_session(
            self.master_url,
            app_name,
            cores_per_worker=self.cores_per_worker,
            expected_executors=expected,
            executor_timeout=timeout,
            **settings,
        )
        self._session = spark
        return spark

    def _session_settings(self, conf: dict[str, Any]) -> dict[str, Any]:
        return {
            "spark.executor.memory": f"{self.executor_memory_mb()}m",
            "spark.cores.max": str(self.workers * self.cores_per_worker),
            "spark.driver.host": self.host,
            "spark.driver.bindAddress": self.host,
            "spark.decommission.enabled": "true",  # executors leave gracefully when `decommission_worker` asks
            **conf,
        }

    def connect_server(self, port: int | None = None, **conf: Any) -> ConnectServer:
        """A started Spark Connect server (a driver) on this cluster, with the settings `session` would use.

        Clients connect with ``SparkSession.builder.remote(server.url)``; ``stop()``
        stops the server (this cluster's ``stop()`` does too).
        """
        self._require_started()
        settings = session_conf(self.master_url, "trainer-connect", self.cores_per_worker,
                                **self._session_settings(conf))
        server = ConnectServer(self.master_url, settings, host=self.host, port=port, log_dir=self._root,
                               start_timeout=max(self.start_timeout, 180.0))
        self._connect_servers.append(server)
        return server.start()

    def _expected_executors(self, settings: dict[str, Any]) -> int:
        if str(settings.get("spark.dynamicAllocation.enabled", "false")).lower() == "true":
            return 0  # Spark asks for executors when a job has tasks waiting
        exec_cores = int(settings.get("spark.executor.cores") or self.cores_per_worker)
        exec_mb = parse_memory_mb(str(settings.get("spark.executor.memory") or "1g"))
        cores_max = int(settings.get("spark.cores.max") or self.workers * self.cores_per_worker)
        if exec_cores > self.cores_per_worker:
            raise ValueError(
                f"expected spark.executor.cores <= cores_per_worker ({self.cores_per_worker}), got "
                f"{exec_cores}; no worker could host such an executor: lower it or start the cluster "
                f"with more cores_per_worker"
            )
        if exec_mb > self.worker_memory_mb:
            raise ValueError(
                f"expected spark.executor.memory <= worker_memory ({self.worker_memory}), got "
                f"{settings.get('spark.executor.memory')}; no worker could host such an executor: "
                f"lower it or start the cluster with more worker_memory"
            )
        per_worker = min(self.cores_per_worker // exec_cores, self.worker_memory_mb // exec_mb)
        return max(1, min(self.workers * per_worker, cores_max // exec_cores))

    def _stop_session(self) -> None:
        spark, self._session = self._session, None
        if spark is None:
            return
        try:
            sc = spark.sparkContext
            if sc._jsc is not None:
                spark.stop()
        except Exception as exc:  # the gateway may already be gone at interpreter exit
            log.debug("stopping the SparkSession failed: %s", exc)

    # ------------------------------------------------------------------ stop

    def stop(self) -> None:
        """Stop the session this cluster created, then workers, then the master; remove temp files.

        Idempotent; safe after a failed start().  Afterwards none of the cluster's
        processes (daemons, executors, their Python workers) is left.
        """
        with self._lock:
            self._stop_session()
            for server in self._connect_servers:
                server.stop()
            kill_daemons(self._worker_daemons)
            if self._master is not None:
                kill_daemons([self._master])
            # Python daemons forked by executors run in their own process groups; they
            # exit when their executor dies, but do not rely on it.
            if self._marker:
                kill_marked(self._marker)
            wait_groups_reaped(self.process_groups())
            if self._root is not None and self._owns_root and not self.keep_logs:
                shutil.rmtree(self._root, ignore_errors=True)
            if self._atexit_registered:
                atexit.unregister(self._stop_at_exit)
                self._atexit_registered = False
            if self._started:
                log.info("local Spark cluster %s stopped", self.master_url)
            self._started = False

    def _stop_at_exit(self) -> None:
        try:
            self.stop()
        except Exception as exc:
            log.warning("stopping the local Spark cluster at exit failed: %s", exc)

    def __repr__(self) -> str:
        where = self.master_url if self._started else "not started"
        return (
            f"LocalCluster(workers={self.workers}, cores_per_worker={self.cores_per_worker}, "
            f"worker_memory={self.worker_memory!r}, {where})"
        )

