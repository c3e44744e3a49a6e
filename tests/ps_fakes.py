"""Fakes and helpers shared by the parameter server's tests (test_ps_server*.py).

The algorithms are tiny fakes (async: center += payload, sync: mean of the
payloads) so those tests do not depend on the real algorithms.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from typing import Any

import numpy as np

from trainer.ps import ParameterServer, PSClient
from trainer.transport.handshake import client_handshake
from trainer.transport.frame_auth import Channel
from trainer.transport.wire import new_secret

SECRET = new_secret()
SHAPES = [(3,), (2, 2)]


def initial_center() -> list[np.ndarray]:
    return [np.zeros(SHAPES[0], "f4"), np.zeros(SHAPES[1], "f8")]


def ones(scale: float = 1.0) -> list[np.ndarray]:
    return [np.full(SHAPES[0], scale, "f4"), np.full(SHAPES[1], scale, "f8")]


class AddRule:
    """Asynchronous fake: center += payload; reply = new center."""

    name = "add"
    synchronous = False
    exchanges_optimizer_state = False

    def __init__(self) -> None:
        self.staleness: list[int] = []

    def server_commit(self, center, payload, staleness):
        self.staleness.append(staleness)
        new = [c + p for c, p in zip(center, payload)]
        return new, new


class MeanRule:
    """Synchronous fake: center = mean of payloads; each worker gets the mean and its index."""

    name = "mean"
    synchronous = True
    exchanges_optimizer_state = False

    def server_round(self, center, payloads):
        mean = [np.mean([p[i] for p in payloads], axis=0).astype(center[i].dtype) for i in range(len(center))]
        return mean, [mean + [np.array(k, "i8")] for k in range(len(payloads))]


class StatefulRule(AddRule):
    """Asynchronous fake that appends optimizer state after the weights."""

    exchanges_optimizer_state = True

    def server_commit(self, center, payload, staleness):
        new = [c + p for c, p in zip(center, payload)] + [np.array(p, copy=True) for p in payload[len(center):]]
        return new, new


class BrokenRule(AddRule):
    def server_commit(self, center, payload, staleness):
        raise RuntimeError("boom")


class BadReplyRule(AddRule):
    def server_commit(self, center, payload, staleness):
        return [c + p for c, p in zip(center, payload)], [np.array(["not a number"])]


class BrokenRoundRule(MeanRule):
    def server_round(self, center, payloads):
        raise RuntimeError("round boom")


def server(algorithm: Any = None, num_workers: int = 1, **kw) -> ParameterServer:
    algorithm = algorithm if algorithm is not None else AddRule()
    return ParameterServer(algorithm, initial_center(), num_workers, SECRET, **kw)


def client(ps: ParameterServer, worker: int = 0, attempt: int = 0, secret: bytes = SECRET, timeout=10.0) -> PSClient:
    host, port = ps.address
    return PSClient(host, port, secret, worker, attempt=attempt, timeout=timeout).connect()


def raw_connect(ps: ParameterServer, timeout: float = 10.0) -> socket.socket:
    sock = socket.create_connection(ps.address, timeout=timeout)
    return sock


def raw_auth(ps: ParameterServer, worker: int = 0) -> tuple[socket.socket, Channel]:
    """Do the handshake on a plain socket; returns it with its channel (which seals and opens frames)."""
    sock = raw_connect(ps)
    channel, welcome, _, _ = client_handshake(sock, ps.credentials, worker, 0, where="test", service="the server",
                                              deadline=time.monotonic() + 5)
    assert "version" in welcome
    return sock, channel


def closed_by_peer(sock: socket.socket, within: float) -> bool:
    """True if the peer closes `sock` within `within` seconds (frames before EOF are skipped)."""
    sock.settimeout(within)
    deadline = time.monotonic() + within
    try:
        while time.monotonic() < deadline:
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return False


def half_close(sock: socket.socket) -> None:
    """Send EOF; the server may have reset the connection already (ENOTCONN), which is fine."""
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError as e:
        if e.errno != errno.ENOTCONN:
            raise


def still_serves(ps: ParameterServer, worker: int = 0) -> None:
    with client(ps, worker) as c:
        arrays, version = c.pull()
        assert version == ps.version
        assert [a.shape for a in arrays[: len(SHAPES)]] == SHAPES


def wait_for(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def run_in_thread(fn, *args) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def target():
        try:
            out["result"] = fn(*args)
        except BaseException as exc:  # reported to the test thread
            out["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, out
