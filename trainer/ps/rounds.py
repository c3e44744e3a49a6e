"""Synchronous rounds of the parameter server: the barrier, ``server_round`` and aborted rounds.

A round waits until every worker has committed; the last arriving thread runs
the algorithm's ``server_round`` under the server's lock and every waiter gets its
own reply. A round is aborted (every waiter gets an ERROR reply starting with
``"round aborted:"``) when a worker disconnects before committing, when
``round_timeout`` expires, when a Spark retry starts a new attempt, or when
the server stops -- nobody ever hangs.

In an elastic fit (``trainer.ps.members``) the workers are chunk tasks that
come and go, so a round is not every worker's: it closes when every chunk
task training at that moment (a HELLO that named an epoch, no EPOCH_DONE,
BYE or lost connection since, not dropped for silence) has committed to it,
and a worker that leaves mid-round is no longer waited for instead of
aborting it (elastic local SGD, ``trainer.algorithms.elastic_local_sgd``).
Its payloads are keyed by the chunk and epoch a task claimed, since a chunk's
task of the next epoch may train beside this epoch's, and each applied
round counts the batches its commits hold for their chunk.

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
        self.payloads: dict[Any, list[np.ndarray]] = {}  # by worker, or by claimed (epoch, chunk) when elastic
        self.staleness: dict[Any, int] = {}
        self.batches: dict[Any, tuple[int, int]] = {}  # elastic: (epoch, batches) the commit holds
        self.replies: dict[Any, list[np.ndarray]] | None = None
        self.version: int | None = None
        self.error: str | None = None


class SynchronousRounds:
    """The round barrier of ``ParameterServer`` (see the module docstring)."""

    _round: Round

    def _round_key(self: Any, conn: Any) -> Any:
        return conn.claim if self._elastic and conn.claim is not None else conn.worker

    def _round_complete_locked(self: Any, rnd: Round) -> bool:
        if not self._elastic:
            return len(rnd.payloads) == self._num_workers
        return bool(rnd.payloads) and set(self._training_claims) <= set(rnd.payloads)

    def _missing_locked(self: Any, rnd: Round) -> list:
        expected = set(self._training_claims) if self._elastic else set(range(self._num_workers))
        return sorted(expected - set(rnd.payloads))

    def _release_claim_locked(self: Any, conn: Any) -> None:
        """An elastic round no longer waits for `conn`'s chunk task (it finished, left or was dropped)."""
        if conn.claim is not None and self._training_claims.get(conn.claim) == conn.claim_token:
            del self._training_claims[conn.claim]
            rnd = self._round
            if self._synchronous and self._round_complete_locked(rnd):
                self._finish_round_locked(rnd)

    def _commit_sync(self: Any, conn: Any, frame: Frame) -> None:
        worker = self._round_key(conn)
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
                if self._elastic and conn.claim is not None:
                    self._training_claims[conn.claim] = conn.claim_token  # a woken task trains again
                    rnd.batches[worker] = (frame.meta.get("epoch", conn.claim[0]), int(frame.meta.get("batches", 0)))
                if self._round_complete_locked(rnd):
                    self._finish_round_locked(rnd)
                else:
                    deadline = time.monotonic() + self._round_timeout
                    while rnd.replies is None and rnd.error is None and not self._directives.get("stop"):
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            missing = self._missing_locked(rnd)
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
        keys = sorted(rnd.payloads)
        payloads = [rnd.payloads[k] for k in keys]
        try:
            new_center, replies = self._algorithm.server_round(list(self._center.arrays), payloads)
            if len(replies) != len(keys):
                raise ValueError(f"server_round returned {len(replies)} replies for {len(keys)} workers")
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
            rnd.replies = {k: list(r) for k, r in zip(keys, replies)}
            for (_, chunk), (epoch, batches) in rnd.batches.items():
                self._count_batches_locked(epoch, chunk, batches)
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
