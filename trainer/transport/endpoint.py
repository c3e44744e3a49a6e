"""Authenticated request/reply endpoints over TCP, shared by the parameter server and the model hopper.

:class:`AuthenticatedServer` owns everything about serving that does not
depend on what the requests mean: listening, one accept thread (woken through
a socket pair on :meth:`~AuthenticatedServer.stop`), a cap on open
connections, one daemon thread per connection, the server side of the HMAC
challenge of :mod:`trainer.transport.wire`, the read loop with its timeouts, byte
counters and a stop that closes every socket and joins every thread.
Subclasses answer the authenticated requests (``_dispatch``) and learn when a
connection ends (``_closed``).

:class:`AuthenticatedClient` is the matching task side: connect, answer the
challenge, blocking request/reply calls, BYE on close. Subclasses choose the
exceptions their callers see.

A peer that misbehaves only loses its own connection; nothing is unpickled.
"""

from __future__ import annotations

import hmac
import logging
import selectors
import socket
import threading
import time
from typing import Any, Sequence

import numpy as np

from trainer.transport.wire import (
    MAX_META,
    PREAUTH_MAX_BODY,
    PREAUTH_MAX_META,
    PROTOCOL_VERSION,
    AuthenticationError,
    ConnectionClosed,
    Frame,
    Msg,
    ProtocolError,
    TransportError,
    TransportTimeout,
    auth_digest,
    check_secret,
    encode,
    new_nonce,
    read_frame,
    send_buffers,
    write_frame,
)

#: How long stop() waits for the server's threads in total.
STOP_JOIN_TIMEOUT = 5.0


def format_addr(addr: Any) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        return f"{addr[0]}:{addr[1]}"
    return str(addr)


class Connection:
    """Server-side state of one TCP connection; ``worker`` and ``attempt`` are set once it authenticated."""

    def __init__(self, sock: socket.socket, addr: Any) -> None:
        self.sock = sock
        self.peer = format_addr(addr)
        self.worker: int | None = None
        self.attempt: int | None = None


class AuthenticatedServer:
    """Accepts worker connections that prove they hold `secret`; subclasses serve their requests.

    Subclasses set the class attributes below and implement ``_dispatch``;
    they may override the other hooks (``_new_connection``, ``_welcome``,
    ``_closed``, ``_note``, ``_stopping_locked``, ``_stopped``).
    """

    #: Name in log lines and errors ("parameter server").
    label = "server"
    #: Prefix of thread names: ``<prefix>-accept-<port>``, ``<prefix>-conn-<peer>``.
    thread_prefix = "server"
    #: Raised when the server cannot listen.
    error_type: type[TransportError] = TransportError
    #: Raised when the server is started twice or asked for its address before start().
    not_started_type: type[TransportError] = TransportError
    #: Reply to a peer whose HMAC does not match.
    wrong_secret_reply = "authentication failed: the peer does not hold this server's secret"
    #: What the reply to an unknown request type lists.
    requests = "HELLO, PULL, COMMIT or BYE"

    def __init__(self, num_workers: int, secret: bytes, *, host: str, port: int, io_timeout: float,
                 handshake_timeout: float, max_connections: int | None, max_body: int | None,
                 log: logging.Logger) -> None:  # fmt: skip
        if type(num_workers) is not int or num_workers < 1:
            raise ValueError(f"{self.label}: num_workers must be a positive int, received {num_workers!r}")
        for name, value in (("io_timeout", io_timeout), ("handshake_timeout", handshake_timeout)):
            if not value > 0:
                raise ValueError(f"{self.label}: {name} must be a positive number of seconds, received {value!r}")
        self._num_workers = num_workers
        self._secret = check_secret(secret)
        self._host, self._port = host, int(port)
        self._io_timeout = float(io_timeout)
        self._handshake_timeout = float(handshake_timeout)
        self._max_connections = 2 * num_workers + 4 if max_connections is None else int(max_connections)
        self._max_body = max_body
        self._log = log
        self._lock = threading.Lock()
        self._conns: set[Connection] = set()
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

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> tuple[str, int]:
        """Bind, listen and start serving; returns the bound ``(host, port)``."""
        with self._lock:
            if self._started or self._stopping:
                raise self.not_started_type(f"this {self.label} was already started (or stopped); it cannot be "
                                      "started twice. Fix: create a new one.")
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
            raise self.error_type(
                f"cannot listen on {self._host}:{self._port}: {exc}. Fix: choose another port (0 picks a free "
                "one) or an address of this machine."
            ) from exc
        self._listener = listener
        bound = listener.getsockname()
        self._address = (bound[0], bound[1])
        self._wake_r, self._wake_w = socket.socketpair()
        self._accept_thread = threading.Thread(target=self._accept_loop, daemon=True,
                                               name=f"{self.thread_prefix}-accept-{bound[1]}")
        self._accept_thread.start()
        return self._address

    def stop(self) -> None:
        """Stop serving (idempotent): close every socket and join the threads."""
        with self._lock:
            if not self._started or self._stopping:
                self._stopping = True
                return
            self._stopping = True
            self._stopping_locked()
            conns, threads = list(self._conns), list(self._threads)
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
        for t in [self._accept_thread, *threads]:
            if t is not None and t is not current:
                t.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in threads if t.is_alive() and t is not current]
        if alive:
            self._log.warning("%s stopped but threads are still running: %s", self.label, alive)
        for s in (self._listener, self._wake_r, self._wake_w):
            if s is not None:
                s.close()
        self._stopped()

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def address(self) -> tuple[str, int]:
        if self._address is None:
            raise self.not_started_type(f"the {self.label} has no address yet. Fix: call start() first.")
        return self._address

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

    # -- hooks ------------------------------------------------------------------------

    def _new_connection(self, sock: socket.socket, addr: Any) -> Connection:
        return Connection(sock, addr)

    def _welcome(self, conn: Connection) -> dict[str, Any]:
        """Meta of the OK that ends a successful handshake."""
        return {"num_workers": self._num_workers}

    def _dispatch(self, conn: Connection, frame: Frame) -> None:
        raise NotImplementedError

    def _closed(self, conn: Connection, said_bye: bool) -> None:
        """The connection ended (its socket is closed); `said_bye` is False when the peer just went away."""

    def _note(self, kind: str, **fields: Any) -> None:
        """A notable event (refused or failed peers, protocol errors, disconnects)."""

    def _stopping_locked(self) -> None:
        """stop() began (the lock is held)."""

    def _stopped(self) -> None:
        """stop() closed everything."""

    # -- accepting --------------------------------------------------------------------

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
                        self._log.error("%s: accept() failed: %s", self.label, exc)
                        self._note("accept_error", error=str(exc))
                        time.sleep(0.05)  # e.g. out of file descriptors: do not spin
                        continue
                    self._admit(sock, addr)
        except Exception:
            self._log.exception("%s: accept loop crashed", self.label)
        finally:
            selector.close()

    def _admit(self, sock: socket.socket, addr: Any) -> None:
        conn = self._new_connection(sock, addr)
        with self._lock:
            self._threads = {t for t in self._threads if t.is_alive()}
            if self._stopping:
                reason = f"the {self.label} is stopping"
            elif len(self._conns) >= self._max_connections:
                reason = f"too many connections (max_connections={self._max_connections})"
            else:
                reason = None
                self._conns.add(conn)
                thread = threading.Thread(target=self._serve, args=(conn,), daemon=True,
                                          name=f"{self.thread_prefix}-conn-{conn.peer}")
                self._threads.add(thread)
                thread.start()
        if reason is not None:
            self._log.warning("%s: refused connection from %s: %s", self.label, conn.peer, reason)
            self._note("connection_refused", peer=conn.peer, reason=reason)
            self._try_error(conn, f"connection refused: {reason}")
            sock.close()

    # -- one connection ---------------------------------------------------------------

    def _serve(self, conn: Connection) -> None:
        said_bye = False
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
                        self._problem(conn, "disconnect", f"connection lost mid-frame: {exc}")
                    else:
                        self._problem(conn, "disconnect", "closed without BYE", level=logging.INFO)
                    return
                except TransportTimeout:
                    self._problem(conn, "timeout", f"no request for io_timeout={self._io_timeout}s, closing "
                                                   "the connection")
                    return
                except ProtocolError as exc:
                    self._problem(conn, "protocol_error", str(exc))
                    self._try_error(conn, f"protocol error: {exc}")
                    return
                self._count(frame.nbytes, 0)
                if frame.msg == Msg.BYE:
                    said_bye = True
                    return
                claimed = frame.meta.get("worker", conn.worker)
                try:
                    if claimed != conn.worker:
                        self._reply_error(conn, f"this connection authenticated as worker {conn.worker} but the "
                                                f"{frame.msg.name} request says worker {claimed!r:.20}; open one "
                                                "connection per worker")
                    else:
                        self._dispatch(conn, frame)
                except (ConnectionClosed, TransportTimeout) as exc:
                    if not self._stopping:
                        self._problem(conn, "disconnect", f"could not send the reply: {exc}")
                    return
        except Exception:
            self._log.exception("%s: unexpected error serving %s", self.label, conn.peer)
        finally:
            with self._lock:
                self._conns.discard(conn)
            try:
                conn.sock.close()
            except OSError:
                pass
            if conn.worker is not None:
                try:
                    self._closed(conn, said_bye)
                except Exception:
                    self._log.exception("%s: closing worker %s's connection failed (ignored)", self.label,
                                        conn.worker)

    def _handshake(self, conn: Connection) -> bool:
        sock = conn.sock
        deadline = time.monotonic() + self._handshake_timeout
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(self._handshake_timeout)
            nonce = new_nonce()
            write_frame(sock, Msg.CHALLENGE, {"nonce": nonce.hex(), "protocol": PROTOCOL_VERSION,
                                              "num_workers": self._num_workers})
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
                self._auth_failed(conn, "wrong HMAC", self.wrong_secret_reply)
                return False
            if not 0 <= worker < self._num_workers:
                self._auth_failed(conn, f"worker index {worker} out of range",
                                  f"authentication failed: worker index {worker} is out of range, "
                                  f"expected 0 <= worker < {self._num_workers}")
                return False
            self._count(frame.nbytes, 0)
            conn.worker, conn.attempt = worker, attempt
            self._send(conn, encode(Msg.OK, self._welcome(conn)))
            self._log.debug("%s: %s authenticated as worker %d attempt %d", self.label, conn.peer, worker, attempt)
            return True
        except (ConnectionClosed, TransportTimeout, ProtocolError, OSError) as exc:
            if not self._stopping:
                kind = "timed out" if isinstance(exc, TransportTimeout) else "failed"
                self._auth_failed(conn, f"handshake {kind}: {exc}", f"handshake {kind}: {exc}")
            return False

    def _auth_failed(self, conn: Connection, why: str, reply: str) -> None:
        self._log.warning("%s: rejected unauthenticated peer %s: %s", self.label, conn.peer, why)
        self._note("auth_failed", peer=conn.peer, reason=why)
        self._try_error(conn, reply)

    def _problem(self, conn: Connection, kind: str, text: str, level: int = logging.WARNING) -> None:
        self._log.log(level, "%s: worker %s at %s: %s", self.label, conn.worker, conn.peer, text)
        self._note(kind, peer=conn.peer, worker=conn.worker, reason=text)

    # -- sending ----------------------------------------------------------------------

    def _count(self, n_in: int, n_out: int) -> None:
        with self._lock:
            self._bytes_in += n_in
            self._bytes_out += n_out

    def _send(self, conn: Connection, buffers: list) -> int:
        n = send_buffers(conn.sock, buffers)
        self._count(0, n)
        return n

    def _reply(self, conn: Connection, meta: dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> int:
        return self._send(conn, encode(Msg.OK, meta, arrays))

    def _reply_error(self, conn: Connection, text: str) -> None:
        self._log.warning("%s: request from worker %s at %s failed: %s", self.label, conn.worker, conn.peer, text)
        self._send(conn, encode(Msg.ERROR, {"error": text[:4000]}))

    def _unexpected(self, conn: Connection, frame: Frame) -> None:
        self._reply_error(conn, f"unexpected {frame.msg.name} request; expected {self.requests}")

    @staticmethod
    def _try_error(conn: Connection, text: str) -> None:
        """Best effort: tell a peer we are about to drop why."""
        try:
            conn.sock.settimeout(1.0)
            write_frame(conn.sock, Msg.ERROR, {"error": text})
        except (TransportError, OSError):
            pass


class AuthenticatedClient:
    """One worker's connection to an :class:`AuthenticatedServer` (not thread-safe).

    Subclasses name the service in messages and choose the exceptions:
    ``_refused`` (an ERROR reply) and ``_lost`` (the connection broke; the
    client is closed by then).
    """

    #: Who the client talks to, in messages ("the parameter server").
    service = "the server"
    #: Advice when the server cannot be reached.
    reach_hint = "Fix: check that executors can reach the driver at this address (spark.driver.host, firewall)."

    def __init__(self, host: str, port: int, secret: bytes, worker: int, attempt: int = 0,
                 timeout: float = 600.0, max_body: int | None = None) -> None:  # fmt: skip
        if type(worker) is not int or worker < 0:
            raise ValueError(f"worker must be an int >= 0, received {worker!r}")
        if type(attempt) is not int or attempt < 0:
            raise ValueError(f"attempt must be an int >= 0, received {attempt!r}")
        self.host, self.port = host, int(port)
        self.worker, self.attempt = worker, attempt
        self.timeout = float(timeout)
        self.max_body = max_body  # None: trust the authenticated server's frame sizes
        self._secret = check_secret(secret)
        self._sock: socket.socket | None = None
        self.bytes_sent = 0
        self.bytes_received = 0

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def connect(self):
        """Open the connection and authenticate; returns self."""
        if self._sock is not None:
            return self
        where = f"{self.host}:{self.port}"
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        except OSError as exc:
            raise ConnectionClosed(f"cannot connect to {self.service} at {where}: {exc}. {self.reach_hint}") from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            challenge = self._read(sock, PREAUTH_MAX_BODY, PREAUTH_MAX_META)
            if challenge.msg == Msg.ERROR:
                raise self._refused(f"{self.service} at {where}: {challenge.meta.get('error', 'unknown error')}")
            if challenge.msg != Msg.CHALLENGE:
                raise ProtocolError(f"expected a CHALLENGE from {where}, received {challenge.msg.name}")
            try:
                nonce = bytes.fromhex(challenge.meta["nonce"])
            except (KeyError, TypeError, ValueError):
                raise ProtocolError(f"the CHALLENGE from {where} carries no valid hex 'nonce'") from None
            mac = auth_digest(self._secret, nonce, self.worker, self.attempt)
            self.bytes_sent += write_frame(sock, Msg.AUTH, {"worker": self.worker, "attempt": self.attempt,
                                                            "mac": mac.hex()})
            answer = self._read(sock, PREAUTH_MAX_BODY, PREAUTH_MAX_META)
            if answer.msg == Msg.ERROR:
                raise AuthenticationError(f"{self.service} at {where} rejected worker {self.worker}: "
                                          f"{answer.meta.get('error', 'unknown error')}")
            if answer.msg != Msg.OK:
                raise ProtocolError(f"expected OK after AUTH from {where}, received {answer.msg.name}")
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._welcomed(answer.meta)
        return self

    def close(self) -> None:
        """Say BYE and close (idempotent, never raises)."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        try:
            sock.settimeout(min(self.timeout, 5.0))
            self.bytes_sent += write_frame(sock, Msg.BYE, {})
        except (TransportError, OSError):
            pass
        finally:
            sock.close()

    def __enter__(self):
        return self.connect()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- hooks ------------------------------------------------------------------------

    def _welcomed(self, meta: dict[str, Any]) -> None:
        """The server accepted the handshake with this meta."""

    def _refused(self, text: str, msg: Msg | None = None) -> TransportError:
        """The exception for an ERROR reply (`msg`: the request it answers; None during the handshake)."""
        return TransportError(text)

    def _lost(self, msg: Msg, exc: TransportError) -> TransportError:
        return exc

    # -- requests ---------------------------------------------------------------------

    def _read(self, sock: socket.socket, max_body: int | None, max_meta: int = MAX_META) -> Frame:
        frame = read_frame(sock, max_body, max_meta=max_meta)
        self.bytes_received += frame.nbytes
        return frame

    def _request(self, msg: Msg, meta: dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> Frame:
        """Send one request (meta gets this worker's index) and return the OK reply."""
        sock = self._sock
        if sock is None:
            raise TransportError(f"{type(self).__name__} for worker {self.worker} is not connected. Fix: call connect() "
                          "first (a client is closed after a connection error).")
        buffers = encode(msg, {**meta, "worker": self.worker}, arrays)  # a bad argument raises before sending
        try:
            self.bytes_sent += send_buffers(sock, buffers)
            frame = self._read(sock, self.max_body)
        except (ConnectionClosed, TransportTimeout, ProtocolError) as exc:
            self._sock = None
            sock.close()
            raise self._lost(msg, exc) from None
        if frame.msg == Msg.ERROR:
            raise self._refused(str(frame.meta.get("error", f"{self.service} reported an unknown error")), msg)
        if frame.msg != Msg.OK:
            raise ProtocolError(f"expected OK or ERROR in reply to {msg.name}, received {frame.msg.name}")
        return frame
