"""Who trains in an elastic fit, as the driver's parameter server sees it: pure bookkeeping, no Spark, no sockets.

An elastic fit (``Trainer(num_workers=(min, max))``, ``trainer.fit.elastic``)
has no fixed workers: Spark runs its chunk tasks on whatever executors it
has, and a worker is the Python process a task runs in (``host:pid``: a
reused Python worker trains one chunk after another with the model it built
once). `Membership` hears what the server hears, in order:

* ``hello``: a task of the process connected; ``beat``: its heartbeat (every
  `HEARTBEAT_S` seconds on a connection of its own, from its model's build to
  its end). The first of either is a **join** (its time to ready, process
  start to model built, is in the ``member`` meta); while `max_workers`
  processes are already training, `admit` tells a task to wait, so no more
  than the maximum train at once, whatever the slots Spark grants;
* ``bye``: a task ended and said so; the process stays a member, idle until
  Spark gives it its next chunk;
* ``lost``: a connection of the process (a task's or its heartbeat's) ended
  without BYE: the process or its machine went away, a **leave** noticed when
  its socket closes, not at Spark's network timeout; Spark re-runs its chunk
  elsewhere. A process that hangs (a paused container) keeps its sockets:
  `check` makes it leave after `SILENT_S` seconds without a heartbeat, and
  it joins again if it wakes (its task's requests are refused if Spark re-ran
  its chunk meanwhile, ``trainer.ps.members``);
* **retired**: the cluster manager decommissions the process's executor (Spark's
  graceful leave: a node drained, a spot instance's notice, SIGPWR): `retire`
  makes it leave at once, its running chunk finishes and commits (nothing is
  re-run) and it counts against the maximum until that task's BYE; no new
  chunk comes to it and its heartbeats no longer make it a member.

Each join and leave becomes an event of ``fitted.history.membership``
(time, epoch, the server's version as the step, workers before and after,
why) and a line above the progress bar.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from trainer.ps.members import SILENT_S, member_id


class Membership:
    """The members of an elastic fit and their changes (the module docstring).

    Args:
        max_workers: Integer. Processes that may train at once.
        epoch: Callable returning the epoch the fit is in (for the events).
        step: Callable returning the server's version (for the events).
        on_change: Called with each join or leave event (the progress line).
    """

    def __init__(self, max_workers: int, epoch: Callable[[], int] = lambda: 0, step: Callable[[], int] = lambda: 0,
                 on_change: Callable[[dict[str, Any]], Any] | None = None, silent_s: float = SILENT_S) -> None:
        self.max_workers, self.silent_s = int(max_workers), float(silent_s)
        self._epoch, self._step, self.on_change = epoch, step, on_change
        self._lock = threading.Lock()
        self.members: dict[str, dict[str, Any]] = {}  # name -> {"ready_s", "executor", "beat"}
        self.training: dict[str, int] = {}  # name -> open connections (a task of the process is training)
        self.gone: dict[str, float] = {}  # name -> when it left (it may come back: a hung process that wakes)
        self.retired: set[str] = set()  # processes on decommissioned executors: they do not come back
        self.events: list[dict[str, Any]] = []

    def admit(self, member: dict[str, Any]) -> float:
        """Seconds a process's task should wait before its HELLO is served (0: train now)."""
        name = member_id(member)
        with self._lock:
            busy = sum(1 for other, open_ in self.training.items() if open_ and other != name)
        return 0.0 if busy < self.max_workers else 0.5

    def idle(self) -> int:
        """How many members are alive with no task training (a process between two tasks)."""
        with self._lock:
            return sum(1 for name in self.members if not self.training.get(name))

    def heard(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """One event of the server (``hello``, ``beat``, ``bye``, ``lost``); returns the join or leave it makes, or
        None."""
        member = event.get("member") or {}
        name, kind, now = member_id(member), event["event"], event["time"]
        with self._lock:
            change = None
            if name in self.retired:  # its last task's end frees its place; nothing else of it counts
                if kind == "lost" or (kind == "bye" and not event.get("heartbeat")):
                    self.training[name] = max(0, self.training.get(name, 0) - 1) if kind == "bye" else 0
            elif kind in ("hello", "beat"):
                if name not in self.members:
                    again = name in self.gone
                    ready = member.get("ready_s")
                    self.members[name] = {"ready_s": ready, "executor": member.get("executor")}
                    why = (f"heard again after {now - self.gone.pop(name):.1f} s away" if again
                           else f"a new process, ready in {ready:.1f} s" if isinstance(ready, (int, float))
                           else "a new process")
                    change = self._change_locked("joined", name, event, len(self.members) - 1, why)
                self.members[name]["beat"] = now
                if kind == "hello":
                    self.training[name] = self.training.get(name, 0) + 1
            elif name in self.members and kind == "bye" and not event.get("heartbeat"):
                self.training[name] = max(0, self.training.get(name, 0) - 1)  # its task ended; it stays, idle
            elif name in self.members and kind == "lost":
                change = self._leave_locked(name, event, "its connection ended without a goodbye (process or host "
                                                         "lost)")
        self._changed(change)
        return change

    def check(self, now: float | None = None) -> list[dict[str, Any]]:
        """Members silent for more than `silent_s` seconds (no heartbeat: hung or cut off) leave; returns them."""
        now = time.time() if now is None else now
        with self._lock:
            silent = [name for name, info in self.members.items() if now - info.get("beat", now) > self.silent_s]
            changes = [self._leave_locked(name, {"time": now}, f"no heartbeat for {self.silent_s:.0f} s (hung or cut "
                                                               "off)") for name in silent]
        for change in changes:
            self._changed(change)
        return changes

    def retire(self, executors: set[str], now: float | None = None) -> list[dict[str, Any]]:
        """Members on the decommissioned `executors` leave for good, their running tasks left to finish (the
        module docstring); returns their leaves."""
        now = time.time() if now is None else now
        with self._lock:
            names = [name for name, info in self.members.items() if info.get("executor") in executors]
            self.retired.update(names)
            changes = [self._leave_locked(name, {"time": now}, "its executor was decommissioned (a graceful leave: "
                                          "its running chunk finishes, no new one comes)", keep_training=True)
                       for name in names]
        for change in changes:
            self._changed(change)
        return changes

    def _leave_locked(self, name: str, event: dict[str, Any], why: str,
                      keep_training: bool = False) -> dict[str, Any]:
        info = self.members.pop(name)
        if not keep_training:  # a retired process keeps its place until its task ends, and never comes back
            self.training.pop(name, None)
            self.gone[name] = event["time"]
        change = self._change_locked("left", name, event, len(self.members) + 1, why)
        if info.get("executor") is not None:
            change["executor"] = info["executor"]
        return change

    def _changed(self, change: dict[str, Any] | None) -> None:
        if change is not None and self.on_change is not None:
            self.on_change(change)

    def _change_locked(self, what: str, name: str, event: dict[str, Any], before: int, why: str) -> dict[str, Any]:
        change = {"time": event["time"], "event": what, "worker": name, "epoch": self._epoch(), "step": self._step(),
                  "workers_before": before, "workers_after": len(self.members), "why": why}
        if what == "joined":
            change["ready_s"] = self.members[name]["ready_s"]
        self.events.append(change)
        return change

    def line(self, change: dict[str, Any]) -> str:
        """The progress line of a join or leave."""
        verb = "joined" if change["event"] == "joined" else "left"
        return (f"worker {change['worker']} {verb} in epoch {change['epoch'] + 1} "
                f"({change['workers_before']} -> {change['workers_after']} workers: {change['why']})")

    def timeline(self) -> list[dict[str, Any]]:
        """The join and leave events, oldest first."""
        with self._lock:
            return sorted(self.events, key=lambda e: e["time"])

