"""The measurements behind `make bench-ps`: the parameter server against a raw loopback ping-pong.

`measure_ps` starts a real `ParameterServer` (DOWNPOUR, optionally with a
codec) in this process, as the driver holds it, and K client PROCESSES that
each commit the same payload in a loop through a real `PSClient` for a fixed
time. `measure_raw` does the same with a plain TCP echo server: every client
sends the bytes of one COMMIT frame and reads back the bytes of one reply, so
the two differ only by what the parameter server does (framing, the frame
MAC, decoding, the algorithm under its lock, the reply). `measure_echo`
sits between them: the same frames, sealed and verified by the transport's
real `Channel` with the frame MAC on both ends, echoed with no server work at
all; it is the ceiling of any server that authenticates every frame with
that MAC on this machine. Both
use only the public API (``ParameterServer``, ``PSClient``, the algorithms),
so the same script measures later servers unchanged.

`measure_ps` can shard the server (``ShardedParameterServer``, each client
then a ``ShardedPSClient`` sending the S parts of a commit at once) and turn
the frame MAC off (``frame_mac=False``), to tell the server's own cost from
the MAC's; trees without those options measure one shard with the MAC.

`model_layout` gives the tensor shapes of a model of P parameters shaped like
the MNIST CNN (four kernels and four biases, 99 % in the dense kernel).
"""

from __future__ import annotations

import multiprocessing
import socket
import statistics
import threading
import time
from typing import Any

import numpy as np

import trainer.algorithms as algorithms
from trainer.internals import (DEFAULT_MAC, Channel, Msg, ParameterServer, PSClient, RecvBuffer, ShardedParameterServer,
                               ShardedPSClient, TransportError, encode, frame_size, new_secret, set_io_timeout)

# Share of the parameters in each kernel of the MNIST CNN (conv, conv, dense, dense) and its biases.
_KERNEL_SHARES = (288 / 1_048_853, 9216 / 1_048_853, 1_036_800 / 1_048_853)
_BIASES = (32, 32, 225, 10)
REPLIES = "+replies"  # a codec name's suffix: the server's replies go through the codec too
_START_TIMEOUT = 120.0


def model_layout(params: int) -> list[tuple[int, ...]]:
    """Shapes of a CNN-like model with about `params` parameters (kernels, then each bias)."""
    if params < 10_000:
        raise ValueError(f"model_layout needs at least 10,000 parameters, received {params}")
    sizes = [max(1, round(params * s)) for s in _KERNEL_SHARES]
    sizes.append(max(1, params - sum(sizes) - sum(_BIASES)))
    shapes: list[tuple[int, ...]] = []
    for size, bias in zip(sizes, _BIASES):
        shapes += [(size,), (bias,)]
    return shapes


def _payload(shapes, compression: str | None, seed: int = 0) -> tuple[Any, list[np.ndarray], list[np.ndarray]]:
    """(algorithm, center, payload on the wire) for DOWNPOUR with `compression` (a codec name, then ``+replies``
    for compressed replies too).

    Without compression only what every version of the package has is used
    (``DOWNPOUR``, ``worker_payload``): the script also measures older trees.
    """
    algorithm = algorithms.DOWNPOUR(window=1)
    rng = np.random.default_rng(seed)
    center = [np.zeros(s, np.float32) for s in shapes]
    delta = [(rng.standard_normal(s) * 1e-3).astype(np.float32) for s in shapes]
    if compression in (None, "none"):
        return algorithm, center, algorithm.worker_payload(delta, center)
    name = compression.removesuffix(REPLIES)
    algorithm = algorithms.with_compression(algorithm, name, **({"replies": True} if name != compression else {}))
    payload, _ = algorithm.worker_commit(delta, center, None)
    return algorithm, center, payload


def _frames(shapes, compression: str | None, seed: int = 0) -> tuple[list, list]:
    """The buffers of one COMMIT frame and of its reply, as a client and the server send them."""
    algorithm, center, payload = _payload(shapes, compression, seed)
    meta = {"worker": 0, "epoch": 0, "step": 0, "loss": 0.1}
    codec = getattr(algorithm, "reply_codec", None)
    reply = center if codec is None else codec.encode(center)
    return encode(Msg.COMMIT, meta, payload), encode(Msg.OK, {"version": 1}, reply)


def frame_bytes(shapes, compression: str | None) -> tuple[int, int]:
    """(bytes of one COMMIT frame, bytes of its reply) on the wire."""
    commit, reply = _frames(shapes, compression)
    return frame_size(commit), frame_size(reply)


def rule_seconds(shapes, compression: str | None, repeats: int = 5) -> float:
    """Median seconds of the algorithm alone, single thread: ``server_apply`` into a buffer allocated once
    where the algorithm has it (decode and add, as the server runs it), else ``server_commit``."""
    algorithm, center, payload = _payload(shapes, compression)
    apply = getattr(algorithm, "server_apply", None)
    out = [np.empty_like(c) for c in center]
    times = []
    for _ in range(repeats + 1):  # the first touches the buffer's pages
        started = time.perf_counter()
        if apply is not None:
            apply(center, payload, 0, out)
        else:
            algorithm.server_commit(center, payload, 0)
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:])


# -- client processes -------------------------------------------------------------------


def _ps_client(addresses, secret, worker, shapes, compression, seconds, ready, start, results) -> None:
    algorithm, _, payload = _payload(shapes, compression, seed=worker)
    codec = getattr(algorithm, "reply_codec", None)
    replies = {} if codec is None else {"reply_codec": codec}  # older trees have no compressed replies
    if len(addresses) > 1:
        client = ShardedPSClient(addresses, secret, worker, timeout=120.0, split=algorithm.split_payload,
                                            **replies)
    else:
        client = PSClient(*addresses[0], secret, worker=worker, timeout=120.0, **replies)
    with client:
        client.connect()
        client.hello()
        ready.put(worker)
        start.wait()
        count, began = 0, time.perf_counter()
        while time.perf_counter() - began < seconds:
            client.commit(payload, {"worker": worker, "epoch": 0, "step": count, "loss": 0.1})
            count += 1
        results.put((worker, count, time.perf_counter() - began))


def _raw_client(address, worker, bytes_in, bytes_out, seconds, ready, start, results) -> None:
    out = bytes(bytes_in)
    buf = bytearray(bytes_out)
    view = memoryview(buf)
    with socket.create_connection(address, timeout=120.0) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ready.put(worker)
        start.wait()
        count, began = 0, time.perf_counter()
        while time.perf_counter() - began < seconds:
            sock.sendall(out)
            got = 0
            while got < bytes_out:
                k = sock.recv_into(view[got:], bytes_out - got)
                if not k:
                    raise ConnectionError("the echo server closed the connection")
                got += k
            count += 1
        results.put((worker, count, time.perf_counter() - began))


def _echo_client(address, worker, shapes, compression, mac, keys, seconds, ready, start, results) -> None:
    commit, _ = _frames(shapes, compression, seed=worker)
    replies = RecvBuffer()
    with socket.create_connection(address, timeout=120.0) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        set_io_timeout(sock, 120.0)
        channel = Channel(sock, mac=mac, send_key=keys[0], recv_key=keys[1], peer="the echo server")
        ready.put(worker)
        start.wait()
        count, began = 0, time.perf_counter()
        while time.perf_counter() - began < seconds:
            channel.send(commit)
            channel.recv(None, into=replies)
            count += 1
        results.put((worker, count, time.perf_counter() - began))


def _run_clients(target, args_of, clients: int) -> float:
    """Start `clients` processes, release them together; returns their summed round trips per second."""
    ctx = multiprocessing.get_context("spawn")
    ready, results, start = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=target, args=(*args_of(w), ready, start, results), daemon=True)
             for w in range(clients)]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            ready.get(timeout=_START_TIMEOUT)
        start.set()
        rates = [count / elapsed for _, count, elapsed in (results.get(timeout=_START_TIMEOUT) for _ in procs)]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
    return float(sum(rates))


class _EchoServer:
    """Reads `bytes_in` bytes and answers `bytes_out` bytes, forever, one thread per connection."""

    def __init__(self, bytes_in: int, bytes_out: int) -> None:
        self.bytes_in, self.reply = bytes_in, bytes(bytes_out)
        self._listen()

    def _listen(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.address = self.listener.getsockname()[:2]
        self.threads: list[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(sock,), daemon=True)
            t.start()
            self.threads.append(t)

    def _serve(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray(self.bytes_in)
        view = memoryview(buf)
        with sock:
            while True:
                got = 0
                while got < self.bytes_in:
                    try:
                        k = sock.recv_into(view[got:], self.bytes_in - got)
                    except OSError:
                        return
                    if not k:
                        return
                    got += k
                sock.sendall(self.reply)

    def close(self) -> None:
        self.listener.close()


class _AuthenticatedEcho(_EchoServer):
    """Receives and verifies one sealed frame, answers one sealed reply (`Channel`, the frame MAC both ways)."""

    def __init__(self, reply: list, mac: str, keys: tuple[bytes, bytes]) -> None:
        self.reply, self.mac, self.keys = reply, mac, keys
        self._listen()

    def _serve(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        set_io_timeout(sock, 120.0)
        channel = Channel(sock, mac=self.mac, send_key=self.keys[1], recv_key=self.keys[0], peer="a client")
        commits = RecvBuffer()
        with sock:
            while True:
                try:
                    channel.recv(None, into=commits)
                    channel.send(self.reply)
                except (TransportError, OSError):
                    return


def measure_raw(bytes_in: int, bytes_out: int, clients: int, seconds: float) -> float:
    """Round trips per second of `clients` processes against a raw echo server in this process."""
    server = _EchoServer(bytes_in, bytes_out)
    try:
        return _run_clients(_raw_client, lambda w: (server.address, w, bytes_in, bytes_out, seconds), clients)
    finally:
        server.close()


def measure_echo(shapes, clients: int, seconds: float, compression: str | None = None,
                 frame_mac: bool | str = True) -> float | None:
    """Round trips per second of `clients` processes sending the COMMIT frame and receiving the reply frame
    through an echo that seals and verifies both with the frame MAC (True: the default one) and does nothing
    else; None with no MAC (the raw echo is that case)."""
    if frame_mac is False:
        return None
    mac = DEFAULT_MAC if frame_mac is True else frame_mac
    keys = (new_secret(), new_secret())  # client to server, server to client
    _, reply = _frames(shapes, compression)
    server = _AuthenticatedEcho(reply, mac, keys)
    try:
        return _run_clients(_echo_client, lambda w: (server.address, w, shapes, compression, mac, keys, seconds),
                            clients)
    finally:
        server.close()


def measure_ps(shapes, clients: int, seconds: float, compression: str | None = None, shards: int = 1,
               frame_mac: bool | str = True) -> float:
    """Commits per second of `clients` processes against a real ParameterServer (or one of `shards` shards)
    in this process, with the default frame MAC (True), none (False) or the one named."""
    algorithm, center, _ = _payload(shapes, compression)  # a bad codec fails here, before any process starts
    secret = new_secret()
    options = {} if frame_mac is True else {"frame_mac": frame_mac}  # older trees have no option: the MAC is on
    if shards > 1:
        server = ShardedParameterServer(algorithm, center, clients, secret, shards=shards, io_timeout=120.0,
                                                   **options)
    else:
        server = ParameterServer(algorithm, center, clients, secret, io_timeout=120.0, **options)
    with server as ps:
        addresses = getattr(ps, "addresses", [ps.address])
        credentials = getattr(ps, "credentials", secret)
        return _run_clients(_ps_client, lambda w: (addresses, credentials, w, shapes, compression, seconds), clients)
