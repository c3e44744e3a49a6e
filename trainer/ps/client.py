"""Worker-side client of the parameter server (runs inside a Spark task).

``PSClient`` opens one TCP connection, answers the server's HMAC challenge and
then issues blocking request/reply calls (HELLO, PULL, COMMIT, EPOCH_DONE).
An ERROR reply raises ``RemoteError`` (a ``PSError``) carrying the server's
message; socket problems raise ``ConnectionClosed`` or ``PSTimeout``, after
which the client is closed. Retrying is the caller's job (typically by letting
the Spark task fail), not the client's.

Arrays returned by the client are zero-copy views into the received frame:
they are writable but share one buffer per reply.

A client is not thread-safe: use one per worker thread.
"""

from __future__ import annotations

import socket
from typing import Any, Sequence

import numpy as np

from trainer.ps.wire import (
    MAX_META,
    PREAUTH_MAX_BODY,
    PREAUTH_MAX_META,
    AuthenticationError,
    ConnectionClosed,
    Frame,
    Msg,
    ProtocolError,
    PSError,
    PSTimeout,
    auth_digest,
    check_secret,
    encode,
    read_frame,
    send_buffers,
    write_frame,
)


class RemoteError(PSError):
    """The server answered a request with an ERROR frame."""


class PSClient:
    """Connection of one worker to the parameter server."""

    def __init__(
        self,
        host: str,
        port: int,
        secret: bytes,
        worker: int,
        attempt: int = 0,
        timeout: float = 600.0,
        *,
        max_body: int | None = None,
    ) -> None:
        if type(worker) is not int or worker < 0:
            raise ValueError(f"worker must be an int >= 0, received {worker!r}")
        if type(attempt) is not int or attempt < 0:
            raise ValueError(f"attempt must be an int >= 0, received {attempt!r}")
        self.host = host
        self.port = int(port)
        self.worker = worker
        self.attempt = attempt
        self.timeout = float(timeout)
        self.max_body = max_body  # None: trust the authenticated server's frame sizes
        self._secret = check_secret(secret)
        self._sock: socket.socket | None = None
        self.bytes_sent = 0
        self.bytes_received = 0
        #: Center version seen in the last reply (None before the first one).
        self.version: int | None = None
        #: Number of workers announced by the server during the handshake.
        self.num_workers: int | None = None

    # -- connection -------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def connect(self) -> "PSClient":
        """Open the connection and authenticate; returns self."""
        if self._sock is not None:
            return self
        where = f"{self.host}:{self.port}"
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        except OSError as exc:
            raise ConnectionClosed(
                f"cannot connect to the parameter server at {where}: {exc}. Check that the driver is running "
                f"and that executors can reach this address (firewall, spark.driver.host)."
            ) from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            challenge = self._read(sock, PREAUTH_MAX_BODY, PREAUTH_MAX_META)
            if challenge.msg == Msg.ERROR:
                raise RemoteError(f"parameter server at {where}: {challenge.meta.get('error', 'unknown error')}")
            if challenge.msg != Msg.CHALLENGE:
                raise ProtocolError(f"expected a CHALLENGE from {where}, received {challenge.msg.name}")
            try:
                nonce = bytes.fromhex(challenge.meta["nonce"])
            except (KeyError, TypeError, ValueError):
                raise ProtocolError(f"the CHALLENGE from {where} carries no valid hex 'nonce'") from None
            mac = auth_digest(self._secret, nonce, self.worker, self.attempt)
            self.bytes_sent += write_frame(
                sock, Msg.AUTH, {"worker": self.worker, "attempt": self.attempt, "mac": mac.hex()}
            )
            answer = self._read(sock, PREAUTH_MAX_BODY, PREAUTH_MAX_META)
            if answer.msg == Msg.ERROR:
                raise AuthenticationError(
                    f"parameter server at {where} rejected worker {self.worker}: "
                    f"{answer.meta.get('error', 'unknown error')}"
                )
            if answer.msg != Msg.OK:
                raise ProtocolError(f"expected OK after AUTH from {where}, received {answer.msg.name}")
        except BaseException:
            sock.close()
            raise
        self.version = answer.meta.get("version")
        self.num_workers = answer.meta.get("num_workers")
        self._sock = sock
        return self

    def close(self) -> None:
        """Say BYE and close (idempotent, never raises)."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        try:
            sock.settimeout(min(self.timeout, 5.0))
            self.bytes_sent += write_frame(sock, Msg.BYE, {})
        except (PSError, OSError):
            pass
        finally:
            sock.close()

    def __enter__(self) -> "PSClient":
        return self.connect()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- requests ---------------------------------------------------------------

    def hello(self) -> tuple[list[np.ndarray], dict[str, Any]]:
        """Announce this worker; returns the center and ``{"version", "start_epoch", "num_workers"}``."""
        frame = self._request(Msg.HELLO, {"worker": self.worker, "attempt": self.attempt})
        return frame.arrays, frame.meta

    def pull(self) -> tuple[list[np.ndarray], int]:
        """Fetch the current center; returns ``(arrays, version)``."""
        frame = self._request(Msg.PULL, {"worker": self.worker})
        return frame.arrays, frame.meta["version"]

    def commit(
        self, payload: Sequence[np.ndarray], meta: dict[str, Any] | None = None
    ) -> tuple[list[np.ndarray], dict[str, Any]]:
        """Send an update-rule payload (meta: epoch, step, loss, ...); returns the reply arrays and meta."""
        full = dict(meta or {})
        full["worker"] = self.worker
        frame = self._request(Msg.COMMIT, full, payload)
        return frame.arrays, frame.meta

    def epoch_done(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Report that ``epoch`` is finished (lets a retried task resume after it)."""
        self._request(Msg.EPOCH_DONE, {"worker": self.worker, "epoch": int(epoch), "logs": dict(logs or {})})

    # -- internals --------------------------------------------------------------------

    def _read(self, sock: socket.socket, max_body: int | None, max_meta: int = MAX_META) -> Frame:
        frame = read_frame(sock, max_body, max_meta=max_meta)
        self.bytes_received += frame.nbytes
        return frame

    def _request(self, msg: Msg, meta: dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> Frame:
        sock = self._sock
        if sock is None:
            raise PSError(
                f"PSClient for worker {self.worker} is not connected; call connect() first "
                f"(a client is closed after a connection error)"
            )
        buffers = encode(msg, meta, arrays)  # a bad argument raises here, before anything is sent
        try:
            self.bytes_sent += send_buffers(sock, buffers)
            frame = self._read(sock, self.max_body)
        except (ConnectionClosed, PSTimeout, ProtocolError) as exc:
            self._sock = None
            sock.close()
            if isinstance(exc, ConnectionClosed):
                raise ConnectionClosed(
                    f"lost the connection to the parameter server at {self.host}:{self.port} during "
                    f"{msg.name}: {exc}"
                ) from None
            if isinstance(exc, PSTimeout):
                raise PSTimeout(
                    f"no reply from the parameter server at {self.host}:{self.port} to {msg.name} within "
                    f"timeout={self.timeout}s ({exc}); for synchronous rules the timeout must exceed the "
                    f"server's round_timeout"
                ) from None
            raise
        if frame.msg == Msg.ERROR:
            raise RemoteError(str(frame.meta.get("error", "the parameter server reported an unknown error")))
        if frame.msg != Msg.OK:
            raise ProtocolError(f"expected OK or ERROR in reply to {msg.name}, received {frame.msg.name}")
        if "version" in frame.meta:
            self.version = frame.meta["version"]
        return frame
