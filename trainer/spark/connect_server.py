"""A Spark Connect server started from the installed pyspark wheel, against any master.

The pyspark 4 wheel ships the ``spark-connect`` jar, so a server needs no
Spark download: ``spark-submit --class ...SparkConnectServer --master URL``
runs it in the foreground (a driver that clients reach over gRPC at
``sc://host:port``). `ConnectServer` starts it in its own process group,
waits until the port answers, and stops it (idempotent, also at interpreter
exit). ``LocalCluster.connect_server()`` starts one on the embedded cluster
with the same settings a classic session there would get; the tests use it to
run fits through a real Connect server.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from trainer.errors import ClusterError
from trainer.spark.java import check_java, find_spark_home
from trainer.spark.procs import Daemon, free_port, kill_daemons, pdeathsig_prefix, tail

log = logging.getLogger("trainer.spark")

_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"

__all__ = ["ConnectServer"]


class ConnectServer:
    """A Spark Connect server for `master` with the Spark properties `conf`; ``url`` is ``sc://host:port``.

    Use as a context manager, or call ``start()`` / ``stop()``. The server's
    log is ``<log_dir>/connect-server.log`` (a temporary directory by default).
    """

    def __init__(self, master: str, conf: dict[str, str] | None = None, *, host: str = "127.0.0.1",
                 port: int | None = None, log_dir: str | os.PathLike | None = None,
                 start_timeout: float = 180.0) -> None:  # fmt: skip
        if port is not None and not (0 < int(port) < 65536):
            raise ValueError(f"expected port in 1..65535 or None (pick a free one), got {port!r}")
        self.master = master
        self.conf = dict(conf or {})
        self.host = host
        self.port = int(port) if port is not None else None
        self.start_timeout = float(start_timeout)
        self._log_dir = Path(log_dir) if log_dir is not None else None
        self._daemon: Daemon | None = None

    @property
    def url(self) -> str:
        """The client's address: ``SparkSession.builder.remote(server.url)``."""
        if self.port is None:
            raise ClusterError("expected a started ConnectServer; call start() or use it in a 'with' block first")
        return f"sc://{self.host}:{self.port}"

    @property
    def log_path(self) -> Path | None:
        return self._daemon.log_path if self._daemon is not None else None

    def __enter__(self) -> "ConnectServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "ConnectServer":
        """Start the server; return once it accepts connections (or stop it and raise ClusterError)."""
        if self._daemon is not None:
            return self
        env = dict(os.environ)
        check_java(env)
        spark_home = find_spark_home()
        self.port = self.port or free_port(self.host)
        log_dir = self._log_dir or Path(tempfile.mkdtemp(prefix="trainer-connect-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        settings = {**self.conf, "spark.connect.grpc.binding.address": self.host,
                    "spark.connect.grpc.binding.port": str(self.port)}
        python = settings.get("spark.pyspark.python")
        if python:
            # The server builds Python UDFs with its own $PYSPARK_PYTHON, not the property.
            env["PYSPARK_PYTHON"] = python
            settings.setdefault("spark.executorEnv.PYSPARK_PYTHON", python)
        cmd = pdeathsig_prefix() + [os.path.join(spark_home, "bin", "spark-submit"), "--class", _SERVER_CLASS,
                                    "--master", self.master]
        for key, value in settings.items():
            cmd += ["--conf", f"{key}={value}"]
        env.update(SPARK_HOME=spark_home, SPARK_NO_DAEMONIZE="1")
        env.pop("SPARK_CONNECT_MODE_ENABLED", None)  # the server is a classic driver
        log_path = log_dir / "connect-server.log"
        with open(log_path, "ab") as logf:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, env=env,
                                    cwd=str(log_dir), start_new_session=True, close_fds=True)
        self._daemon = Daemon("Spark Connect server", proc, log_path)
        atexit.register(self.stop)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        log.info("Spark Connect server for %s listening at %s", self.master, self.url)
        return self

    def _wait_ready(self) -> None:
        assert self._daemon is not None
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self._daemon.proc.poll() is not None:
                raise ClusterError(f"expected the Spark Connect server to start, but {self._daemon.describe_exit()}")
            try:
                with socket.create_connection((self.host, self.port), timeout=1.0):
                    return
            except OSError:
                pass
            if time.monotonic() >= deadline:
                raise ClusterError(
                    f"expected the Spark Connect server to listen on {self.host}:{self.port} within "
                    f"{self.start_timeout:.0f}s; raise start_timeout on a slow machine. Last lines of "
                    f"{self._daemon.log_path}:\n{tail(self._daemon.log_path)}"
                )
            time.sleep(0.25)

    def stop(self) -> None:
        """Stop the server and its process group; idempotent."""
        daemon, self._daemon = self._daemon, None
        if daemon is None:
            return
        atexit.unregister(self.stop)
        kill_daemons([daemon])
        log.info("Spark Connect server for %s stopped", self.master)
