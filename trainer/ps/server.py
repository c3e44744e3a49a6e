"""The parameter server that runs in the Spark driver.

``ParameterServer`` owns the *center* variable (a list of numpy arrays) and
applies an ``Algorithm`` (see ``trainer.algorithms.base``) to the payloads that
workers commit over TCP:

* asynchronous rules: ``server_commit`` runs under a lock as soon as one
  payload arrives; staleness is the number of center updates since the
  committing connection last received the center. The server also counts
  the minibatches that the workers of an attempt report for each epoch
  (COMMIT meta ``"batches"``) and returns the running total as
  ``"epoch_batches"``: workers use it to end an epoch together when they
  share its work (see ``trainer.worker``);
* synchronous rules: a round barrier waits until every worker has committed,
  the last arriving thread runs ``server_round`` and every waiter gets its own
  reply. A round is aborted (every waiter gets an ERROR reply starting with
  ``"round aborted:"``) when a worker disconnects before committing, when
  ``round_timeout`` expires, when a Spark retry starts a new attempt, or when
  the server stops -- nobody ever hangs.

Threads: one accept thread (woken by a self-pipe on ``stop()``) and one
daemon thread per connection. Every socket has a timeout: ``handshake_timeout``
until the peer authenticated (HMAC challenge, see ``trainer.ps.wire``), then
``io_timeout``. A peer that misbehaves only loses its own connection.

The stored center arrays are private read-only copies: update rules must be
pure (return new arrays) as the Algorithm contract requires.
"""

from __future__ import annotations

import collections
import hmac
import logging
import selectors
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from trainer.ps.wire import (
    ALLOWED_DTYPES,
    PREAUTH_MAX_BODY,
    PREAUTH_MAX_META,
    PROTOCOL_VERSION,
    ConnectionClosed,
    Frame,
    Msg,
    ProtocolError,
    PSError,
    PSTimeout,
    auth_digest,
    check_secret,
    encode,
    frame_size,
    new_nonce,
    read_frame,
    send_buffers,
    write_frame,
)

log = logging.getLogger("trainer.ps")

#: How long stop() waits for the server's threads in total.
STOP_JOIN_TIMEOUT = 5.0
#: Most events kept in ParameterServer.events (oldest are dropped).
MAX_EVENTS = 10_000


class PSNotStartedError(PSError):
    """The parameter server was used before start() (or restarted after stop())."""


@dataclass(frozen=True)
class UpdateRecord:
    """One commit applied to the center (one per worker for synchronous rounds)."""

    time: float
    worker: int
    version: int  # center version right after this update
    staleness: int
    bytes_in: int  # size of the COMMIT frame
    bytes_out: int  # size of the reply frame
    epoch: int | None
    step: int | None
    loss: float | None
    kind: str  # "commit" (asynchronous) or "round" (synchronous)


class _Conn:
    """Server-side state of one TCP connection."""

    def __init__(self, sock: socket.socket, addr: Any) -> None:
        self.sock = sock
        self.peer = _format_addr(addr)
        self.worker: int | None = None
        self.attempt: int | None = None
        self.last_version = 0  # center version this connection last received


class _Round:
    """Pending synchronous round."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.payloads: dict[int, list[np.ndarray]] = {}
        self.staleness: dict[int, int] = {}
        self.replies: list[list[np.ndarray]] | None = None
        self.version: int | None = None
        self.error: str | None = None


def _format_addr(addr: Any) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        return f"{addr[0]}:{addr[1]}"
    return str(addr)


def _freeze(arrays: Sequence[Any], what: str = "center") -> list[np.ndarray]:
    """Private read-only copies; raises ValueError for a dtype the wire cannot carry."""
    out = []
    for i, a in enumerate(arrays):
        c = np.array(a, copy=True)
        if c.dtype.name not in ALLOWED_DTYPES:
            raise ValueError(
                f"{what} array #{i} has dtype {c.dtype}, which the wire format cannot carry; "
                f"expected one of {sorted(ALLOWED_DTYPES)}"
            )
        c.setflags(write=False)
        out.append(c)
    return out


def completed_epochs(epochs_done: dict[int, dict[str, Any]], num_workers: int) -> int:
    """Epochs that every worker ``0 .. num_workers - 1`` finished (0 when one finished none)."""
    done = [epochs_done.get(w) for w in range(num_workers)]
    return 0 if None in done else min(d["epoch"] for d in done) + 1  # type: ignore[index]


def uniform_progress(completed: int, num_workers: int) -> dict[int, dict[str, Any]]:
    """Per-worker progress saying that each of `num_workers` workers finished `completed` epochs.

    Used when the number of workers changes (a retry on fewer workers, a resume
    on another cluster): rows are dealt anew, so only the epochs everybody
    finished carry over.
    """
    if completed <= 0:
        return {}
    return {w: {"epoch": completed - 1, "logs": {}, "time": time.time()} for w in range(num_workers)}


def _opt_int(value: Any) -> int | None:
    return value if type(value) is int else None


def _opt_float(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


class ParameterServer:
    """Parameter server holding the center variable; see the module docstring.

    Args:
        algorithm: an ``Algorithm`` (``synchronous`` picks commit vs round mode).
        center: the initial center (the model weights); copied.
        num_workers: workers are numbered ``0 .. num_workers - 1``.
        secret: shared secret of the HMAC handshake (``new_secret()``).
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
    """

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
        handshake_timeout: float = 10.0,
        round_timeout: float = 600.0,
        max_connections: int | None = None,
        on_update: Callable[[UpdateRecord], Any] | None = None,
        on_epoch_done: Callable[[int, int], Any] | None = None,
        version: int = 0,
        epochs_done: dict[int, dict[str, Any]] | None = None,
    ) -> None:
        if type(num_workers) is not int or num_workers < 1:
            raise ValueError(f"num_workers must be a positive int, received {num_workers!r}")
        for name, value in (
            ("io_timeout", io_timeout),
            ("handshake_timeout", handshake_timeout),
            ("round_timeout", round_timeout),
        ):
            if not value > 0:
                raise ValueError(f"{name} must be a positive number of seconds, received {value!r}")
        check_workers = getattr(algorithm, "check_workers", None)
        if check_workers is not None:
            check_workers(num_workers)
        self._algorithm = algorithm
        self._synchronous = bool(getattr(algorithm, "synchronous", False))
        self._with_optimizer = bool(getattr(algorithm, "exchanges_optimizer_state", False))
        self._center = _freeze(center)
        self._shapes = [a.shape for a in self._center]
        self._num_workers = num_workers
        self._secret = check_secret(secret)
        self._host = host
        self._port = port
        center_bytes = sum(a.nbytes for a in self._center)
        self._max_body = 4 * center_bytes + (16 << 20) if max_body is None else int(max_body)
        self._io_timeout = float(io_timeout)
        self._handshake_timeout = float(handshake_timeout)
        self._round_timeout = float(round_timeout)
        self._max_connections = 2 * num_workers + 4 if max_connections is None else int(max_connections)
        self._on_update = on_update
        self._on_epoch_done = on_epoch_done

        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._callback_lock = threading.Lock()
        self._version = int(version)
        self._round = _Round(0)
        self._max_attempt: int | None = None
        self._updates: list[UpdateRecord] = []
        self._epochs_done: dict[int, dict[str, Any]] = dict(epochs_done or {})
        self._start_epochs: dict[int, int] = {}  # attempt -> epoch its workers start at
        self._epoch_batches: collections.Counter[tuple[int, int]] = collections.Counter()  # (attempt, epoch)
        self._events: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_EVENTS)
        self._conns: set[_Conn] = set()
        self._threads: set[threading.Thread] = set()
        self._bytes_in = 0
        self._bytes_out = 0

        self._started = False
        self._stopping = False
        self._address: tuple[str, int] | None = None
        self._listener: socket.socket | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> tuple[str, int]:
        """Bind, listen and start serving; returns the bound ``(host, port)``."""
        with self._lock:
            if self._started or self._stopping:
                raise PSNotStartedError(
                    "this ParameterServer was already started (or stopped); a server cannot be started "
                    "twice, create a new one instead."
                )
            self._started = True
        listener = socket.socket(socket.AF_INET6 if ":" in self._host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self._host, self._port))
            listener.listen(max(16, self._max_connections))
            listener.setblocking(False)
        except OSError as exc:
            listener.close()
            self._stopping = True
            raise PSError(
                f"cannot listen on {self._host}:{self._port}: {exc}. Choose another port (port=0 picks a free one) "
                f"or a host address of this machine."
            ) from exc
        self._listener = listener
        bound = listener.getsockname()
        self._address = (bound[0], bound[1])
        self._wake_r, self._wake_w = socket.socketpair()
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name=f"ps-accept-{self._address[1]}", daemon=True
        )
        self._accept_thread.start()
        log.info(
            "parameter server listening on %s:%d for %d workers (%s)",
            self._address[0],
            self._address[1],
            self._num_workers,
            getattr(self._algorithm, "describe", lambda: type(self._algorithm).__name__)(),
        )
        return self._address

    def stop(self) -> None:
        """Stop serving (idempotent): abort any round, close every socket, join threads."""
        with self._lock:
            if not self._started or self._stopping:
                self._stopping = True
                return
            self._stopping = True
            self._abort_round_locked("round aborted: the parameter server is stopping")
            conns = list(self._conns)
            threads = list(self._threads)
        if self._wake_w is not None:
            try:
                self._wake_w.send(b"x")
            except OSError:
                pass
        for conn in conns:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + STOP_JOIN_TIMEOUT
        current = threading.current_thread()
        if self._accept_thread is not None and self._accept_thread is not current:
            self._accept_thread.join(max(0.0, deadline - time.monotonic()))
        if self._listener is not None:
            self._listener.close()  # no-op when the accept thread closed it
        for t in threads:
            if t is not current:
                t.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in threads if t.is_alive() and t is not current]
        if alive:
            log.warning("parameter server stopped but threads are still running: %s", alive)
        for s in (self._wake_r, self._wake_w):
            if s is not None:
                s.close()
        log.info("parameter server on %s stopped after %d updates", self._address, self._version)

    def __enter__(self) -> "ParameterServer":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- public state -----------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        if self._address is None:
            raise PSNotStartedError("the parameter server has no address yet: call start() first")
        return self._address

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

    @property
    def max_body(self) -> int:
        return self._max_body

    def center(self) -> list[np.ndarray]:
        """Writable copies of the current center arrays."""
        with self._lock:
            center = self._center
        return [np.array(a, copy=True) for a in center]

    def snapshot(self) -> tuple[list[np.ndarray], int, dict[int, dict[str, Any]]]:
        """A consistent (center copy, version, epochs done per worker) for checkpoints."""
        with self._lock:
            center, version = self._center, self._version
            done = {w: dict(d) for w, d in self._epochs_done.items()}
        return [np.array(a, copy=True) for a in center], version, done

    @property
    def updates(self) -> list[UpdateRecord]:
        with self._lock:
            return list(self._updates)

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

    @property
    def num_connections(self) -> int:
        """Open connections (authenticated or not)."""
        with self._lock:
            return len(self._conns)

    @property
    def bytes_received(self) -> int:
        with self._lock:
            return self._bytes_in

    @property
    def bytes_sent(self) -> int:
        with self._lock:
            return self._bytes_out

    # -- accept loop --------------------------------------------------------------

    def _accept_loop(self) -> None:
        listener = self._listener
        assert listener is not None and self._wake_r is not None
        selector = selectors.DefaultSelector()
        try:
            selector.register(listener, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while not self._stopping:
                for key, _ in selector.select():
                    if key.fileobj is self._wake_r or self._stopping:
                        return
                    try:
                        sock, addr = listener.accept()
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError as exc:
                        if self._stopping:
                            return
                        log.error("parameter server: accept() failed: %s", exc)
                        self._event("accept_error", error=str(exc))
                        time.sleep(0.05)  # e.g. out of file descriptors; do not spin
                        continue
                    self._admit(sock, addr)
        except Exception:
            log.exception("parameter server accept loop crashed")
        finally:
            selector.close()
            listener.close()

    def _admit(self, sock: socket.socket, addr: Any) -> None:
        peer = _format_addr(addr)
        with self._lock:
            self._threads = {t for t in self._threads if t.is_alive()}
            if self._stopping:
                reason = "the parameter server is stopping"
            elif len(self._conns) >= self._max_connections:
                reason = f"too many connections (max_connections={self._max_connections})"
            else:
                reason = None
                conn = _Conn(sock, addr)
                self._conns.add(conn)
                thread = threading.Thread(target=self._serve, args=(conn,), name=f"ps-conn-{peer}", daemon=True)
                self._threads.add(thread)
                thread.start()
        if reason is not None:
            log.warning("parameter server: refused connection from %s: %s", peer, reason)
            self._event("connection_refused", peer=peer, reason=reason)
            try:
                sock.settimeout(1.0)
                write_frame(sock, Msg.ERROR, {"error": f"connection refused: {reason}"})
            except (PSError, OSError):
                pass
            sock.close()

    # -- per connection ---------------------------------------------------------------

    def _serve(self, conn: _Conn) -> None:
        try:
            if not self._handshake(conn):
                return
            conn.sock.settimeout(self._io_timeout)
            while not self._stopping:
                try:
                    frame = read_frame(conn.sock, self._max_body)
                except ConnectionClosed as exc:
                    if self._stopping:
                        return
                    if exc.mid_frame:
                        self._peer_problem(conn, "disconnect", f"connection lost mid-frame: {exc}")
                    else:
                        log.info("parameter server: worker %s at %s disconnected without BYE", conn.worker, conn.peer)
                        self._event("disconnect", peer=conn.peer, worker=conn.worker, reason="closed without BYE")
                    return
                except PSTimeout:
                    self._peer_problem(
                        conn, "timeout", f"no request for io_timeout={self._io_timeout}s, closing the connection"
                    )
                    return
                except ProtocolError as exc:
                    self._peer_problem(conn, "protocol_error", str(exc))
                    self._try_send_error(conn, f"protocol error: {exc}")
                    return
                with self._lock:
                    self._bytes_in += frame.nbytes
                if frame.msg == Msg.BYE:
                    log.debug("parameter server: worker %s at %s said BYE", conn.worker, conn.peer)
                    return
                try:
                    self._dispatch(conn, frame)
                except (ConnectionClosed, PSTimeout) as exc:
                    if not self._stopping:
                        self._peer_problem(conn, "disconnect", f"could not send the reply: {exc}")
                    return
        except Exception:
            log.exception("parameter server: unexpected error serving %s", conn.peer)
        finally:
            self._drop(conn)

    def _handshake(self, conn: _Conn) -> bool:
        sock = conn.sock
        deadline = time.monotonic() + self._handshake_timeout
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        nonce = new_nonce()
        try:
            sock.settimeout(self._handshake_timeout)
            write_frame(
                sock,
                Msg.CHALLENGE,
                {"nonce": nonce.hex(), "protocol": PROTOCOL_VERSION, "num_workers": self._num_workers},
            )
            frame = read_frame(sock, PREAUTH_MAX_BODY, max_meta=PREAUTH_MAX_META, deadline=deadline)
            if frame.msg != Msg.AUTH:
                raise ProtocolError(f"expected an AUTH frame to answer the challenge, received {frame.msg.name}")
            worker, attempt, mac = frame.meta.get("worker"), frame.meta.get("attempt", 0), frame.meta.get("mac")
            if type(worker) is not int or type(attempt) is not int or attempt < 0 or not isinstance(mac, str):
                raise ProtocolError(
                    "AUTH meta must be {'worker': int, 'attempt': int >= 0, 'mac': hex string}, received "
                    f"worker={worker!r:.20}, attempt={attempt!r:.20}, mac of type {type(mac).__name__}"
                )
            try:
                given = bytes.fromhex(mac)
            except ValueError:
                given = b""
            if not hmac.compare_digest(given, auth_digest(self._secret, nonce, worker, attempt)):
                self._auth_failed(
                    conn,
                    "wrong HMAC",
                    "authentication failed: the worker does not hold this server's secret "
                    "(pass the secret of the running ParameterServer to PSClient)",
                )
                return False
            if not 0 <= worker < self._num_workers:
                self._auth_failed(
                    conn,
                    f"worker index {worker} out of range",
                    f"authentication failed: worker index {worker} is out of range, "
                    f"expected 0 <= worker < {self._num_workers}",
                )
                return False
            conn.worker, conn.attempt = worker, attempt
            with self._lock:
                self._bytes_in += frame.nbytes
                version = self._version
            self._note_attempt(conn, attempt)
            self._send(conn, encode(Msg.OK, {"version": version, "num_workers": self._num_workers}))
            log.debug("parameter server: %s authenticated as worker %d attempt %d", conn.peer, worker, attempt)
            return True
        except (ConnectionClosed, PSTimeout, ProtocolError) as exc:
            if self._stopping:
                return False
            kind = "timed out" if isinstance(exc, PSTimeout) else "failed"
            self._auth_failed(conn, f"handshake {kind}: {exc}", f"handshake {kind}: {exc}")
            return False

    def _auth_failed(self, conn: _Conn, why: str, reply: str) -> None:
        log.warning("parameter server: rejected unauthenticated peer %s: %s", conn.peer, why)
        self._event("auth_failed", peer=conn.peer, reason=why)
        self._try_send_error(conn, reply)

    def _try_send_error(self, conn: _Conn, text: str) -> None:
        try:
            conn.sock.settimeout(1.0)
            write_frame(conn.sock, Msg.ERROR, {"error": text})
        except (PSError, OSError):
            pass

    def _peer_problem(self, conn: _Conn, kind: str, text: str) -> None:
        log.warning("parameter server: worker %s at %s: %s", conn.worker, conn.peer, text)
        self._event(kind, peer=conn.peer, worker=conn.worker, reason=text)

    def _drop(self, conn: _Conn) -> None:
        with self._lock:
            self._conns.discard(conn)
            worker = conn.worker
            if (
                self._synchronous
                and worker is not None
                and self._round.payloads
                and worker not in self._round.payloads
                and not any(c.worker == worker for c in self._conns)
            ):
                self._abort_round_locked(
                    f"round aborted: worker {worker} ({conn.peer}) disconnected before committing to round "
                    f"{self._round.number}; its Spark task probably failed (see the executor logs)"
                )
        try:
            conn.sock.close()
        except OSError:
            pass

    def _event(self, kind: str, **fields: Any) -> None:
        with self._lock:
            self._events.append({"time": time.time(), "kind": kind, **fields})

    def _note_attempt(self, conn: _Conn, attempt: int) -> None:
        with self._lock:
            previous = self._max_attempt
            if previous is not None and attempt <= previous:
                return
            self._max_attempt = attempt
            if previous is None:
                return
            self._events.append(
                {
                    "time": time.time(),
                    "kind": "new_attempt",
                    "worker": conn.worker,
                    "attempt": attempt,
                    "peer": conn.peer,
                }
            )
            self._abort_round_locked(
                f"round aborted: worker {conn.worker} started attempt {attempt} (a Spark retry restarted tasks)"
            )
        log.warning("parameter server: worker %s connected with new attempt %d", conn.worker, attempt)

    def _abort_round_locked(self, reason: str) -> None:
        """Abort the pending synchronous round (caller holds the lock)."""
        rnd = self._round
        if not rnd.payloads:
            return
        rnd.error = reason
        self._round = _Round(rnd.number + 1)
        self._events.append({"time": time.time(), "kind": "round_aborted", "round": rnd.number, "reason": reason})
        log.warning("parameter server: %s", reason)
        self._cond.notify_all()

    # -- requests -------------------------------------------------------------------

    def _reply(self, conn: _Conn, meta: dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> int:
        return self._send(conn, encode(Msg.OK, meta, arrays))

    def _send(self, conn: _Conn, buffers: list) -> int:
        n = send_buffers(conn.sock, buffers)
        with self._lock:
            self._bytes_out += n
        return n

    def _error(self, conn: _Conn, text: str) -> None:
        log.warning("parameter server: request from worker %s at %s failed: %s", conn.worker, conn.peer, text)
        self._send(conn, encode(Msg.ERROR, {"error": text}))

    def _dispatch(self, conn: _Conn, frame: Frame) -> None:
        meta = frame.meta
        claimed = meta.get("worker", conn.worker)
        if claimed != conn.worker:
            self._error(
                conn,
                f"this connection authenticated as worker {conn.worker} but the {frame.msg.name} request says "
                f"worker {claimed!r:.20}; open one connection per worker",
            )
            return
        if frame.msg == Msg.HELLO:
            self._hello(conn, meta)
        elif frame.msg == Msg.PULL:
            with self._lock:
                center, version = self._center, self._version
                conn.last_version = version
            self._reply(conn, {"version": version}, center)
        elif frame.msg == Msg.COMMIT:
            problem = self._check_payload(frame.arrays)
            if problem is not None:
                self._error(conn, problem)
            elif self._synchronous:
                self._commit_sync(conn, frame)
            else:
                self._commit_async(conn, frame)
        elif frame.msg == Msg.EPOCH_DONE:
            self._epoch_done(conn, meta)
        else:
            self._error(
                conn, f"unexpected {frame.msg.name} request; expected HELLO, PULL, COMMIT, EPOCH_DONE or BYE"
            )

    def _hello(self, conn: _Conn, meta: dict[str, Any]) -> None:
        attempt = meta.get("attempt", conn.attempt)
        if type(attempt) is not int or attempt < 0:
            self._error(conn, f"HELLO 'attempt' must be an int >= 0, received {attempt!r:.20}")
            return
        conn.attempt = attempt
        self._note_attempt(conn, attempt)
        with self._lock:
            center, version = self._center, self._version
            # Every worker of an attempt starts at the first epoch that not all workers
            # had finished when the attempt began (fixed at its first HELLO, so a fast
            # worker's progress cannot move a slow worker's start): synchronous rounds
            # stay aligned and no epoch is skipped.
            if self._start_epochs.get(attempt) is None:
                self._start_epochs[attempt] = completed_epochs(self._epochs_done, self._num_workers)
            start_epoch = self._start_epochs[attempt]
            conn.last_version = version
        self._reply(conn, {"version": version, "start_epoch": start_epoch, "num_workers": self._num_workers}, center)

    def _epoch_done(self, conn: _Conn, meta: dict[str, Any]) -> None:
        epoch, logs = meta.get("epoch"), meta.get("logs", {})
        if type(epoch) is not int or epoch < 0 or not isinstance(logs, dict):
            self._error(
                conn,
                f"EPOCH_DONE needs {{'epoch': int >= 0, 'logs': dict}}, received epoch={epoch!r:.20} and logs of "
                f"type {type(logs).__name__}",
            )
            return
        with self._lock:
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
        self._reply(conn, {})

    def _check_payload(self, arrays: Sequence[np.ndarray]) -> str | None:
        n = len(self._shapes)
        if self._with_optimizer:
            if len(arrays) < n:
                return (
                    f"COMMIT payload has {len(arrays)} arrays, expected at least {n} (the model weights, then "
                    f"optimizer state); the worker's model differs from the one the server was started with"
                )
        elif len(arrays) != n:
            return (
                f"COMMIT payload has {len(arrays)} arrays, expected {n} (one per model weight); the worker's "
                f"model differs from the one the server was started with"
            )
        for i, (a, shape) in enumerate(zip(arrays, self._shapes)):
            if a.shape != shape:
                return (
                    f"COMMIT payload array #{i} has shape {a.shape}, expected {shape}; the worker's model differs "
                    f"from the one the server was started with"
                )
        return None

    def _commit_async(self, conn: _Conn, frame: Frame) -> None:
        epoch, batches = frame.meta.get("epoch"), frame.meta.get("batches")
        counted = batches is not None
        if counted and not (type(batches) is int and batches >= 0 and type(epoch) is int and epoch >= 0):
            self._error(conn, f"a COMMIT that counts 'batches' needs 'epoch' and 'batches' as ints >= 0, received "
                              f"epoch={epoch!r:.20} and batches={batches!r:.20}")
            return
        with self._lock:
            staleness = self._version - conn.last_version
            version = self._version + 1
            record = None
            try:
                new_center, reply = self._algorithm.server_commit(list(self._center), frame.arrays, staleness)
                new_center = _freeze(new_center)
                meta = {"version": version, "staleness": staleness}
                if counted:
                    meta["epoch_batches"] = self._epoch_batches[(conn.attempt, epoch)] + batches
                buffers = encode(Msg.OK, meta, reply)
            except Exception as exc:
                log.exception("parameter server: server_commit failed")
                buffers = encode(Msg.ERROR, {"error": f"server_commit failed: {type(exc).__name__}: {exc}"})
            else:
                self._center = new_center
                self._version = version
                conn.last_version = version
                if counted:
                    self._epoch_batches[(conn.attempt, epoch)] = meta["epoch_batches"]
                record = self._record(conn, frame, version, staleness, frame_size(buffers), "commit")
        if record is not None:
            self._notify(record)
        self._send(conn, buffers)

    def _commit_sync(self, conn: _Conn, frame: Frame) -> None:
        worker = conn.worker
        assert worker is not None
        with self._cond:
            rnd = self._round
            if self._stopping:
                error: str | None = "round aborted: the parameter server is stopping"
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
                    while rnd.replies is None and rnd.error is None:
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
            record = None
            if error is None:
                assert rnd.replies is not None and rnd.version is not None
                conn.last_version = rnd.version
                try:
                    buffers = encode(Msg.OK, {"version": rnd.version, "round": rnd.number}, rnd.replies[worker])
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

    def _finish_round_locked(self, rnd: _Round) -> None:
        payloads = [rnd.payloads[i] for i in range(self._num_workers)]
        try:
            new_center, replies = self._algorithm.server_round(list(self._center), payloads)
            if len(replies) != self._num_workers:
                raise ValueError(f"server_round returned {len(replies)} replies for {self._num_workers} workers")
            new_center = _freeze(new_center)
        except Exception as exc:
            log.exception("parameter server: server_round failed")
            rnd.error = f"round aborted: server_round failed: {type(exc).__name__}: {exc}"
            self._events.append(
                {"time": time.time(), "kind": "round_aborted", "round": rnd.number, "reason": rnd.error}
            )
        else:
            self._center = new_center
            self._version += 1
            rnd.version = self._version
            rnd.replies = [list(r) for r in replies]
        self._round = _Round(rnd.number + 1)
        self._cond.notify_all()

    def _record(
        self, conn: _Conn, frame: Frame, version: int, staleness: int, bytes_out: int, kind: str
    ) -> UpdateRecord:
        """Create and store an UpdateRecord (caller holds the lock)."""
        meta = frame.meta
        record = UpdateRecord(
            time=time.time(),
            worker=conn.worker,  # type: ignore[arg-type]
            version=version,
            staleness=staleness,
            bytes_in=frame.nbytes,
            bytes_out=bytes_out,
            epoch=_opt_int(meta.get("epoch")),
            step=_opt_int(meta.get("step")),
            loss=_opt_float(meta.get("loss")),
            kind=kind,
        )
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
