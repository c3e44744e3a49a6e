"""A man in the middle for the transport tests: a TCP relay that can alter what workers send.

The relay listens on its own address and forwards every connection to a
server. The server's direction is piped untouched (or with `tamper_replies`,
one byte of its first reply after the handshake flipped). The workers'
direction is cut into frames (header, meta, body, and after the AUTH frame
the 40-byte trailer of sequence number and MAC), so that an `attack` can
target one COMMIT:

``"flip"``    flip the last byte of the first COMMIT's body
``"inject"``  send a forged COMMIT (a well-formed frame with the next
              sequence number and a made-up MAC) before the first real one
``"replay"``  send the first COMMIT twice

``None`` forwards everything unchanged. Used by tests/test_transport_security.py
and the Spark test of a fit through a relay.
"""

from __future__ import annotations

import socket
import threading

import numpy as np

from trainer.transport.frame_auth import TRAILER
from trainer.transport.wire import HEADER, MAGIC, Msg, encode

ATTACKS = (None, "flip", "inject", "replay")


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return bytes(out)


class Relay:
    """Forward ``listen`` -> ``target`` for every connection; see the module docstring."""

    def __init__(self, target: tuple[str, int], attack: str | None = None, *, listen: tuple[str, int] = ("127.0.0.1", 0),
                 tamper_replies: bool = False) -> None:  # fmt: skip
        assert attack in ATTACKS, attack
        self.target, self.attack, self.tamper_replies = target, attack, tamper_replies
        self.listener = socket.create_server(listen)
        self.address = self.listener.getsockname()[:2]
        self.attacks_done = 0
        self.commits_seen = 0
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._stopping = False
        self._thread = threading.Thread(target=self._accept, daemon=True, name="test-relay")
        self._thread.start()

    def __enter__(self) -> "Relay":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._stopping = True
        try:  # wakes the accept() below at once (closing alone leaves it blocked on Linux)
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        with self._lock:
            for s in self._socks:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
        self._thread.join(5)

    def _accept(self) -> None:
        while not self._stopping:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._socks += [client, server]
            threading.Thread(target=self._workers_side, args=(client, server), daemon=True).start()
            threading.Thread(target=self._servers_side, args=(server, client), daemon=True).start()

    def _servers_side(self, src: socket.socket, dst: socket.socket) -> None:
        """Pipe the server's bytes; with tamper_replies, flip a byte of its first reply after the handshake."""
        try:
            if self.tamper_replies:
                for index in range(3):  # CHALLENGE, the OK of the handshake, then the first reply
                    header = _recv_exact(src, HEADER.size)
                    _, _, meta_len, body_len = HEADER.unpack(header)
                    rest = bytearray(_recv_exact(src, meta_len + body_len + (TRAILER.size if index else 0)))
                    if index == 2:
                        rest[meta_len // 2] ^= 0x01  # inside the meta JSON
                        with self._lock:
                            self.attacks_done += 1
                    dst.sendall(header + rest)
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _close_write(dst)

    def _workers_side(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            index = 0
            while True:
                try:
                    header = _recv_exact(src, HEADER.size)
                except ConnectionError:
                    break
                magic, msg, meta_len, body_len = HEADER.unpack(header)
                assert magic == MAGIC
                sealed = index > 0  # every frame after AUTH carries a trailer
                rest = bytearray(_recv_exact(src, meta_len + body_len + (TRAILER.size if sealed else 0)))
                frame = bytearray(header + rest)
                if msg == Msg.COMMIT:
                    with self._lock:
                        self.commits_seen += 1
                        first = self.commits_seen == 1 or self.attack == "flip"
                    if first and self.attack is not None:
                        frame = self._attack(frame, index, meta_len, body_len, dst)
                dst.sendall(frame)
                index += 1
        except OSError:
            pass
        finally:
            _close_write(dst)

    def _attack(self, frame: bytearray, index: int, meta_len: int, body_len: int, dst: socket.socket) -> bytearray:
        with self._lock:
            self.attacks_done += 1
        if self.attack == "flip":
            frame[HEADER.size + meta_len + body_len - 1] ^= 0x01
        elif self.attack == "inject":
            buffers = encode(Msg.COMMIT, {"worker": 0, "epoch": 0, "step": 1},
                             [np.full(3, 1e3, "f4"), np.full((2, 2), 1e3, "f8")])
            forged = b"".join(bytes(memoryview(b)) for b in buffers) + TRAILER.pack(index - 1, bytes(32))
            dst.sendall(forged)
        elif self.attack == "replay":
            dst.sendall(bytes(frame))
        return frame


def _close_write(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
