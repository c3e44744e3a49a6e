"""Process groups of the embedded cluster's daemons, on Linux's ``/proc``.

Every daemon runs in its own session, so it leads its own process group
(worker -> executor JVMs) and can be stopped as a whole; the Python daemons
that executors fork run in other groups and are found by an environment
marker (``MARKER_ENV``). Nothing here knows about Spark beyond that.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from trainer.errors import ClusterError

log = logging.getLogger("trainer.spark")

MARKER_ENV = "TRAINER_LOCAL_CLUSTER"
STOP_GRACE_S = 10.0


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def ensure_port_free(host: str, port: int, what: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise ClusterError(
                f"expected {what} port {host}:{port} to be free, but binding it failed ({exc}); "
                f"another process uses it: choose another port or pass None to pick a free one"
            ) from exc


def tail(path: Path | None, lines: int = 40) -> str:
    if path is None:
        return "(no log)"
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 16384))
            data = f.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"(log {path} unreadable: {exc})"
    tail = "\n".join(data.splitlines()[-lines:])
    return tail if tail.strip() else "(log is empty)"


def pdeathsig_prefix() -> list[str]:
    """`setpriv --pdeathsig TERM --` so daemons get SIGTERM if this process dies without cleanup.

    Only on Linux with util-linux setpriv, and only from the main thread (the
    signal fires when the *thread* that forked the child exits).
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return []
    setpriv = shutil.which("setpriv")
    if not setpriv:
        return []
    global _SETPRIV_OK
    if _SETPRIV_OK is None:
        try:
            out = subprocess.run([setpriv, "--help"], capture_output=True, text=True, timeout=10)
            _SETPRIV_OK = "--pdeathsig" in (out.stdout + out.stderr)
        except (OSError, subprocess.TimeoutExpired):
            _SETPRIV_OK = False
    return [setpriv, "--pdeathsig", "TERM", "--"] if _SETPRIV_OK else []


_SETPRIV_OK: bool | None = None


def proc_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
        return stat.rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def group_alive(pgid: int) -> bool:
    """True if process group ``pgid`` has a member that is not a zombie."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not os.path.isdir("/proc"):
        return True
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getpgid(int(entry)) == pgid and proc_state(int(entry)) not in (None, "Z", "X"):
                return True
        except (ProcessLookupError, PermissionError, OSError):
            continue
    return False


def marked_pids(marker: str) -> list[int]:
    """PIDs of live processes whose environment carries ``MARKER_ENV=marker`` (Linux only)."""
    if not os.path.isdir("/proc"):
        return []
    needle = f"{MARKER_ENV}={marker}".encode() + b"\0"
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read() + b"\0"
        except OSError:
            continue
        if needle in environ and proc_state(int(entry)) not in (None, "Z", "X"):
            found.append(int(entry))
    return found


class Daemon:
    """A started daemon process, the leader of its own process group, and its log file."""

    def __init__(self, name: str, proc: subprocess.Popen, log_path: Path):
        self.name = name
        self.proc = proc
        self.log_path = log_path

    @property
    def pgid(self) -> int:
        return self.proc.pid  # start_new_session=True: the child leads its own group

    def describe_exit(self) -> str:
        return (
            f"the {self.name} process (pid {self.proc.pid}) exited with code {self.proc.returncode}; "
            f"last lines of {self.log_path}:\n{tail(self.log_path)}"
        )



def kill_daemons(daemons: list[Daemon], grace: float = STOP_GRACE_S) -> None:
    """SIGTERM every daemon's process group, SIGKILL what is left after `grace` seconds, reap them."""
    for d in daemons:
        if group_alive(d.pgid):
            try:
                os.killpg(d.pgid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    for d in daemons:
        try:
            d.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    while time.monotonic() < deadline and any(group_alive(d.pgid) for d in daemons):
        time.sleep(0.1)
    for d in daemons:
        if group_alive(d.pgid):
            log.warning("%s (process group %d) ignored SIGTERM for %.0fs; killing it", d.name, d.pgid, grace)
            try:
                os.killpg(d.pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for d in daemons:
        try:
            d.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log.warning("%s (pid %d) survived SIGKILL", d.name, d.proc.pid)


def kill_marked(marker: str, wait: float = 5.0) -> None:
    """Wait up to `wait` s for the processes carrying `marker` to exit, then SIGKILL the rest."""
    deadline = time.monotonic() + wait
    leftovers = marked_pids(marker)
    while leftovers and time.monotonic() < deadline:
        time.sleep(0.2)
        leftovers = marked_pids(marker)
    for pid in leftovers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_groups_reaped(pgids: list[int], timeout: float = 5.0) -> None:
    """Wait until no process (not even a zombie awaiting its reaper) is left in the groups."""
    deadline = time.monotonic() + timeout
    for pgid in pgids:
        while True:
            try:
                os.killpg(pgid, 0)
            except (ProcessLookupError, PermissionError):
                break
            if time.monotonic() >= deadline:
                if group_alive(pgid):
                    log.warning("process group %d still has live processes after stop()", pgid)
                break
            time.sleep(0.1)


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (children, their children, ...), read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    """Send `sig` to `pid` and every process below it at once: SIGKILL ends them as a lost machine does (no
    process outlives it to say goodbye, whatever its process group); SIGSTOP and SIGCONT pause and wake them as a
    hung machine (``docker pause``)."""
    for target in [pid, *descendants(pid)]:
        try:
            os.kill(target, sig)
        except ProcessLookupError:
            pass
