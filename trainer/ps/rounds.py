"""Synchronous rounds of the parameter server: the barrier, ``server_round`` and aborted rounds.

A round waits until every worker has committed; the last arriving thread runs
the algorithm's ``server_round`` under the server's lock and every waiter gets its
own reply. A round is aborted (every waiter gets an ERROR reply starting with
``"round aborted:"``) when a worker disconnects before committing, when
``round_timeout`` expires, when a Spark retry starts a new attempt, or when
the server stops -- nobody ever hangs.

`SynchronousRounds` is a part of ``ParameterServer`` (a mixin): it uses the
server's lock and condition, counters, center, directives and events. Rounds
keep the payloads of every worker until the round ends, so their frames are
received into fresh buffers, never into a connection's reused one, and the
center is replaced as a whole (``trainer.ps.center``, replaced mode).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from trainer.ps.hygiene import DIVERGED_HINT, check_center, freeze
from trainer.transport.wire import Frame, Msg, ProtocolError, encode, frame_size

log = logging.getLogger("trainer.ps")


class Round:
    """A pending synchronous round."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.payloads: dict[int, list[np.ndarray]] = {}
        self.staleness: dict[int, int] = {}
        self.replies: list[list[np.ndarray]] | None = None
        self.version: int | None = None
        self.error: str | None = None


class SynchronousRounds:
    """The round barrier of ``ParameterServer`` (see the module docstring)."""

    _round: Round

    def _commit_sync(self: Any, conn: Any, frame: Frame) -> None:
        worker = conn.worker
        assert worker is not None
        with self._cond:
            rnd = self._round
            stopped = False
            if self._stopping:
                error: str | None = "round aborted: the parameter server is stopping"
            elif self._directives.get("stop"):
                error, stopped = None, True
            elif worker in rnd.payloads:
                error = (
                    f"worker {worker} already committed to round {rnd.number}; each worker commits once per round "
                    f"(is another task running as worker {worker}?)"
                )
            else:
                error = None
                rnd.payloads[worker] = frame.arrays
                rnd.staleness[worker] = self._version - conn.last_version
                if len(rnd.payloads) == self._num_workers:
                    self._finish_round_locked(rnd)
                else:
                    deadline = time.monotonic() + self._round_timeout
                    while rnd.replies is None and rnd.error is None and not self._directives.get("stop"):
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            missing = sorted(set(range(self._num_workers)) - set(rnd.payloads))
                            self._abort_round_locked(
                                f"round aborted: round {rnd.number} timed out after round_timeout="
                                f"{self._round_timeout}s waiting for workers {missing}"
                            )
                            break
                        self._cond.wait(remaining)
                error = rnd.error
                stopped = error is None and rnd.replies is None
            record = None
            if stopped:  # the driver stopped training: no update, the worker ends
                buffers = encode(Msg.OK, {"version": self._version, **self._directives})
            elif error is None:
                assert rnd.replies is not None and rnd.version is not None
                conn.last_version = rnd.version
                try:
                    buffers = encode(Msg.OK, {"version": rnd.version, "round": rnd.number, **self._directives},
                                     rnd.replies[worker])
                except ProtocolError as exc:
                    error = f"server_round returned a reply that cannot be sent: {exc}"
                    log.error("parameter server: %s", error)
                else:
                    record = self._record(
                        conn, frame, rnd.version, rnd.staleness[worker], frame_size(buffers), "round"
                    )
            if error is not None:
                buffers = encode(Msg.ERROR, {"error": error})
        if record is not None:
            self._notify(record)
        self._send(conn, buffers)

    def _finish_round_locked(self: Any, rnd: Round) -> None:
        payloads = [rnd.payloads[i] for i in range(self._num_workers)]
        try:
            new_center, replies = self._algorithm.server_round(list(self._center.arrays), payloads)
            if len(replies) != self._num_workers:
                raise ValueError(f"server_round returned {len(replies)} replies for {self._num_workers} workers")
            new_center = freeze(new_center)
            problem = check_center(new_center, self._names)
            if problem is not None:
                self._failure = self._failure or f"refused round {rnd.number}: {problem}. {DIVERGED_HINT}"
                raise ValueError(f"{problem}; the center is unchanged")
        except Exception as exc:
            log.exception("parameter server: server_round failed")
            rnd.error = f"round aborted: server_round failed: {type(exc).__name__}: {exc}"
            self._events.append(
                {"time": time.time(), "kind": "round_aborted", "round": rnd.number, "reason": rnd.error}
            )
        else:
            self._center.arrays = new_center
            self._version += 1
            rnd.version = self._version
            rnd.replies = [list(r) for r in replies]
        self._round = Round(rnd.number + 1)
        self._cond.notify_all()

    def _abort_round_locked(self: Any, reason: str) -> None:
        """Abort the pending synchronous round (caller holds the lock)."""
        rnd = self._round
        if not rnd.payloads:
            return
        rnd.error = reason
        self._round = Round(rnd.number + 1)
        self._events.append({"time": time.time(), "kind": "round_aborted", "round": rnd.number, "reason": reason})
        log.warning("parameter server: %s", reason)
        self._cond.notify_all()
