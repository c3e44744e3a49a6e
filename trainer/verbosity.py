"""What reaches the user's terminal: quiet by default, the libraries' chatter only when asked.

Quiet means: our own warnings and errors, the progress bar and what a command
prints on purpose. TensorFlow's C++ start-up banners (oneDNN, CPU features),
absl's and py4j's log lines, and Spark's INFO/WARN chatter on the driver stay
out of the way. ``TRAINER_LOG=info`` (or a command's ``--verbose``) shows our
INFO logs and TensorFlow's warnings; ``TRAINER_LOG=debug`` shows everything.

The same level reaches the executors: ``spark_session`` forwards
``TRAINER_LOG`` (``spark.executorEnv``) and every task calls
``trainer.runtime.process.configure_process``, which applies ``quiet_env``.
Environment variables must be set before TensorFlow starts, so importing
``trainer`` applies them in this process too.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import select
import sys
import tempfile
import threading
import time
import warnings
from typing import Iterator

#: Start-up lines the driver JVM prints to stderr whatever its log configuration says.
JVM_NOISE = (
    b"WARNING: Using incubator modules",
    b"Setting default log level to",
    b"To adjust logging level use sc.setLogLevel",
)

#: Lines TensorFlow (2.20+) prints at import through absl before any log level is read: TF_CPP_MIN_LOG_LEVEL
#: does not silence them.
TF_BANNERS = (
    b"All log messages before absl::InitializeLog() is called",
    b"oneDNN custom operations are on",
    b"This TensorFlow binary is optimized",
    b"To enable the following instructions",
)

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
ENV = "TRAINER_LOG"


def level() -> int:
    """The logging level asked for with ``TRAINER_LOG`` (default WARNING)."""
    name = os.environ.get(ENV, "warning").strip().lower()
    return LEVELS.get(name, logging.WARNING)


def quiet_env(log_level: int | None = None) -> dict[str, str]:
    """Environment for a process that imports TensorFlow: its C++ logs follow the level."""
    log_level = level() if log_level is None else log_level
    # 0 all, 1 no INFO (banners), 2 no WARNING, 3 no ERROR.
    tf_level = "0" if log_level <= logging.DEBUG else "1" if log_level <= logging.INFO else "2"
    return {"TF_CPP_MIN_LOG_LEVEL": tf_level, "ABSL_MIN_LOG_LEVEL": tf_level, "GRPC_VERBOSITY": "ERROR"}


def apply_quiet_env(log_level: int | None = None) -> None:
    """Set `quiet_env` in this process unless the user set the variables; silence known warnings."""
    for key, value in quiet_env(log_level).items():
        os.environ.setdefault(key, value)
    # PySpark's notice that it has not certified pandas 3 (the Arrow paths used here work with it).
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)


def configure_logging(verbose: bool = False) -> int:
    """Logging for a command: ``trainer.*`` at WARNING (INFO with `verbose` or TRAINER_LOG=info), libraries quieter.

    Returns the level chosen. Safe to call more than once.
    """
    chosen = min(level(), logging.INFO) if verbose else level()
    if verbose and ENV not in os.environ:
        os.environ[ENV] = "info"  # reaches the executors through spark_session
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        root.addHandler(handler)
    root.setLevel(logging.WARNING)
    for name in ("trainer", "jobs", "trainer_jobs"):
        logging.getLogger(name).setLevel(chosen)
    library = logging.DEBUG if chosen <= logging.DEBUG else logging.ERROR
    for name in ("py4j", "absl", "tensorflow", "matplotlib", "PIL"):
        logging.getLogger(name).setLevel(library)
    apply_quiet_env(chosen)
    return chosen


def import_keras_quietly() -> None:
    """Import Keras (and TensorFlow behind it) now, dropping TensorFlow's import banners (`TF_BANNERS`) unless
    TRAINER_LOG asks for INFO; every other line it prints passes through.

    For commands that will build a model anyway: the import happens here, with this process's stderr
    captured for its duration, instead of in the middle of the user's output.
    """
    if "keras" in sys.modules or level() <= logging.INFO:
        import keras  # noqa: F401  (deferred: TensorFlow starts only for commands that train)
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import keras  # noqa: F401  (deferred, as above)
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured:
                if not any(banner in line for banner in TF_BANNERS):
                    os.write(2, line)


def spark_log4j(log_level: int | None = None) -> str:
    """A log4j2 configuration for a driver JVM: WARN and above when verbose, else ERROR, known noise off."""
    log_level = level() if log_level is None else log_level
    root = "info" if log_level <= logging.DEBUG else "warn" if log_level <= logging.INFO else "error"
    return f"""\
# Written by trainer.verbosity for the driver JVM (TRAINER_LOG sets the level).
rootLogger.level = {root}
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
logger.hadoop.name = org.apache.hadoop.util.NativeCodeLoader
logger.hadoop.level = error
logger.jetty.name = org.sparkproject.jetty
logger.jetty.level = warn
"""


@contextlib.contextmanager
def quiet_child_stderr(drop: tuple[bytes, ...] = JVM_NOISE) -> Iterator[None]:
    """Child processes started inside this block write their stderr through a filter that drops the
    lines starting with one of `drop` and passes every other line on, for as long as they live.

    Used around the start of the driver JVM, whose start-up banners no log level silences. A no-op
    when TRAINER_LOG asks for INFO or more, or when stderr is not a real file descriptor.
    """
    try:
        target = os.dup(2)
    except OSError:
        yield
        return
    if level() <= logging.INFO:
        os.close(target)
        yield
        return
    read_end, write_end = os.pipe()
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(write_end, 2)
    os.close(write_end)
    # Named apart from the "trainer-" threads of a fit: it lives as long as the JVM, not one fit.
    pump = threading.Thread(target=_pump, args=(read_end, target, drop), name="jvm-stderr-filter", daemon=True)
    pump.start()
    if not _PUMPS:
        atexit.register(_drain_pumps)
    _PUMPS.append((pump, read_end))
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # this process writes to the terminal again; children keep the filter
        os.close(saved)


#: The filters started in this process and the pipes they read, drained at its exit (`_drain_pumps`).
_PUMPS: list[tuple[threading.Thread, int]] = []
#: The longest an exiting process waits for its filters to pass on what their pipes still hold.
DRAIN_S = 2.0


def _drain_pumps() -> None:
    """At exit, let each filter pass on what its children wrote: a daemon thread dies with the interpreter, and a
    busy machine had not yet scheduled it when a child's last line arrived (the line was lost). Where every child
    has exited the filter ends by itself once it has passed the rest on; where one still runs (the JVM) and its
    pipe is empty, the exit does not wait for it."""
    deadline = time.monotonic() + DRAIN_S
    for pump, read_end in _PUMPS:
        while pump.is_alive() and time.monotonic() < deadline:
            events = _pipe_events(read_end)
            if events & (select.POLLHUP | select.POLLNVAL):  # no writer left: the filter is passing on the rest
                pump.join(max(0.0, deadline - time.monotonic()))
            elif not events & select.POLLIN:  # a writer still runs and has said everything it wrote
                break
            time.sleep(0.01)
        pump.join(0.02)  # a last chunk read, being written


def _pipe_events(fd: int) -> int:
    """The poll events of the pipe `fd` now (POLLIN: bytes to read; POLLHUP: no writer left)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return dict(poller.poll(0)).get(fd, 0)


def _pump(read_end: int, target: int, drop: tuple[bytes, ...]) -> None:
    with os.fdopen(read_end, "rb", buffering=0) as source:
        pending = b""
        while chunk := source.read(65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if not line.startswith(drop):
                    os.write(target, line + b"\n")
        if pending and not pending.startswith(drop):
            os.write(target, pending)
    os.close(target)
