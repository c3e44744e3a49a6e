"""The parameter server that runs in the Spark driver.

``ParameterServer`` owns the *center* variable (a list of numpy arrays) and
applies an ``Algorithm`` (see ``trainer.algorithms.base``) to the payloads that
workers commit over TCP:

* asynchronous algorithms: a payload is applied as soon as it arrives;
  staleness is the number of center updates since the committing connection
  last received the center (plus, for a worker that overlaps its commits,
  the updates its payload's older base missed: COMMIT meta ``"unseen"``,
  ``trainer.ps.commits``). Algorithms with an in-place form (``server_apply``:
  DOWNPOUR, ADAG, DynSGD, compressed) update the center tensor by tensor
  under one lock per tensor, into arrays that are swapped in as the center
  and sent as the reply without copies after every lock is released; the server's lock
  guards only its counters (``trainer.ps.center`` says how commits and
  readers stay consistent without it). Other algorithms run ``server_commit``
  under the server's lock. Frames of in-place commits are received into a
  buffer per connection, reused from frame to frame. The server also counts
  the minibatches that the workers of an attempt report for each epoch
  (COMMIT meta ``"batches"``) and returns the running total as
  ``"epoch_batches"``: workers use it to end an epoch together when they
  share its work (see ``trainer.runtime.ps_worker.worker_task``);
* synchronous algorithms: a round barrier waits until every worker has committed
  and the last arriving thread runs ``server_round`` (``trainer.ps.rounds``).

Serving comes from ``trainer.transport.endpoint.AuthenticatedServer``: one accept
thread and one daemon thread per connection; every socket has a timeout,
``handshake_timeout`` until the peer authenticated (mutual handshake, see
``trainer.transport.handshake``), then ``io_timeout``; every frame after the
handshake carries a MAC (``trainer.transport.frame_auth``). A peer that misbehaves
only loses its own connection.

Update hygiene (``trainer.ps.hygiene``): a COMMIT with another model's arrays,
another dtype than the model's, or any NaN or inf is refused with an ERROR
reply naming the worker, the weight and the step; so is a commit after which
the center would not be finite: in place, every tensor's new value is
checked before any is published, so a refused commit leaves the center
exactly as it was. The center is never non-finite. The first refusal is
kept in `failure`, which the trainer raises instead of retrying.

Attempt fencing: the server knows the current attempt of the training stage
(`start_attempt`, or the newest attempt a worker authenticated with).
Connections of older attempts are refused at the handshake, and every request
on a connection of an older attempt (a leftover task of a failed attempt) is
answered with an ERROR.

Memory stays bounded: update records go to a ring of `history_size` records
with exact running totals (``trainer.ps.records.UpdateLog``).

Algorithms must be pure (return new arrays, or write only into `out` in
``server_apply``) as the Algorithm contract requires. Shards: see
``trainer.ps.shards``.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

from trainer.ps.center import Center
from trainer.ps.commits import AsynchronousCommits
from trainer.ps.epochs import completed_epochs, uniform_progress
from trainer.ps.members import MemberTracking
from trainer.ps.ps_errors import PSNotStartedError
from trainer.ps.hygiene import check_commit, refusal, stale_attempt
from trainer.ps.records import DEFAULT_HISTORY_SIZE, UpdateLog, UpdateRecord
from trainer.ps.rounds import Round, SynchronousRounds
from trainer.transport.endpoint import AuthenticatedServer, Connection
from trainer.transport.tls import TlsIdentity
from trainer.transport.wire import Frame, Msg, RecvBuffer, encode

log = logging.getLogger("trainer.ps")

#: Most events kept in ParameterServer.events (oldest are dropped).
MAX_EVENTS = 10_000


class _Conn(Connection):
    """Server-side state of one TCP connection: the center version it last received and, for in-place
    algorithms, its receive buffer, allocated once; with compressed replies, its reply buffer (one array per
    center tensor, allocated once) and the center as its worker holds it (`held`, from its HELLO on)."""

    def __init__(self, sock: Any, addr: Any) -> None:
        super().__init__(sock, addr)
        self.last_version = 0
        self.recv = RecvBuffer()
        self.reply: list[np.ndarray] | None = None
        self.held: list[np.ndarray] | None = None
        self.member: dict[str, Any] | None = None  # who its worker is, as its HELLO said (elastic fits)
        self.claim: tuple[int, int] | None = None  # (epoch, worker) its HELLO took, if it named an epoch
        self.claim_token = 0  # which HELLO of that chunk and epoch it was (trainer.ps.members)
        self.heartbeat = False  # a member's heartbeat connection (trainer.ps.members)
        self.dropped = False  # its process left by silence (trainer.ps.members): it holds no chunk


class ParameterServer(AsynchronousCommits, SynchronousRounds, MemberTracking, AuthenticatedServer):
    """Parameter server holding the center variable; see the module docstring.

    Serving (listening, the handshake, one thread per connection, stopping)
    comes from :class:`~trainer.transport.endpoint.AuthenticatedServer`.

    Args:
        algorithm: an ``Algorithm`` (``synchronous`` picks commit vs round mode).
        center: the initial center (the model weights); copied.
        num_workers: workers are numbered ``0 .. num_workers - 1``.
        secret: shared secret of the handshake (``new_secret()``); tasks get it with
            the MAC and TLS settings as `credentials`.
        host, port: where to listen; ``port=0`` picks a free port.
        max_body: largest frame body accepted after authentication
            (default ``4 * nbytes(center) + 16 MiB``).
        io_timeout: longest silence tolerated from an authenticated worker
            (and longest send); must exceed the longest gap between two
            requests of a worker, e.g. one epoch when ``window`` is None.
        handshake_timeout: time a new connection has to authenticate.
        round_timeout: longest wait of a synchronous round for missing workers.
        max_connections: open connections allowed (default ``2 * num_workers + 4``).
        on_update: called with each ``UpdateRecord`` from the connection
            thread, before the worker gets its reply; calls are serialized and
            exceptions are logged. Keep it fast.
        on_epoch_done: called with ``(worker, epoch)`` after a worker reports
            a finished epoch, serialized with `on_update`.
        version, epochs_done: state to resume from (a checkpoint's), so that
            workers' HELLO gets the right ``start_epoch``.
        weight_names: the model's weight names (``v.path``), to name a refused array.
        frame_mac, tls, max_pending: see ``AuthenticatedServer``.
        history_size: update records kept (``updates``); totals count all.
        hello_meta: extra meta of every HELLO reply (a shard says which part of the model it holds).
        on_member, admit: an elastic fit's members and their admission (``trainer.ps.members``).
    """

    label = "parameter server"
    thread_prefix = "ps"
    not_started_type = PSNotStartedError
    wrong_secret_reply = ("authentication failed: the worker does not hold this server's secret "
                          "(pass the secret of the running ParameterServer to PSClient)")
    requests = "HELLO, PULL, COMMIT, EPOCH_DONE or BYE"

    def __init__(
        self,
        algorithm: Any,
        center: Sequence[np.ndarray],
        num_workers: int,
        secret: bytes,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_body: int | None = None,
        io_timeout: float = 600.0,
        handshake_timeout: float = 5.0,
        round_timeout: float = 600.0,
        max_connections: int | None = None,
        on_update: Callable[[UpdateRecord], Any] | None = None,
        on_epoch_done: Callable[[int, int], Any] | None = None,
        version: int = 0,
        epochs_done: dict[int, dict[str, Any]] | None = None,
        weight_names: Sequence[str] | None = None,
        frame_mac: bool | str = True,
        tls: bool | TlsIdentity = False,
        max_pending: int = 8,
        history_size: int = DEFAULT_HISTORY_SIZE,
        hello_meta: dict[str, Any] | None = None,
        on_member: Callable[[dict[str, Any]], Any] | None = None,
        admit: Callable[[dict[str, Any]], float] | None = None,
    ) -> None:
        if not round_timeout > 0:
            raise ValueError(f"round_timeout must be a positive number of seconds, received {round_timeout!r}")
        synchronous = bool(getattr(algorithm, "synchronous", False))
        with_optimizer = bool(getattr(algorithm, "exchanges_optimizer_state", False))
        in_place = callable(getattr(algorithm, "server_apply", None)) and not synchronous and not with_optimizer
        center = Center(center, in_place)
        center_bytes = center.nbytes
        names = None if weight_names is None else [str(n) for n in weight_names]
        if names is not None and len(names) > len(center):  # fewer: the center also holds optimizer state
            raise ValueError(f"weight_names has {len(names)} names for {len(center)} center arrays")
        super().__init__(num_workers, secret, host=host, port=port, io_timeout=io_timeout,
                         handshake_timeout=handshake_timeout, max_connections=max_connections, log=log,
                         max_body=4 * center_bytes + (16 << 20) if max_body is None else int(max_body),
                         frame_mac=frame_mac, tls=tls, max_pending=max_pending)
        check_workers = getattr(algorithm, "check_workers", None)
        if check_workers is not None:
            check_workers(num_workers)
        self._algorithm = algorithm
        self._synchronous = synchronous
        self._with_optimizer = with_optimizer
        self._payload_arrays = int(getattr(algorithm, "payload_arrays", 1))
        self._reply_codec = getattr(algorithm, "reply_codec", None)  # compressed replies (trainer.ps.commits)
        if self._reply_codec is not None and not center.in_place:
            raise ValueError(f"{algorithm.describe()}: compressed replies need an algorithm the server applies in "
                             "place (a delta algorithm without optimizer state)")
        # Arrays shaped and typed as a compressed reply's: what one weighs on the wire, whatever its values.
        self._reply_template = (None if self._reply_codec is None
                                else self._reply_codec.encode([np.zeros_like(a) for a in center.arrays]))
        self._hello_meta = dict(hello_meta or {})
        self._center = center
        self._num_weights = len(center)
        self._names = names
        self._round_timeout = float(round_timeout)
        self._on_update = on_update
        self._on_epoch_done = on_epoch_done
        self._init_members(on_member, admit)

        self._cond = threading.Condition(self._lock)
        self._callback_lock = threading.Lock()
        self._version = int(version)
        self._round = Round(0)
        self._attempt = 0  # the current attempt: requests of older ones are refused
        self._updates = UpdateLog(history_size)
        self._failure: str | None = None
        self._epochs_done: dict[int, dict[str, Any]] = dict(epochs_done or {})
        self._start_epochs: dict[int, int] = {}  # attempt -> epoch its workers start at
        self._epoch_batches: collections.Counter[tuple[int, int]] = collections.Counter()  # (attempt, epoch)
        self._events: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_EVENTS)
        self._directives: dict[str, Any] = {}

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> tuple[str, int]:
        """Bind, listen and start serving; returns the bound ``(host, port)``."""
        address = super().start()
        log.info("parameter server listening on %s:%d for %d workers (%s)", address[0], address[1],
                 self._num_workers, getattr(self._algorithm, "describe", lambda: type(self._algorithm).__name__)())
        return address

    def _stopping_locked(self) -> None:
        self._abort_round_locked("round aborted: the parameter server is stopping")

    def _stopped(self) -> None:
        log.info("parameter server on %s stopped after %d updates", self._address, self._version)

    # -- public state -----------------------------------------------------------

    @property
    def version(self) -> int:
        with self._lock:
            return self._version

    @property
    def num_workers(self) -> int:
        return self._num_workers

    def resize(self, num_workers: int) -> None:
        """Serve `num_workers` workers from the next attempt on (a retry on fewer or more slots).

        Only the epochs every worker finished carry over (rows are dealt anew);
        a pending synchronous round is aborted. Call it between attempts.
        """
        if type(num_workers) is not int or num_workers < 1:
            raise ValueError(f"num_workers must be a positive int, received {num_workers!r}")
        check_workers = getattr(self._algorithm, "check_workers", None)
        if check_workers is not None:
            check_workers(num_workers)
        with self._lock:
            previous = self._num_workers
            if num_workers == previous:
                return
            completed = completed_epochs(self._epochs_done, previous)
            self._epochs_done = uniform_progress(completed, num_workers)
            self._num_workers = num_workers
            self._max_connections = max(self._max_connections, 2 * num_workers + 4)
            self._events.append({"time": time.time(), "kind": "resized", "from": previous, "to": num_workers,
                                 "completed_epochs": completed})
            self._abort_round_locked(f"round aborted: the server now serves {num_workers} workers, not {previous}")
        log.warning("parameter server: now serving %d workers (was %d), %d epoch(s) completed",
                    num_workers, previous, completed)

    def direct(self, **directives: Any) -> None:
        """Send `directives` to the workers in every COMMIT, round and EPOCH_DONE reply from now on:
        ``stop=True`` (the driver's callbacks stopped training; a pending round ends without an
        update) or ``learning_rate=x`` (workers set their optimizer's rate)."""
        with self._cond:
            self._directives.update(directives)
            self._events.append({"time": time.time(), "kind": "directive", **directives})
            if directives.get("stop"):  # workers waiting in a round are released without an update
                self._round = Round(self._round.number + 1)
            self._cond.notify_all()

    @property
    def max_body(self) -> int:
        return self._max_body

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """Where workers connect: this one endpoint (a ``ShardedParameterServer`` has one per shard)."""
        return [self.address]

    def center(self) -> list[np.ndarray]:
        """Writable copies of the current center arrays (a consistent state, see ``trainer.ps.center``)."""
        return self.snapshot()[0]

    def snapshot(self) -> tuple[list[np.ndarray], int, dict[int, dict[str, Any]]]:
        """A consistent (center copy, version, epochs done per worker) for checkpoints: the copy holds
        exactly the updates up to `version` (in place: read hand over hand behind the last commit)."""
        def counters() -> tuple[list[np.ndarray], int, dict[int, dict[str, Any]]]:
            with self._lock:
                return self._center.arrays, self._version, {w: dict(d) for w, d in self._epochs_done.items()}

        if self._center.in_place:
            arrays, (_, version, done) = self._center.read(self._center.buffers(), counters)
            return arrays, version, done
        center, version, done = counters()  # replaced, never changed: copied outside the lock
        return [np.array(a, copy=True) for a in center], version, done

    @property
    def updates(self) -> list[UpdateRecord]:
        """The most recent `history_size` update records, oldest first."""
        with self._lock:
            return self._updates.records()

    def update_history(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """(the kept update records as numpy columns, exact totals over every update); see ``UpdateLog``."""
        with self._lock:
            return self._updates.columns(), self._updates.totals()

    @property
    def failure(self) -> str | None:
        """Why the first refused COMMIT was refused (None while every commit was fine)."""
        with self._lock:
            return self._failure

    @property
    def attempt(self) -> int:
        """The current attempt; older attempts are fenced off."""
        with self._lock:
            return self._attempt

    def start_attempt(self, attempt: int) -> None:
        """The driver launches `attempt` now: from here on, older attempts are refused."""
        if type(attempt) is not int or attempt < 0:
            raise ValueError(f"attempt must be an int >= 0, received {attempt!r}")
        with self._lock:
            self._advance_attempt_locked(attempt, None, "the driver started it")

    @property
    def epochs_done(self) -> dict[int, dict[str, Any]]:
        """``{worker: {"epoch": last completed epoch, "logs": {...}, "time": t}}``."""
        with self._lock:
            return {w: dict(v) for w, v in self._epochs_done.items()}

    @property
    def events(self) -> list[dict[str, Any]]:
        """Notable events, oldest first: ``{"time", "kind", ...}``."""
        with self._lock:
            return list(self._events)

    @property
    def pending_workers(self) -> list[int]:
        """Workers that committed to the pending synchronous round and are waiting for the others."""
        with self._lock:
            return sorted(self._round.payloads)

    def _new_connection(self, sock: Any, addr: Any) -> _Conn:
        return _Conn(sock, addr)

    def _refuse_worker(self, worker: int, attempt: int) -> str | None:
        with self._lock:
            current = self._attempt
        return stale_attempt(attempt, current) if attempt < current else super()._refuse_worker(worker, attempt)

    def _welcome(self, conn: Connection) -> dict[str, Any]:
        assert conn.attempt is not None
        with self._lock:
            self._advance_attempt_locked(conn.attempt, conn, f"worker {conn.worker} connected with it")
            return {"version": self._version, "num_workers": self._num_workers}

    def _closed(self, conn: Connection, said_bye: bool) -> None:
        worker = conn.worker
        if not self._stopping:  # the fit ended: the members did not leave
            self._member_event("bye" if said_bye else "lost", conn)
        with self._lock:
            if self._elastic:  # a chunk task that ended: its round goes on without it
                self._release_claim_locked(conn)
            elif (self._synchronous and self._round.payloads and worker not in self._round.payloads
                    and not any(c.worker == worker for c in self._conns)):
                self._abort_round_locked(
                    f"round aborted: worker {worker} ({conn.peer}) disconnected before committing to round "
                    f"{self._round.number}; its Spark task probably failed (see the executor logs)"
                )

    def _note(self, kind: str, **fields: Any) -> None:
        with self._lock:
            self._events.append({"time": time.time(), "kind": kind, **fields})

    def _advance_attempt_locked(self, attempt: int, conn: Connection | None, why: str) -> None:
        """Make `attempt` the current one if it is newer (caller holds the lock); aborts a pending round."""
        if attempt <= self._attempt:
            return
        previous, self._attempt = self._attempt, attempt
        self._events.append({"time": time.time(), "kind": "new_attempt", "attempt": attempt, "previous": previous,
                             "worker": conn.worker if conn else None, "peer": conn.peer if conn else None})
        self._abort_round_locked(f"round aborted: attempt {attempt} started ({why}; a Spark retry restarted tasks)")
        log.info("parameter server: attempt %d started (%s); attempt %d and older are refused", attempt, why,
                 previous)

    # -- requests -------------------------------------------------------------------

    def _recv_buffer(self, conn: _Conn) -> RecvBuffer | None:
        # In-place commits use a frame's arrays only while they are applied: one buffer per connection.
        # Rounds keep payloads until the round ends and other algorithms may keep them: a fresh buffer each.
        return conn.recv if self._center.in_place else None

    def _reply_buffer(self, conn: _Conn) -> list[np.ndarray]:
        if conn.reply is None:
            conn.reply = self._center.buffers()
        return conn.reply

    def _dispatch(self, conn: _Conn, frame: Frame) -> None:
        meta = frame.meta
        with self._lock:
            current = self._attempt
        if conn.attempt is not None and conn.attempt < current:
            self._note("stale_request", worker=conn.worker, attempt=conn.attempt, current=current,
                       request=frame.msg.name)
            self._reply_error(conn, stale_attempt(conn.attempt, current))
            return
        if frame.msg != Msg.HELLO and self._replaced(conn, frame.msg.name):
            return
        if frame.msg == Msg.HELLO:
            self._hello(conn, meta)
        elif frame.msg == Msg.PULL:
            arrays, (version,) = self._read_center(conn, lambda: ())
            try:
                self._reply(conn, {"version": version}, arrays)
            finally:
                self._release(arrays)
        elif frame.msg == Msg.COMMIT:
            # In place every result is checked before it is published: the values need no check of their own.
            problem = self._check_commit(frame, finite=not self._center.in_place)
            if problem is not None:
                self._refuse_commit(conn, frame, *problem)
            elif self._synchronous:
                self._commit_sync(conn, frame)
            elif self._center.in_place:
                self._commit_in_place(conn, frame)
            else:
                self._commit_async(conn, frame)
        elif frame.msg == Msg.EPOCH_DONE:
            self._epoch_done(conn, meta)
        else:
            self._unexpected(conn, frame)

    def _check_commit(self, frame: Frame, finite: bool = True) -> tuple[str, bool] | None:
        center = self._center.arrays  # replaced as a whole, never changed: its shapes need no lock
        return check_commit(frame.arrays, center, self._num_weights, self._names, self._with_optimizer,
                            getattr(self._algorithm, "check_payload", None), finite)  # compressed algorithms

    def _read_center(self, conn: _Conn, more: Callable[[], tuple]) -> tuple[list[np.ndarray], tuple]:
        """(the center to send `conn`, (version, *more())) of one consistent state; `conn` has received
        that version from now on. In place the center is copied into arrays of its pool: `_release` them
        once sent."""
        def counters() -> tuple[list[np.ndarray], tuple]:
            with self._lock:
                conn.last_version = self._version
                return self._center.arrays, (self._version, *more())

        if self._center.in_place:
            arrays, (_, state) = self._center.read(None, counters)
            return arrays, state
        return counters()

    def _release(self, arrays: list[np.ndarray]) -> None:
        """`_read_center`'s arrays were sent."""
        if self._center.in_place:
            self._center.release(arrays)

    def _hello(self, conn: _Conn, meta: dict[str, Any]) -> None:
        attempt = meta.get("attempt", conn.attempt)
        if attempt != conn.attempt:
            self._reply_error(conn, f"HELLO 'attempt' must be the attempt this connection authenticated with "
                                    f"({conn.attempt}), received {attempt!r:.20}")
            return
        assert attempt is not None

        def start_epoch() -> tuple[int, int]:  # called under the lock
            # Every worker of an attempt starts at the first epoch that not all workers
            # had finished when the attempt began (fixed at its first HELLO, so a fast
            # worker's progress cannot move a slow worker's start): synchronous rounds
            # stay aligned and no epoch is skipped.
            if self._start_epochs.get(attempt) is None:
                self._start_epochs[attempt] = completed_epochs(self._epochs_done, self._num_workers)
            return self._start_epochs[attempt], self._num_workers

        if self._member_hello(conn, meta):  # an elastic fit's: a heartbeat, a wait or malformed (trainer.ps.members)
            return
        epoch, member, cold = meta.get("epoch"), meta.get("member"), meta.get("cold") is True
        center, (version, start, workers) = self._read_center(conn, start_epoch)
        try:
            meta = {"version": version, "start_epoch": start, "num_workers": workers, **self._hello_meta}
            meta.update(self._claim(conn, epoch, cold))  # a chunk's re-run skips what earlier attempts committed
            if self._reply_codec is not None:  # replies to its commits are changes of what it holds from now on
                conn.held = [np.array(a, copy=True) for a in center]
                meta["reply_codec"] = self._reply_codec.describe()
            self._reply(conn, meta, center)
        finally:
            self._release(center)
        self._member_said_hello(conn, member)

    def _epoch_done(self, conn: _Conn, meta: dict[str, Any]) -> None:
        epoch, logs = meta.get("epoch"), meta.get("logs", {})
        if type(epoch) is not int or epoch < 0 or not isinstance(logs, dict):
            self._reply_error(
                conn,
                f"EPOCH_DONE needs {{'epoch': int >= 0, 'logs': dict}}, received epoch={epoch!r:.20} and logs of "
                f"type {type(logs).__name__}",
            )
            return
        with self._lock:
            self._release_claim_locked(conn)  # an elastic chunk task's pass is over: no round waits for it
            previous = self._epochs_done.get(conn.worker)  # type: ignore[arg-type]
            if previous is None or epoch >= previous["epoch"]:
                record = {"epoch": epoch, "logs": logs, "time": time.time()}
                self._epochs_done[conn.worker] = record  # type: ignore[index]
        if self._on_epoch_done is not None:
            with self._callback_lock:
                try:
                    self._on_epoch_done(conn.worker, epoch)
                except Exception:
                    log.exception("parameter server: on_epoch_done callback raised (ignored)")
        self._reply(conn, dict(self._directives))

    def _refuse_commit(self, conn: _Conn, frame: Frame, problem: str, diverged: bool) -> None:
        """Answer a COMMIT that may not be applied; the first refusal becomes `failure`."""
        step, epoch = frame.meta.get("step"), frame.meta.get("epoch")
        text = refusal(conn.worker, step, epoch, problem, diverged)
        with self._lock:
            if self._failure is None:
                self._failure = text
            self._events.append({"time": time.time(), "kind": "commit_refused", "worker": conn.worker,
                                 "step": step, "epoch": epoch, "reason": problem})
        log.error("parameter server: %s", text)
        self._send(conn, encode(Msg.ERROR, {"error": text[:4000]}))

    def _record(
        self, conn: _Conn, frame: Frame, version: int, staleness: int, bytes_out: int, kind: str
    ) -> UpdateRecord:
        """Create and store an UpdateRecord (caller holds the lock)."""
        record = UpdateRecord.of(frame.meta, worker=conn.worker, version=version,  # type: ignore[arg-type]
                                 staleness=staleness, bytes_in=frame.nbytes, bytes_out=bytes_out, kind=kind)
        self._updates.append(record)
        return record

    def _notify(self, record: UpdateRecord) -> None:
        if self._on_update is None:
            return
        with self._callback_lock:
            try:
                self._on_update(record)
            except Exception:
                log.exception("parameter server: on_update callback raised (ignored)")
