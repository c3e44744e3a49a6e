"""The parameter server's side of an elastic fit: chunks, claims, members and their heartbeats.

An elastic fit's tasks (``trainer.runtime.ps_worker.chunk_task``) are the
server's "workers" one chunk of one epoch at a time, and the processes that
run them come and go (``trainer.fit.membership``). `MemberTracking`, mixed
into ``trainer.ps.server.ParameterServer``, adds what that needs to a HELLO
that names an ``epoch`` and a ``member`` (the process: host, pid, time to
ready):

* **counts**: the batches each chunk's applied commits counted, per epoch
  (`committed_batches`); a HELLO's reply says them, so a re-run skips them;
* **claims**: the newest HELLO of a chunk and epoch owns it; requests on an
  older connection of the same chunk and epoch are refused (``replaced``), so
  a task Spark gave up on (a hung executor that wakes) cannot train rows its
  re-run trains; the HELLO of a task attempt the driver killed (`fence_task`)
  is refused;
* **admission**: ``admit(member)`` may answer ``{"wait": seconds}`` with no
  center (the fit trains on its maximum);
* **heartbeats**: a HELLO with ``"heartbeat": True`` is answered at once with
  nothing; every process sends one every few seconds on a connection of its
  own, so a process that goes away between two tasks, or hangs, is noticed
  too;
* **events** for the driver (``on_member``): ``hello``, ``beat``, ``bye``
  and ``lost`` (a connection that ended without BYE), each naming the member
  and whether it came from a heartbeat connection. They and ``admit`` are
  called from the connections' threads as they come, not serialized with the
  other callbacks (a slow epoch-end callback must not make a member look
  silent): they must be thread-safe (``trainer.fit.membership`` is).
"""

from __future__ import annotations

import collections
import itertools
import logging
import time
from typing import Any, Callable

log = logging.getLogger("trainer.ps")

#: Seconds between two heartbeats of a process (``trainer.runtime.ps_worker.chunk_task``).
HEARTBEAT_S = 1.0
#: Seconds without a heartbeat after which a member leaves (``trainer.fit.membership``): a few beats, so that a
#: loaded machine's late beat is not a leave.
SILENT_S = 5.0


def member_id(member: dict[str, Any]) -> str:
    """A process's name: ``host:pid``."""
    return f"{member.get('host', '?')}:{member.get('pid', '?')}"


class MemberTracking:
    """Mixed into the parameter server (the module docstring); the server calls `_init_members` first."""

    def _init_members(self, on_member: Callable[[dict[str, Any]], Any] | None,
                      admit: Callable[[dict[str, Any]], float] | None) -> None:
        self._on_member, self._admit_member = on_member, admit
        self._worker_batches: collections.Counter[tuple[int, int]] = collections.Counter()  # (epoch, worker)
        # (epoch, worker) -> the token of its newest HELLO (a number, not the connection: ended ones are not kept)
        self._claims: dict[tuple[int, int], int] = {}
        self._claimed: collections.Counter[int] = collections.Counter()  # epoch -> chunks claimed
        self._claim_tokens = itertools.count(1)
        self._elastic = on_member is not None or admit is not None
        # (epoch, worker) -> claim token of the chunk tasks training now: what an elastic round waits for
        self._training_claims: dict[tuple[int, int], int] = {}
        self._fenced_tasks: set[int] = set()  # Spark task attempts the driver killed (`fence_task`)

    def committed_batches(self, epoch: int, worker: int) -> int:
        """The batches of `epoch` that `worker`'s applied commits counted (COMMIT meta ``"batches"``)."""
        with self._lock:
            return self._worker_batches[(epoch, worker)]

    def claimed_chunks(self, epoch: int) -> int:
        """How many chunks of `epoch` a task has taken (said HELLO for)."""
        with self._lock:
            return self._claimed[epoch]

    def fence_task(self, task: int) -> None:
        """Refuse the HELLO of Spark task attempt `task` from now on: the driver kills it (a cold task at a fit's
        end), and its Python worker may still finish starting and say HELLO after its re-run took the chunk."""
        with self._lock:
            self._fenced_tasks.add(int(task))

    def chunks_in_hand(self, epoch: int) -> set[int]:
        """The chunks of `epoch` that a connected task holds: its HELLO was the newest of its chunk and epoch and
        its process was not dropped (a task launched but still starting holds none, nor does a hung one)."""
        with self._lock:
            return {conn.claim[1] for conn in self._conns if conn.claim is not None and conn.claim[0] == epoch
                    and self._claims.get(conn.claim) == conn.claim_token and not conn.dropped}

    def _count_batches_locked(self, epoch: int, worker: int, batches: int) -> None:
        self._worker_batches[(epoch, worker)] += batches

    def _member_event(self, event: str, conn: Any) -> None:
        if self._on_member is None or conn.member is None:
            return
        try:  # not under the callbacks' lock: a slow epoch-end callback must not make the members look silent
            self._on_member({"event": event, "time": time.time(), "worker": conn.worker, "peer": conn.peer,
                             "member": conn.member, "heartbeat": conn.heartbeat})
        except Exception:
            log.exception("parameter server: on_member callback raised (ignored)")

    def _replaced(self, conn: Any, request: str) -> bool:
        """Refuse (and say True for) a request on a connection whose chunk and epoch a newer HELLO took over."""
        if conn.claim is None:
            return False
        with self._lock:
            replaced = self._claims.get(conn.claim) != conn.claim_token
        if replaced:
            self._note("replaced_request", worker=conn.worker, epoch=conn.claim[0], request=request)
            self._reply_error(conn, f"replaced: a newer task of worker {conn.worker} in epoch {conn.claim[0]} took "
                                    "over (a Spark re-run after this task was thought lost)")
        return replaced

    def _member_hello(self, conn: Any, meta: dict[str, Any]) -> bool:
        """A HELLO's member fields checked; True when they answered it (an error, a heartbeat, a wait)."""
        epoch, member = meta.get("epoch"), meta.get("member")
        if (epoch is not None and (type(epoch) is not int or epoch < 0)) or (
                member is not None and not isinstance(member, dict)):
            self._reply_error(conn, f"HELLO's 'epoch' must be an int >= 0 and its 'member' a dict, received "
                                    f"{epoch!r:.20} and {type(member).__name__}")
            return True
        if member is None:
            return False
        task = meta.get("task")
        with self._lock:
            fenced = type(task) is int and task in self._fenced_tasks
        if fenced:
            self._note("fenced_task", worker=conn.worker, epoch=epoch, task=task)
            self._reply_error(conn, f"fenced: Spark task attempt {task} was killed; its chunk runs again elsewhere")
            return True
        if meta.get("heartbeat"):
            conn.heartbeat = True
            conn.member = {k: member[k] for k in list(member)[:8]}
            self._reply(conn, {})
            self._member_event("beat", conn)
            return True
        if self._admit_member is not None:
            wait = self._admit_member(member)
            if wait > 0:
                self._reply(conn, {"wait": float(wait)})
                return True
        return False

    def _claim(self, conn: Any, epoch: int | None, cold: bool = False) -> dict[str, Any]:
        """The HELLO reply's part for a task that names its epoch: it owns its chunk of that epoch from now on.
        A round waits for it from now on, or from its first commit when it is `cold` (its process's first task,
        whose first step compiles: the others do not wait for that)."""
        if epoch is None:
            return {}
        with self._lock:
            conn.claim, conn.claim_token = (epoch, conn.worker), next(self._claim_tokens)
            if conn.claim not in self._claims:
                self._claimed[epoch] += 1
            self._claims[conn.claim] = conn.claim_token
            if not cold:
                self._training_claims[conn.claim] = conn.claim_token
            return {"committed_batches": self._worker_batches[conn.claim]}

    def drop_member(self, name: str) -> None:
        """The process `name` (``host:pid``) left by silence: no round waits for its tasks any more."""
        with self._lock:
            for conn in list(self._conns):
                if member_id(conn.member or {}) == name:
                    conn.dropped = True
                    self._release_claim_locked(conn)

    def _member_said_hello(self, conn: Any, member: dict[str, Any] | None) -> None:
        if member is not None:
            conn.member = {k: member[k] for k in list(member)[:8]}
            self._member_event("hello", conn)
