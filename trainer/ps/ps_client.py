"""Worker-side client of the parameter server (runs inside a Spark task).

``PSClient`` (a ``trainer.transport.authenticated_client.AuthenticatedClient``) opens one TCP
connection (TLS when the credentials carry a fingerprint), authenticates both
ways (the server must prove the secret before the client sends anything) and
then issues blocking request/reply calls (HELLO, PULL, COMMIT, EPOCH_DONE),
every frame with a MAC. An ERROR reply raises ``RemoteError`` (a ``PSError``)
carrying the server's message; socket problems raise ``ConnectionClosed`` or
``TransportTimeout``, a reply that fails its MAC ``IntegrityError``, after
which the client is closed. Retrying is the caller's job (typically by letting
the Spark task fail), not the client's.

Arrays returned by the client are zero-copy views into the received frame:
they are writable but share one buffer per reply. With compressed replies
(the server's HELLO names their codec; the caller gives the client that
codec, its algorithm's ``reply_codec``) a COMMIT's reply is the change of the
center since what this worker holds: the client keeps that copy, applies the
change (the codec's ``apply_change``, as the server did to its copy) and
returns a copy of the result, so callers still get the center.

A client is not thread-safe: use one per worker thread.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from trainer.ps.ps_errors import RemoteError
from trainer.transport.authenticated_client import AuthenticatedClient
from trainer.transport.handshake import Credentials
from trainer.transport.wire import (
    ConnectionClosed, Frame, IntegrityError, Msg, ProtocolError, TransportError, TransportTimeout,
)


class PSClient(AuthenticatedClient):
    """Connection of one worker to the parameter server."""

    service = "the parameter server"
    reach_hint = ("Check that the driver is running and that executors can reach this address (firewall, "
                  "spark.driver.host).")

    def __init__(
        self,
        host: str,
        port: int,
        secret: bytes | Credentials,
        worker: int,
        attempt: int = 0,
        timeout: float = 600.0,
        *,
        max_body: int | None = None,
        connect_timeout: float = 60.0,
        reply_codec: Any = None,
    ) -> None:
        super().__init__(host, port, secret, worker, attempt, timeout, max_body, connect_timeout=connect_timeout)
        #: Center version seen in the last reply (None before the first one).
        self.version: int | None = None
        #: Number of workers announced by the server during the handshake.
        self.num_workers: int | None = None
        #: The codec of compressed replies (the algorithm's ``reply_codec``), or None; the center as held here.
        self.reply_codec = reply_codec
        self._held: list[np.ndarray] | None = None
        self._scratch: list[np.ndarray] | None = None  # a reply's decoded change, allocated once per HELLO

    # -- requests ---------------------------------------------------------------

    def hello(self, extra: dict[str, Any] | None = None) -> tuple[list[np.ndarray], dict[str, Any]]:
        """Announce this worker; returns the center and ``{"version", "start_epoch", "num_workers"}``. `extra`:
        an elastic fit's task names its epoch and its process (the reply then says ``committed_batches``)."""
        frame = self._request(Msg.HELLO, {"attempt": self.attempt, **(extra or {})})
        announced = frame.meta.get("reply_codec")
        mine = None if self.reply_codec is None else self.reply_codec.describe()
        if announced is not None and announced != mine:
            raise ProtocolError(
                f"the parameter server at {self.host}:{self.port} compresses its replies with {announced!r:.40} but "
                f"this client was given {'no reply codec' if mine is None else repr(mine)}; give it the algorithm's "
                "reply_codec (PSClient(..., reply_codec=algorithm.reply_codec), connect_ps(..., reply_codec=...))"
            )
        self._held = None if announced is None else [np.array(a, copy=True) for a in frame.arrays]
        self._scratch = None if announced is None else [np.empty_like(a) for a in self._held]
        return frame.arrays, frame.meta

    def pull(self) -> tuple[list[np.ndarray], int]:
        """Fetch the current center; returns ``(arrays, version)``."""
        frame = self._request(Msg.PULL, {})
        return frame.arrays, frame.meta["version"]

    def commit(
        self, payload: Sequence[np.ndarray], meta: dict[str, Any] | None = None
    ) -> tuple[list[np.ndarray], dict[str, Any]]:
        """Send an update-algorithm payload (meta: epoch, step, loss, ...); returns the reply arrays and meta."""
        frame = self._request(Msg.COMMIT, dict(meta or {}), payload)
        if frame.meta.get("reply") == "change":
            return self._changed(frame.arrays), frame.meta
        return frame.arrays, frame.meta

    def epoch_done(self, epoch: int, logs: dict[str, Any] | None = None) -> dict[str, Any]:
        """Report that ``epoch`` is finished (lets a retried task resume after it); returns the
        reply's meta (the server's directives, e.g. ``{"stop": True}``)."""
        return self._request(Msg.EPOCH_DONE, {"epoch": int(epoch), "logs": dict(logs or {})}).meta

    def _changed(self, wire: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The center after a compressed reply: what is held here moved by the change it encodes."""
        if self._held is None or self.reply_codec is None:
            raise ProtocolError(f"the parameter server at {self.host}:{self.port} replied with a change of the "
                                "center, but its HELLO named no reply codec")
        problem = self.reply_codec.check(wire, [h.shape for h in self._held])
        if problem is not None:
            raise ProtocolError(f"a compressed reply of the parameter server at {self.host}:{self.port}: {problem}")
        self.reply_codec.apply_change(wire, self._held, self._scratch)
        return [h.copy() for h in self._held]

    # -- hooks ------------------------------------------------------------------------

    def _welcomed(self, meta: dict[str, Any]) -> None:
        self.version = meta.get("version")
        self.num_workers = meta.get("num_workers")

    def _refused(self, text: str, msg: Msg | None = None) -> TransportError:
        return RemoteError(text)

    def _lost(self, msg: Msg, exc: TransportError) -> TransportError:
        if isinstance(exc, ConnectionClosed):
            return ConnectionClosed(f"lost the connection to the parameter server at {self.host}:{self.port} "
                                    f"during {msg.name}: {exc}")
        if isinstance(exc, TransportTimeout):
            return TransportTimeout(f"no reply from the parameter server at {self.host}:{self.port} to {msg.name} within "
                             f"timeout={self.timeout}s ({exc}); for synchronous algorithms the timeout must exceed the "
                             "server's round_timeout")
        if isinstance(exc, IntegrityError):
            return IntegrityError(f"the reply of the parameter server at {self.host}:{self.port} to {msg.name} "
                                  f"failed its integrity check: {exc}")
        return exc

    def _request(self, msg: Msg, meta: dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> Frame:
        frame = super()._request(msg, meta, arrays)
        if "version" in frame.meta:
            self.version = frame.meta["version"]
        return frame
