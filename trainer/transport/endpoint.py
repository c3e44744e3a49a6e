"""The authenticated request/reply server over TCP, shared by the parameter server and the model hopper.

:class:`AuthenticatedServer` owns everything about serving that does not
depend on what the requests mean: listening, one accept thread (woken through
a socket pair on :meth:`~AuthenticatedServer.stop`), admission, one daemon
thread per connection, the server side of the mutual handshake of
:mod:`trainer.transport.handshake` (inside TLS when asked, see
:mod:`trainer.transport.tls`), the read loop with its timeouts and the frame
MACs of :mod:`trainer.transport.frame_auth`, byte counters and a stop that closes
every socket and joins every thread. Subclasses answer the authenticated
requests (``_dispatch``), may refuse a worker at the handshake
(``_refuse_worker``) and learn when a connection ends (``_closed``).

Admission: a connection that has not authenticated yet is *pending*. Pending
connections have their own small cap (``max_pending``) and a short deadline
(``handshake_timeout``); when the cap is full the oldest pending connection is
dropped to make room, so a flood of idle sockets can delay a real worker by a
handshake at most, never lock it out. Only authenticated connections count
against ``max_connections``; a worker refused for lack of a slot gets a "busy"
answer and its client tries again for a while.

The matching task side is :class:`trainer.transport.authenticated_client.AuthenticatedClient`.

A peer that misbehaves only loses its own connection; nothing is unpickled.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from typing import Any, Sequence

import numpy as np

from trainer.transport.handshake import Credentials, ServerHandshake
from trainer.transport.frame_auth import DEFAULT_MAC, Channel, check_mac_algorithm
from trainer.transport.tls import TlsIdentity, server_wrap
from trainer.transport.wire import (
    AuthenticationError,
    ConnectionClosed,
    Frame,
    IntegrityError,
    Msg,
    ProtocolError,
    RecvBuffer,
    TransportError,
    TransportTimeout,
    encode,
    set_io_timeout,
    write_frame,
)

#: How long stop() waits for the server's threads in total.
STOP_JOIN_TIMEOUT = 5.0
#: Default cap on connections that have not authenticated yet.
MAX_PENDING = 8


def format_addr(addr: Any) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        return f"{addr[0]}:{addr[1]}"
    return str(addr)


def mac_setting(frame_mac: bool | str | None) -> str | None:
    """The MAC algorithm for a ``frame_mac`` option: True is the default algorithm, False/None none."""
    if frame_mac is True:
        return DEFAULT_MAC
    if frame_mac is False or frame_mac is None:
        return None
    return check_mac_algorithm(frame_mac)


class Connection:
    """Server-side state of one TCP connection; ``worker``, ``attempt`` and ``channel`` are set once it
    authenticated."""

    def __init__(self, sock: socket.socket, addr: Any) -> None:
        self.sock = sock
        self.peer = format_addr(addr)
        self.worker: int | None = None
        self.attempt: int | None = None
        self.channel: Channel | None = None
        self.accepted_at = time.monotonic()
        self.evicted = False  # dropped while pending, to make room or past its deadline


class Service:
    """A server that starts and stops, also as a context manager (``with server: ...``)."""

    def start(self) -> Any:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class AuthenticatedServer(Service):
    """Accepts worker connections that prove they hold `secret`; subclasses serve their requests.

    Subclasses set the class attributes below and implement ``_dispatch``;
    they may override the other hooks (``_new_connection``, ``_refuse_worker``,
    ``_welcome``, ``_recv_buffer``, ``_closed``, ``_note``, ``_stopping_locked``, ``_stopped``).

    ``frame_mac``: True (Poly1305 on every frame), False (none) or an
    algorithm name; ``tls``: False, True (a throw-away certificate made now) or
    a :class:`~trainer.transport.tls.TlsIdentity`. Tasks get both through
    :attr:`credentials`.
    """

    #: Name in log lines and errors ("parameter server").
    label = "server"
    #: Prefix of thread names: ``<prefix>-accept-<port>``, ``<prefix>-conn-<peer>``.
    thread_prefix = "server"
    #: Raised when the server cannot listen.
    error_type: type[TransportError] = TransportError
    #: Raised when the server is started twice or asked for its address before start().
    not_started_type: type[TransportError] = TransportError
    #: Reply to a peer whose proof does not match.
    wrong_secret_reply = "authentication failed: the peer does not hold this server's secret"
    #: What the reply to an unknown request type lists.
    requests = "HELLO, PULL, COMMIT or BYE"

    def __init__(self, num_workers: int, secret: bytes, *, host: str, port: int, io_timeout: float,
                 handshake_timeout: float, max_connections: int | None, max_body: int | None,
                 log: logging.Logger, frame_mac: bool | str | None = True, tls: bool | TlsIdentity = False,
                 max_pending: int = MAX_PENDING) -> None:  # fmt: skip
        if type(num_workers) is not int or num_workers < 1:
            raise ValueError(f"{self.label}: num_workers must be a positive int, received {num_workers!r}")
        for name, value in (("io_timeout", io_timeout), ("handshake_timeout", handshake_timeout)):
            if not value > 0:
                raise ValueError(f"{self.label}: {name} must be a positive number of seconds, received {value!r}")
        if type(max_pending) is not int or max_pending < 1:
            raise ValueError(f"{self.label}: max_pending must be a positive int, received {max_pending!r}")
        self._num_workers = num_workers
        self._identity = TlsIdentity.generate() if tls is True else (tls or None)
        self._credentials = Credentials(secret, mac_setting(frame_mac),
                                        self._identity.fingerprint if self._identity is not None else None)
        self._tls_context = self._identity.server_context() if self._identity is not None else None
        self._host, self._port = host, int(port)
        self._io_timeout = float(io_timeout)
        self._handshake_timeout = float(handshake_timeout)
        self._max_connections = 2 * num_workers + 4 if max_connections is None else int(max_connections)
        self._max_pending = max_pending
        self._max_body = max_body
        self._log = log
        self._lock = threading.Lock()
        self._pending: dict[Connection, None] = {}  # insertion-ordered: the oldest first
        self._conns: set[Connection] = set()  # authenticated
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
            listener.listen(max(64, self._max_connections + self._max_pending))
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
            conns, threads = [*self._conns, *self._pending], list(self._threads)
        if self._wake_w is not None:
            try:
                self._wake_w.send(b"x")
            except OSError:
                pass
        for conn in conns:
            _shutdown(conn.sock)
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

    @property
    def address(self) -> tuple[str, int]:
        if self._address is None:
            raise self.not_started_type(f"the {self.label} has no address yet. Fix: call start() first.")
        return self._address

    @property
    def credentials(self) -> Credentials:
        """What tasks need to connect: the secret, the frame MAC and the TLS fingerprint (never logged)."""
        return self._credentials

    @property
    def num_connections(self) -> int:
        """Open connections, authenticated or pending."""
        with self._lock:
            return len(self._conns) + len(self._pending)

    @property
    def num_authenticated(self) -> int:
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

    def _refuse_worker(self, worker: int, attempt: int) -> str | None:
        """Why an authenticated peer may not serve as `worker` of `attempt` (None: welcome)."""
        if not 0 <= worker < self._num_workers:
            return (f"authentication failed: worker index {worker} is out of range, expected 0 <= worker < "
                    f"{self._num_workers}")
        return None

    def _welcome(self, conn: Connection) -> dict[str, Any]:
        """Meta of the OK that ends a successful handshake."""
        return {"num_workers": self._num_workers}

    def _dispatch(self, conn: Connection, frame: Frame) -> None:
        raise NotImplementedError

    def _recv_buffer(self, conn: Connection) -> RecvBuffer | None:
        """A buffer to receive `conn`'s next frame into, reused from frame to frame (None: a fresh one per
        frame). Only for a subclass whose `_dispatch` keeps no array of a frame past its reply."""
        return None

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
                events = selector.select(timeout=min(1.0, self._handshake_timeout / 2))
                self._drop_overdue()
                for key, _ in events:
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

    def _drop_overdue(self) -> None:
        """Close pending connections past their handshake deadline (e.g. a TLS handshake trickling bytes)."""
        limit = time.monotonic() - self._handshake_timeout
        with self._lock:
            overdue = [c for c in self._pending if c.accepted_at < limit and not c.evicted]
            for conn in overdue:
                conn.evicted = True
        for conn in overdue:
            why = f"handshake timed out: no handshake within handshake_timeout={self._handshake_timeout:g}s"
            self._log.warning("%s: rejected unauthenticated peer %s: %s", self.label, conn.peer, why)
            self._note("auth_failed", peer=conn.peer, reason=why)
            _shutdown(conn.sock)

    def _admit(self, sock: socket.socket, addr: Any) -> None:
        conn = self._new_connection(sock, addr)
        evicted: Connection | None = None
        with self._lock:
            self._threads = {t for t in self._threads if t.is_alive()}
            if self._stopping:
                refused = True
            else:
                refused = False
                if len(self._pending) >= self._max_pending:
                    evicted = next(c for c in self._pending)  # the oldest
                    del self._pending[evicted]
                    evicted.evicted = True
                self._pending[conn] = None
                thread = threading.Thread(target=self._serve, args=(conn,), daemon=True,
                                          name=f"{self.thread_prefix}-conn-{conn.peer}")
                self._threads.add(thread)
                thread.start()
        if evicted is not None:
            self._log.debug("%s: dropped pending connection %s to make room for %s", self.label, evicted.peer,
                            conn.peer)
            self._note("pending_evicted", peer=evicted.peer)
            _shutdown(evicted.sock)
        if refused:
            try:
                sock.settimeout(1.0)
                write_frame(sock, Msg.ERROR, {"error": f"connection refused: the {self.label} is stopping"})
            except (TransportError, OSError):
                pass
            sock.close()

    # -- one connection ---------------------------------------------------------------

    def _serve(self, conn: Connection) -> None:
        said_bye = False
        try:
            if not self._handshake(conn):
                return
            channel = conn.channel
            assert channel is not None
            set_io_timeout(conn.sock, self._io_timeout)
            while not self._stopping:
                try:
                    frame = channel.recv(self._max_body, into=self._recv_buffer(conn))
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
                except IntegrityError as exc:
                    self._problem(conn, "integrity_error", str(exc), level=logging.ERROR)
                    self._try_error(conn, f"integrity check failed: {exc}")
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
                self._pending.pop(conn, None)
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
        """TLS when asked, then the mutual handshake; True once `conn` is an authenticated worker."""
        hs: ServerHandshake | None = None
        try:
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.sock.settimeout(self._handshake_timeout)
            deadline = conn.accepted_at + self._handshake_timeout
            if self._tls_context is not None:
                conn.sock = server_wrap(conn.sock, self._tls_context, self._handshake_timeout)
            creds = self._credentials
            hs = ServerHandshake(conn.sock, creds.secret, mac=creds.mac, tls_fingerprint=creds.tls_fingerprint,
                                 num_workers=self._num_workers, peer=conn.peer, deadline=deadline)
            hs.challenge()
            try:
                worker, attempt = hs.read_auth()
            except AuthenticationError as exc:
                self._auth_failed(conn, str(exc), self.wrong_secret_reply, hs)
                return False
            refusal = self._refuse_worker(worker, attempt)
            if refusal is not None:
                self._auth_failed(conn, refusal, refusal, hs)
                return False
            with self._lock:
                if self._stopping:
                    busy: str | None = f"the {self.label} is stopping"
                elif len(self._conns) >= self._max_connections:
                    busy = f"server busy: {len(self._conns)} workers connected (max_connections={self._max_connections})"
                else:
                    busy = None
                    self._pending.pop(conn, None)
                    self._conns.add(conn)
                    conn.worker, conn.attempt = worker, attempt
            if busy is not None:
                self._log.warning("%s: refused worker %d at %s: %s", self.label, worker, conn.peer, busy)
                self._note("connection_refused", peer=conn.peer, worker=worker, reason=busy)
                hs.refuse(busy, busy=not self._stopping)
                return False
            conn.channel = hs.accept(self._welcome(conn))
            self._log.debug("%s: %s authenticated as worker %d attempt %d", self.label, conn.peer, worker, attempt)
            return True
        except (ConnectionClosed, TransportTimeout, ProtocolError, OSError) as exc:
            if not self._stopping and not conn.evicted:
                kind = "timed out" if isinstance(exc, (TransportTimeout, TimeoutError)) else "failed"
                self._auth_failed(conn, f"handshake {kind}: {exc}", f"handshake {kind}: {exc}", hs)
            return False
        finally:
            if hs is not None:
                self._count(hs.bytes_in, hs.bytes_out)

    def _auth_failed(self, conn: Connection, why: str, reply: str, hs: ServerHandshake | None) -> None:
        self._log.warning("%s: rejected unauthenticated peer %s: %s", self.label, conn.peer, why)
        self._note("auth_failed", peer=conn.peer, reason=why)
        if hs is not None:
            hs.refuse(reply)

    def _problem(self, conn: Connection, kind: str, text: str, level: int = logging.WARNING) -> None:
        self._log.log(level, "%s: worker %s at %s: %s", self.label, conn.worker, conn.peer, text)
        self._note(kind, peer=conn.peer, worker=conn.worker, reason=text)

    # -- sending ----------------------------------------------------------------------

    def _count(self, n_in: int, n_out: int) -> None:
        with self._lock:
            self._bytes_in += n_in
            self._bytes_out += n_out

    def _send(self, conn: Connection, buffers: list) -> int:
        assert conn.channel is not None
        n = conn.channel.send(buffers)
        self._count(0, n)
        return n

    def _reply(self, conn: Connection, meta: dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> int:
        return self._send(conn, encode(Msg.OK, meta, arrays))

    def _reply_error(self, conn: Connection, text: str) -> None:
        self._log.warning("%s: request from worker %s at %s failed: %s", self.label, conn.worker, conn.peer, text)
        self._send(conn, encode(Msg.ERROR, {"error": text[:4000]}))

    def _unexpected(self, conn: Connection, frame: Frame) -> None:
        self._reply_error(conn, f"unexpected {frame.msg.name} request; expected {self.requests}")

    def _try_error(self, conn: Connection, text: str) -> None:
        """Best effort: tell an authenticated peer (with a sealed frame) why we are about to drop it."""
        try:
            conn.sock.settimeout(1.0)
            self._send(conn, encode(Msg.ERROR, {"error": text[:4000]}))
        except (TransportError, OSError):
            pass


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
