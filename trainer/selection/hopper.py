"""Transport of the model hopper: a small authenticated server in the driver and its client.

The driver runs one :class:`HopperServer` per search. Every worker task opens
one connection, answers the HMAC challenge of :mod:`trainer.ps.wire` with the
search's random secret, and then talks in request/reply frames of the same
wire format (JSON meta + raw arrays of an allow-listed dtype; nothing is ever
unpickled). The existing message types are reused with these meanings:

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

Threads: one accept thread (woken through a socket pair on :meth:`stop`) and
one daemon thread per connection; every socket has a timeout. A peer that
misbehaves only loses its own connection. It knows nothing about Keras or
Spark: the :class:`HopperHandler` decides what the requests mean.
"""

from __future__ import annotations

import hmac
import logging
import selectors
import socket
import threading
import time
from typing import Any, Protocol, Sequence

import numpy as np

from trainer.ps.wire import (
    PREAUTH_MAX_BODY,
    PREAUTH_MAX_META,
    PROTOCOL_VERSION,
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
    new_nonce,
    read_frame,
    send_buffers,
    write_frame,
)

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
_STOP_JOIN_S = 5.0


class HopperError(PSError):
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


class HopperServer:
    """The driver side: accepts task connections and serves HELLO, PULL and COMMIT.

    Args:
        handler: a :class:`HopperHandler`.
        num_workers: tasks are numbered ``0 .. num_workers - 1``.
        secret: the shared secret of the HMAC handshake (``trainer.ps.new_secret()``).
        host, port: where to listen; ``port=0`` picks a free port.
        io_timeout: longest silence tolerated from an authenticated task, and
            longest send. It must exceed the longest unit of work (one
            sub-epoch, or one epoch for the task-parallel strategy).
        wait_s: long-poll interval of a PULL (at most ``io_timeout / 4``).
        handshake_timeout: time a new connection has to authenticate.
        max_body: largest frame body accepted after authentication.
        max_connections: open connections allowed (default ``2 * num_workers + 4``).
    """

    def __init__(self, handler: HopperHandler, num_workers: int, secret: bytes, *, host: str = "127.0.0.1",
                 port: int = 0, io_timeout: float = 600.0, wait_s: float = 30.0, handshake_timeout: float = 10.0,
                 max_body: int = DEFAULT_MAX_BODY, max_connections: int | None = None) -> None:  # fmt: skip
        if type(num_workers) is not int or num_workers < 1:
            raise ValueError(f"HopperServer: num_workers must be a positive int. Received {num_workers!r}.")
        for name, value in (("io_timeout", io_timeout), ("wait_s", wait_s), ("handshake_timeout", handshake_timeout)):
            if not value > 0:
                raise ValueError(f"HopperServer: {name} must be a positive number of seconds. Received {value!r}.")
        self._handler = handler
        self._num_workers = num_workers
        self._secret = check_secret(secret)
        self._host, self._port = host, int(port)
        self._io_timeout = float(io_timeout)
        self._wait_s = min(float(wait_s), self._io_timeout / 4)
        self._handshake_timeout = float(handshake_timeout)
        self._max_body = int(max_body)
        self._max_connections = 2 * num_workers + 4 if max_connections is None else int(max_connections)
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
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

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> tuple[str, int]:
        """Bind, listen and start serving; returns the bound ``(host, port)``."""
        if self._started:
            raise HopperError("HopperServer.start(): already started. Fix: create a new server per search.")
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
            raise HopperError(
                f"Cannot listen on {self._host}:{self._port}: {exc}. Fix: choose another port "
                "(0 picks a free one) or an address of this machine."
            ) from exc
        self._listener = listener
        bound = listener.getsockname()
        self._address = (bound[0], bound[1])
        self._wake_r, self._wake_w = socket.socketpair()
        self._accept_thread = threading.Thread(target=self._accept_loop, name=f"hopper-accept-{bound[1]}",
                                               daemon=True)
        self._accept_thread.start()
        log.info("model hopper server listening on %s:%d for %d workers", bound[0], bound[1], self._num_workers)
        return self._address

    def stop(self) -> None:
        """Stop serving (idempotent): close every socket and join the threads."""
        with self._lock:
            if not self._started or self._stopping:
                self._stopping = True
                return
            self._stopping = True
            conns, threads = list(self._conns), list(self._threads)
        if self._wake_w is not None:
            try:
                self._wake_w.send(b"x")
            except OSError:
                pass
        for sock in conns:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + _STOP_JOIN_S
        if self._accept_thread is not None:
            self._accept_thread.join(max(0.0, deadline - time.monotonic()))
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        for s in (self._listener, self._wake_r, self._wake_w):
            if s is not None:
                s.close()

    def __enter__(self) -> "HopperServer":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def address(self) -> tuple[str, int]:
        if self._address is None:
            raise HopperError("HopperServer has no address yet. Fix: call start() first.")
        return self._address

    @property
    def bytes_received(self) -> int:
        with self._lock:
            return self._bytes_in

    @property
    def bytes_sent(self) -> int:
        with self._lock:
            return self._bytes_out

    # -- accepting ---------------------------------------------------------------
    def _accept_loop(self) -> None:
        assert self._listener is not None and self._wake_r is not None
        selector = selectors.DefaultSelector()
        try:
            selector.register(self._listener, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while not self._stopping:
                for key, _ in selector.select():
                    if key.fileobj is self._wake_r or self._stopping:
                        return
                    try:
                        sock, addr = self._listener.accept()
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError as exc:
                        if self._stopping:
                            return
                        log.error("model hopper server: accept() failed: %s", exc)
                        time.sleep(0.05)  # e.g. out of file descriptors: do not spin
                        continue
                    self._admit(sock, addr)
        except Exception:
            log.exception("model hopper server: accept loop crashed")
        finally:
            selector.close()

    def _admit(self, sock: socket.socket, addr: Any) -> None:
        with self._lock:
            self._threads = {t for t in self._threads if t.is_alive()}
            refused = self._stopping or len(self._conns) >= self._max_connections
            if not refused:
                self._conns.add(sock)
                thread = threading.Thread(target=self._serve, args=(sock, addr), daemon=True,
                                          name=f"hopper-conn-{addr[0]}:{addr[1]}")
                self._threads.add(thread)
                thread.start()
        if refused:
            try:
                sock.settimeout(1.0)
                write_frame(sock, Msg.ERROR, {"error": "connection refused: too many connections or stopping"})
            except (PSError, OSError):
                pass
            sock.close()

    # -- one connection -----------------------------------------------------------
    def _serve(self, sock: socket.socket, addr: Any) -> None:
        peer = f"{addr[0]}:{addr[1]}"
        identity: tuple[int, int] | None = None
        said_bye = False
        try:
            identity = self._handshake(sock, peer)
            if identity is None:
                return
            worker, attempt = identity
            sock.settimeout(self._io_timeout)
            while not self._stopping:
                try:
                    frame = read_frame(sock, self._max_body)
                except ConnectionClosed:
                    return
                except PSTimeout:
                    log.warning("model hopper server: worker %d sent nothing for %.0f s; closing", worker,
                                self._io_timeout)
                    return
                except ProtocolError as exc:
                    log.warning("model hopper server: worker %d at %s: protocol error: %s", worker, peer, exc)
                    self._try_error(sock, f"protocol error: {exc}")
                    return
                self._count(frame.nbytes, 0)
                if frame.msg == Msg.BYE:
                    said_bye = True
                    return
                try:
                    self._dispatch(sock, worker, attempt, frame)
                except (ConnectionClosed, PSTimeout):
                    return
        except Exception:
            log.exception("model hopper server: unexpected error serving %s", peer)
        finally:
            with self._lock:
                self._conns.discard(sock)
            sock.close()
            if identity is not None and not said_bye and not self._stopping:
                try:
                    self._handler.lost(*identity)
                except Exception:
                    log.exception("model hopper server: handler.lost raised (ignored)")

    def _handshake(self, sock: socket.socket, peer: str) -> tuple[int, int] | None:
        deadline = time.monotonic() + self._handshake_timeout
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(self._handshake_timeout)
            nonce = new_nonce()
            write_frame(sock, Msg.CHALLENGE, {"nonce": nonce.hex(), "protocol": PROTOCOL_VERSION,
                                              "num_workers": self._num_workers})
            frame = read_frame(sock, PREAUTH_MAX_BODY, max_meta=PREAUTH_MAX_META, deadline=deadline)
            if frame.msg != Msg.AUTH:
                raise ProtocolError(f"expected AUTH, received {frame.msg.name}")
            worker, attempt, mac = frame.meta.get("worker"), frame.meta.get("attempt", 0), frame.meta.get("mac")
            if type(worker) is not int or type(attempt) is not int or attempt < 0 or not isinstance(mac, str):
                raise ProtocolError("AUTH meta must be {'worker': int, 'attempt': int >= 0, 'mac': hex string}")
            try:
                given = bytes.fromhex(mac)
            except ValueError:
                given = b""
            if not hmac.compare_digest(given, auth_digest(self._secret, nonce, worker, attempt)):
                log.warning("model hopper server: rejected %s: wrong HMAC", peer)
                self._try_error(sock, "authentication failed: the task does not hold this search's secret")
                return None
            if not 0 <= worker < self._num_workers:
                self._try_error(sock, f"authentication failed: worker {worker} is out of range "
                                      f"0..{self._num_workers - 1}")
                return None
            write_frame(sock, Msg.OK, {"num_workers": self._num_workers})
            return worker, attempt
        except (ConnectionClosed, PSTimeout, ProtocolError, OSError) as exc:
            if not self._stopping:
                log.warning("model hopper server: handshake with %s failed: %s", peer, exc)
                self._try_error(sock, f"handshake failed: {exc}")
            return None

    def _dispatch(self, sock: socket.socket, worker: int, attempt: int, frame: Frame) -> None:
        claimed = frame.meta.get("worker", worker)
        if claimed != worker:
            self._reply_error(sock, f"this connection authenticated as worker {worker}, the request says "
                                    f"{claimed!r:.20}")
            return
        try:
            if frame.msg == Msg.HELLO:
                meta, arrays = self._handler.hello(worker, attempt, frame.meta), ()
            elif frame.msg == Msg.PULL:
                meta, arrays = self._handler.next_work(worker, attempt, self._wait_s)
            elif frame.msg == Msg.COMMIT:
                meta, arrays = self._handler.result(worker, attempt, frame.meta, frame.arrays), ()
            else:
                raise HopperRejected(f"unexpected {frame.msg.name} request; expected HELLO, PULL, COMMIT or BYE")
        except HopperRejected as exc:
            self._reply_error(sock, str(exc))
            return
        except Exception as exc:
            log.exception("model hopper server: handler failed on %s from worker %d", frame.msg.name, worker)
            self._reply_error(sock, f"internal error in the driver: {type(exc).__name__}: {exc}")
            return
        self._send(sock, encode(Msg.OK, meta, arrays))

    # -- sending -----------------------------------------------------------------
    def _count(self, n_in: int, n_out: int) -> None:
        with self._lock:
            self._bytes_in += n_in
            self._bytes_out += n_out

    def _send(self, sock: socket.socket, buffers: list) -> None:
        self._count(0, send_buffers(sock, buffers))

    def _reply_error(self, sock: socket.socket, text: str) -> None:
        self._send(sock, encode(Msg.ERROR, {"error": text[:4000]}))

    @staticmethod
    def _try_error(sock: socket.socket, text: str) -> None:
        try:
            sock.settimeout(1.0)
            write_frame(sock, Msg.ERROR, {"error": text})
        except (PSError, OSError):
            pass


class HopperClient:
    """The task side: one connection to the driver's :class:`HopperServer` (not thread-safe)."""

    def __init__(self, host: str, port: int, secret: bytes, worker: int, attempt: int = 0,
                 timeout: float = 600.0) -> None:  # fmt: skip
        self.host, self.port = host, int(port)
        self.worker, self.attempt = int(worker), int(attempt)
        self.timeout = float(timeout)
        self._secret = check_secret(secret)
        self._sock: socket.socket | None = None
        self.bytes_sent = 0
        self.bytes_received = 0

    def connect(self) -> "HopperClient":
        """Open the connection and authenticate; returns self."""
        where = f"{self.host}:{self.port}"
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        except OSError as exc:
            raise ConnectionClosed(
                f"Cannot connect to the model-selection driver at {where}: {exc}. Fix: check that executors "
                "can reach the driver at this address (spark.driver.host, firewall, TRAINER_PS_HOST)."
            ) from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            challenge = self._read(sock, PREAUTH_MAX_BODY, PREAUTH_MAX_META)
            if challenge.msg != Msg.CHALLENGE:
                raise HopperError(f"expected a CHALLENGE from {where}, received {challenge.msg.name}: "
                                  f"{challenge.meta.get('error', '')}")
            nonce = bytes.fromhex(str(challenge.meta.get("nonce", "")))
            mac = auth_digest(self._secret, nonce, self.worker, self.attempt).hex()
            self.bytes_sent += write_frame(sock, Msg.AUTH, {"worker": self.worker, "attempt": self.attempt,
                                                            "mac": mac})
            answer = self._read(sock, PREAUTH_MAX_BODY, PREAUTH_MAX_META)
            if answer.msg != Msg.OK:
                raise AuthenticationError(f"the driver at {where} rejected worker {self.worker}: "
                                          f"{answer.meta.get('error', answer.msg.name)}")
        except BaseException:
            sock.close()
            raise
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

    def __enter__(self) -> "HopperClient":
        return self.connect()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- requests ------------------------------------------------------------------
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

    def _read(self, sock: socket.socket, max_body: int | None, max_meta: int | None = None) -> Frame:
        frame = read_frame(sock, max_body) if max_meta is None else read_frame(sock, max_body, max_meta=max_meta)
        self.bytes_received += frame.nbytes
        return frame

    def _request(self, msg: Msg, meta: dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> Frame:
        if self._sock is None:
            raise HopperError(f"HopperClient for worker {self.worker} is not connected. Fix: call connect() first.")
        full = dict(meta)
        full["worker"] = self.worker
        buffers = encode(msg, full, arrays)
        try:
            self.bytes_sent += send_buffers(self._sock, buffers)
            frame = self._read(self._sock, None)
        except (ConnectionClosed, PSTimeout, ProtocolError) as exc:
            sock, self._sock = self._sock, None
            sock.close()
            raise HopperError(
                f"Lost the connection to the model-selection driver at {self.host}:{self.port} during "
                f"{msg.name}: {exc}"
            ) from exc
        if frame.msg == Msg.ERROR:
            raise HopperError(f"The model-selection driver refused {msg.name}: {frame.meta.get('error', '?')}")
        if frame.msg != Msg.OK:
            raise ProtocolError(f"expected OK or ERROR in reply to {msg.name}, received {frame.msg.name}")
        return frame
