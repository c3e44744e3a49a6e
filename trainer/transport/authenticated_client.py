"""The task side of an authenticated endpoint: connect, authenticate both ways, request/reply.

:class:`AuthenticatedClient` connects to a
:class:`~trainer.transport.endpoint.AuthenticatedServer` (through TLS when the
credentials carry a certificate fingerprint), runs the mutual handshake of
:mod:`trainer.transport.handshake` and refuses a server that does not prove
the secret before it sends anything. A busy server (no free worker slot, or a
flood of unauthenticated connections that pushed this one out) is tried again
for ``connect_timeout`` seconds. Requests are blocking request/reply calls,
every frame sealed and checked (:mod:`trainer.transport.frame_auth`); BYE on
close. Replies are received into a `~trainer.transport.wire.RecvPool`:
a buffer is reused once nothing of an earlier reply in it is alive, so a
client allocates (and zero-fills) no buffer per reply. The parameter
server's client (``trainer.ps.ps_client``) and the model hopper's
(``trainer.selection.engine.hopper``) extend it.
"""

from __future__ import annotations

import socket
import time
from typing import Any, Sequence

import numpy as np

from trainer.transport.handshake import Credentials, client_handshake
from trainer.transport.frame_auth import Channel
from trainer.transport.tls import client_wrap
from trainer.transport.wire import (
    ConnectionClosed,
    Frame,
    IntegrityError,
    Msg,
    ProtocolError,
    RecvPool,
    ServerBusy,
    TransportError,
    TransportTimeout,
    encode,
    set_io_timeout,
)

#: Longest a client waits for the handshake itself (the TCP connection is up by then).
CLIENT_HANDSHAKE_LIMIT = 60.0


class _HandshakeCut(Exception):
    """The server closed the connection during the handshake without saying why (try again)."""


class AuthenticatedClient:
    """One worker's connection to an :class:`AuthenticatedServer` (not thread-safe).

    `secret` is the server's :attr:`~AuthenticatedServer.credentials` (or the
    bare secret bytes: then the default frame MAC and no TLS). A busy server
    (no free slot, or a flood of pending connections) is retried for
    `connect_timeout` seconds. Subclasses name the service in messages and
    choose the exceptions: ``_refused`` (an ERROR reply) and ``_lost`` (the
    connection broke; the client is closed by then).
    """

    #: Who the client talks to, in messages ("the parameter server").
    service = "the server"
    #: Advice when the server cannot be reached.
    reach_hint = "Fix: check that executors can reach the driver at this address (spark.driver.host, firewall)."

    def __init__(self, host: str, port: int, secret: bytes | Credentials, worker: int, attempt: int = 0,
                 timeout: float = 600.0, max_body: int | None = None, *,
                 connect_timeout: float = 60.0) -> None:  # fmt: skip
        if type(worker) is not int or worker < 0:
            raise ValueError(f"worker must be an int >= 0, received {worker!r}")
        if type(attempt) is not int or attempt < 0:
            raise ValueError(f"attempt must be an int >= 0, received {attempt!r}")
        self.host, self.port = host, int(port)
        self.worker, self.attempt = worker, attempt
        self.timeout = float(timeout)
        self.connect_timeout = float(connect_timeout)
        self.max_body = max_body  # None: trust the authenticated server's frame sizes
        self._credentials = Credentials.of(secret)
        self._sock: socket.socket | None = None
        self._channel: Channel | None = None
        self._replies = RecvPool()  # reused once the caller dropped what it received there
        self.bytes_sent = 0
        self.bytes_received = 0

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def connect(self):
        """Open the connection and authenticate both ways; returns self."""
        if self._sock is not None:
            return self
        where = f"{self.host}:{self.port}"
        deadline = time.monotonic() + self.connect_timeout
        delay = 0.05
        while True:
            try:
                self._connect_once(where)
                return self
            except (ServerBusy, _HandshakeCut) as exc:
                if time.monotonic() + delay > deadline:
                    if isinstance(exc, ServerBusy):
                        raise ServerBusy(f"{exc} (still busy after trying for connect_timeout="
                                         f"{self.connect_timeout:g}s)") from None
                    raise ConnectionClosed(
                        f"{self.service} at {where} closed the connection during the handshake, again for "
                        f"connect_timeout={self.connect_timeout:g}s ({exc}): a flood of unauthenticated "
                        f"connections, a server with TLS while this task has none, or not this run's server. "
                        f"{self.reach_hint}") from None
                time.sleep(delay)
                delay = min(2 * delay, 1.0)

    def _connect_once(self, where: str) -> None:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        except OSError as exc:
            raise ConnectionClosed(f"cannot connect to {self.service} at {where}: {exc}. {self.reach_hint}") from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            limit = min(self.timeout, CLIENT_HANDSHAKE_LIMIT)
            sock.settimeout(limit)
            if self._credentials.tls_fingerprint is not None:
                sock = client_wrap(sock, self._credentials.tls_fingerprint, where=where, service=self.service)
            channel, welcome, n_out, n_in = client_handshake(
                sock, self._credentials, self.worker, self.attempt, where=where, service=self.service,
                deadline=time.monotonic() + limit)
            set_io_timeout(sock, self.timeout)
        except (ConnectionClosed, ConnectionError) as exc:
            sock.close()
            raise _HandshakeCut(str(exc)) from None
        except BaseException:
            sock.close()
            raise
        self.bytes_sent += n_out
        self.bytes_received += n_in
        self._sock, self._channel = sock, channel
        self._welcomed(welcome)

    def close(self) -> None:
        """Say BYE and close (idempotent, never raises)."""
        sock, channel, self._sock, self._channel = self._sock, self._channel, None, None
        if sock is None:
            return
        try:
            sock.settimeout(min(self.timeout, 5.0))
            if channel is not None:
                self.bytes_sent += channel.send(encode(Msg.BYE, {}))
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
        """The exception for an ERROR reply (`msg`: the request it answers)."""
        return TransportError(text)

    def _lost(self, msg: Msg, exc: TransportError) -> TransportError:
        return exc

    # -- requests ---------------------------------------------------------------------

    def _request(self, msg: Msg, meta: dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> Frame:
        """Send one request (meta gets this worker's index) and return the OK reply."""
        sock, channel = self._sock, self._channel
        if sock is None or channel is None:
            raise TransportError(f"{type(self).__name__} for worker {self.worker} is not connected. Fix: call "
                                 "connect() first (a client is closed after a connection error).")
        buffers = encode(msg, {**meta, "worker": self.worker}, arrays)  # a bad argument raises before sending
        try:
            self.bytes_sent += channel.send(buffers)
            frame = channel.recv(self.max_body, into=self._replies)
        except (ConnectionClosed, TransportTimeout, ProtocolError, IntegrityError) as exc:
            self._sock = self._channel = None
            sock.close()
            raise self._lost(msg, exc) from None
        self.bytes_received += frame.nbytes
        if frame.msg == Msg.ERROR:
            raise self._refused(str(frame.meta.get("error", f"{self.service} reported an unknown error")), msg)
        if frame.msg != Msg.OK:
            raise ProtocolError(f"expected OK or ERROR in reply to {msg.name}, received {frame.msg.name}")
        return frame
