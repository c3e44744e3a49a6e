"""Transport of the model hopper: a small authenticated server in the driver and its client.

The driver runs one :class:`HopperServer` per search. Every worker task opens
one connection, authenticates both ways with the search's random secret
(:mod:`trainer.transport.handshake`; TLS too when asked) and then talks in
request/reply frames of the same wire format (JSON meta + raw arrays of an
allow-listed dtype, a MAC on every frame; nothing is ever unpickled). The existing message types are
reused with these meanings:

``HELLO``  task -> driver
    meta ``{"worker", "attempt", "rows", "val_rows", "data_bytes", ...}``: the
    task has loaded its data. Reply ``OK`` (meta from the handler).
``PULL``   task -> driver: "give me work"
    Reply ``OK`` with meta ``{"op": "train", "model", "epoch", "seq", "keep",
    "seed"}`` and the model state as arrays (none when ``keep`` is true: the
    task still holds that state), or ``{"op": "wait"}`` when nothing came
    within the long-poll interval (ask again), or ``{"op": "stop"}``.
``COMMIT`` task -> driver: one unit of work is done
    meta ``{"model", "epoch", "seq", "train": {...}, "val": {...}, ...}`` and
    the new state as arrays. Reply ``OK``.
``BYE``    task -> driver: closing.

A ``PULL`` blocks in the server on a ``threading.Condition`` of the handler
until work exists for that worker: there is no polling sleep anywhere, a
finished sub-epoch hands the freed model to a waiting worker at once. The
long-poll interval only bounds how long one request stays unanswered, so that
socket timeouts never fire while a worker legitimately waits.

Serving and connecting (the handshake, one thread per connection, timeouts on
every socket, stopping) come from :mod:`trainer.transport.endpoint`, as for the
parameter server. A peer that misbehaves only loses its own connection. It
knows nothing about Keras or Spark: the :class:`HopperHandler` decides what
the requests mean.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol, Sequence

import numpy as np

from trainer.transport.authenticated_client import AuthenticatedClient
from trainer.transport.endpoint import AuthenticatedServer, Connection
from trainer.transport.handshake import Credentials
from trainer.transport.tls import TlsIdentity
from trainer.transport.wire import Frame, Msg, TransportError

log = logging.getLogger("trainer.selection")

__all__ = [
    "HopperError",
    "HopperRejected",
    "HopperHandler",
    "HopperServer",
    "HopperClient",
]

#: Default largest frame body accepted by the server after authentication (1 GiB).
DEFAULT_MAX_BODY = 1 << 30


class HopperError(TransportError):
    """A request to the model-hopper server failed (the message says why)."""


class HopperRejected(HopperError):
    """Raised by a handler to answer a request with an ERROR frame carrying this message."""


class HopperHandler(Protocol):
    """What the server calls; each method runs in the requesting connection's thread."""

    def hello(self, worker: int, attempt: int, meta: dict[str, Any]) -> dict[str, Any]: ...

    def next_work(self, worker: int, attempt: int, wait_s: float) -> tuple[dict[str, Any], Sequence[np.ndarray]]: ...

    def result(self, worker: int, attempt: int, meta: dict[str, Any],
               arrays: list[np.ndarray]) -> dict[str, Any]: ...  # fmt: skip

    def lost(self, worker: int, attempt: int) -> None: ...


class HopperServer(AuthenticatedServer):
    """The driver side: accepts task connections and serves HELLO, PULL and COMMIT.

    Args:
        handler: a :class:`HopperHandler`.
        num_workers: tasks are numbered ``0 .. num_workers - 1``.
        secret: the shared secret of the handshake (``trainer.transport.wire.new_secret()``);
            tasks get it with the MAC and TLS settings as ``credentials``.
        host, port: where to listen; ``port=0`` picks a free port.
        io_timeout: longest silence tolerated from an authenticated task, and
            longest send. It must exceed the longest unit of work (one
            sub-epoch, or one epoch for the task-parallel strategy).
        wait_s: long-poll interval of a PULL (at most ``io_timeout / 4``).
        handshake_timeout: time a new connection has to authenticate.
        max_body: largest frame body accepted after authentication.
        max_connections: open connections allowed (default ``2 * num_workers + 4``).
        frame_mac, tls: see ``trainer.transport.endpoint.AuthenticatedServer``.
    """

    label = "model hopper server"
    thread_prefix = "hopper"
    error_type = not_started_type = HopperError
    wrong_secret_reply = "authentication failed: the task does not hold this search's secret"
    requests = "HELLO, PULL, COMMIT or BYE"

    def __init__(self, handler: HopperHandler, num_workers: int, secret: bytes, *, host: str = "127.0.0.1",
                 port: int = 0, io_timeout: float = 600.0, wait_s: float = 30.0, handshake_timeout: float = 5.0,
                 max_body: int = DEFAULT_MAX_BODY, max_connections: int | None = None, frame_mac: bool | str = True,
                 tls: bool | TlsIdentity = False) -> None:  # fmt: skip
        if not wait_s > 0:
            raise ValueError(f"HopperServer: wait_s must be a positive number of seconds. Received {wait_s!r}.")
        super().__init__(num_workers, secret, host=host, port=port, io_timeout=io_timeout,
                         handshake_timeout=handshake_timeout, max_connections=max_connections,
                         max_body=int(max_body), log=log, frame_mac=frame_mac, tls=tls)
        self._handler = handler
        self._wait_s = min(float(wait_s), self._io_timeout / 4)

    def start(self) -> tuple[str, int]:
        """Bind, listen and start serving; returns the bound ``(host, port)``."""
        address = super().start()
        log.info("model hopper server listening on %s:%d for %d workers", address[0], address[1],
                 self._num_workers)
        return address

    def _dispatch(self, conn: Connection, frame: Frame) -> None:
        worker, attempt = conn.worker, conn.attempt
        assert worker is not None and attempt is not None
        try:
            if frame.msg == Msg.HELLO:
                meta, arrays = self._handler.hello(worker, attempt, frame.meta), ()
            elif frame.msg == Msg.PULL:
                meta, arrays = self._handler.next_work(worker, attempt, self._wait_s)
            elif frame.msg == Msg.COMMIT:
                meta, arrays = self._handler.result(worker, attempt, frame.meta, frame.arrays), ()
            else:
                self._unexpected(conn, frame)
                return
        except HopperRejected as exc:
            self._reply_error(conn, str(exc))
            return
        except Exception as exc:
            log.exception("model hopper server: handler failed on %s from worker %d", frame.msg.name, worker)
            self._reply_error(conn, f"internal error in the driver: {type(exc).__name__}: {exc}")
            return
        self._reply(conn, meta, arrays)

    def _closed(self, conn: Connection, said_bye: bool) -> None:
        if not said_bye and not self._stopping:
            assert conn.worker is not None and conn.attempt is not None
            self._handler.lost(conn.worker, conn.attempt)


class HopperClient(AuthenticatedClient):
    """The task side: one connection to the driver's :class:`HopperServer` (not thread-safe)."""

    service = "the model-selection driver"
    reach_hint = ("Fix: check that executors can reach the driver at this address (spark.driver.host, firewall, "
                  "TRAINER_PS_HOST).")

    def __init__(self, host: str, port: int, secret: bytes | Credentials, worker: int, attempt: int = 0,
                 timeout: float = 600.0) -> None:  # fmt: skip
        super().__init__(host, port, secret, int(worker), int(attempt), timeout)

    def hello(self, meta: dict[str, Any]) -> dict[str, Any]:
        """Announce the loaded data; returns the driver's reply meta."""
        return self._request(Msg.HELLO, meta).meta

    def next_work(self) -> tuple[dict[str, Any], list[np.ndarray]]:
        """Block until the driver assigns work (``op == "train"``) or says ``"stop"``."""
        while True:
            frame = self._request(Msg.PULL, {})
            if frame.meta.get("op") != "wait":
                return frame.meta, frame.arrays

    def send_result(self, meta: dict[str, Any], arrays: Sequence[np.ndarray]) -> dict[str, Any]:
        """Hand a finished unit of work (metrics and the new model state) to the driver."""
        return self._request(Msg.COMMIT, meta, arrays).meta

    def _refused(self, text: str, msg: Msg | None = None) -> TransportError:
        if msg is None:
            return HopperError(text)
        return HopperError(f"The model-selection driver refused {msg.name}: {text}")

    def _lost(self, msg: Msg, exc: TransportError) -> TransportError:
        return HopperError(f"Lost the connection to the model-selection driver at {self.host}:{self.port} during "
                           f"{msg.name}: {exc}")
